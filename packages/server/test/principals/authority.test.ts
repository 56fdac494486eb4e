import { describe, expect, it } from "vitest";
import {
  canSeeProject,
  grantRefusal,
  missingScopes,
  startRefusal,
  TOOL_SCOPE,
} from "../../src/principals/authority.js";
import { principal } from "../support/fake-runs.js";

/** design §6.2: no scope but coding_agent:run opens the tools; start also needs project:write + grant. */
const toolRefusal = (p: ReturnType<typeof principal>) => missingScopes(p, [TOOL_SCOPE], "Observing a coding agent");
const checkStartGrant = (p: ReturnType<typeof principal>, projectId: string) =>
  startRefusal(p, projectId, "Starting a coding agent");
const MATRIX: { scopes: string[]; tools: boolean; start: boolean; see: boolean }[] = [
  { scopes: [], tools: false, start: false, see: false },
  { scopes: ["project:read"], tools: false, start: false, see: true },
  { scopes: ["project:write"], tools: false, start: false, see: false },
  { scopes: ["runtime:read"], tools: false, start: false, see: false },
  { scopes: ["job:run"], tools: false, start: false, see: false },
  { scopes: ["mcp:local"], tools: false, start: false, see: false },
  {
    scopes: ["project:read", "project:write", "runtime:read", "job:run", "mcp:local"],
    tools: false,
    start: false,
    see: true,
  },
  { scopes: ["coding_agent:run"], tools: true, start: false, see: true },
  { scopes: ["coding_agent:run", "project:write"], tools: true, start: true, see: true },
];

describe("scope matrix", () => {
  it.each(MATRIX)("scopes $scopes: tools=$tools start=$start see=$see", ({ scopes, tools, start, see }) => {
    const p = principal("p", scopes, ["demo"]);
    expect(toolRefusal(p) === null).toBe(tools);
    expect(checkStartGrant(p, "demo") === null).toBe(start);
    expect(canSeeProject(p, "demo")).toBe(see);
  });

  it("needs an exact project grant for start and for visibility", () => {
    const p = principal("p", ["coding_agent:run", "project:write", "project:read"], ["demo"]);
    expect(checkStartGrant(p, "demo")).toBeNull();
    expect(checkStartGrant(p, "demo2")?.code).toBe("forbidden");
    expect(checkStartGrant(p, "dem")?.code).toBe("forbidden");
    expect(canSeeProject(p, "other")).toBe(false);
  });

  it("answers an ungranted project the same way whether or not it exists", () => {
    const p = principal("p", ["coding_agent:run", "project:write"], []);
    expect(checkStartGrant(p, "exists")?.message.replace("exists", "X")).toBe(
      checkStartGrant(p, "nothere")?.message.replace("nothere", "X"),
    );
  });
});

describe("refusal messages say what is missing and what to do", () => {
  it("names the missing scope or the ungranted project, with the recovery the caller can take", () => {
    const none = principal("p", [], ["demo"]);
    expect(toolRefusal(none)).toEqual({
      code: "forbidden",
      message: expect.stringContaining("this token lacks coding_agent:run"),
      recovery_kind: "none",
      missing_scopes: ["coding_agent:run"],
    });
    const noWrite = principal("p", ["coding_agent:run"], ["demo"]);
    expect(checkStartGrant(noWrite, "demo")).toEqual({
      code: "forbidden",
      message:
        "Starting a coding agent needs the coding_agent:run and project:write scopes; this token lacks project:write. Ask the operator for a token issued with it.",
      recovery_kind: "none",
      missing_scopes: ["project:write"],
    });
    const noGrant = principal("p", ["coding_agent:run", "project:write"], ["demo"]);
    expect(grantRefusal(noGrant, "elsewhere")).toEqual(checkStartGrant(noGrant, "elsewhere"));
    expect(grantRefusal(noGrant, "elsewhere")).toEqual({
      code: "forbidden",
      message: expect.stringMatching(/^Project 'elsewhere' is not granted to this token\. Read webcodex:\/\/projects/),
      recovery_kind: "fix_input",
    });
  });
});

describe("missingScopes", () => {
  it("names exactly the scopes the token lacks, not every scope the call needs", () => {
    const runOnly = principal("p", ["coding_agent:run"], ["demo"]);
    const denied = missingScopes(runOnly, ["coding_agent:run", "project:write"], "Using agent tasks");
    expect(denied?.missing_scopes).toEqual(["project:write"]);
    expect(denied?.message).toBe(
      "Using agent tasks needs the coding_agent:run and project:write scopes; this token lacks project:write. " +
        "Ask the operator for a token issued with it.",
    );
    const neither = principal("p", ["project:read"], ["demo"]);
    expect(missingScopes(neither, ["runtime:read", "runtime:write"], "This")?.missing_scopes).toEqual([
      "runtime:read",
      "runtime:write",
    ]);
    expect(missingScopes(runOnly, ["coding_agent:run"], "Observing")).toBeNull();
  });
});
