/**
 * Issue 40 item 3: a call's shape is checked once, at the edge, and its authority decided once, in the core —
 * so each refusal has one text, whichever tool and whichever protocol era asks. Real Server over HTTP, a real
 * SDK client of each era (v1 for 2025-11-25, v2 pinned to 2026-07-28); the expected texts are the ones
 * principals/authority.ts words, and the audit shows a malformed call refused exactly once.
 */
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { poll } from "../../../../scripts/test-support/index.js";
import { grantRefusal, startRefusal } from "../../src/principals/authority.js";
import type { Principal, Scope } from "../../src/principals/principal.js";
import { type Stack, startStack } from "../support/stack.js";

const ALL: Scope[] = ["coding_agent:run", "project:write", "project:read", "runtime:read", "runtime:write"];
const MODERN = "2026-07-28";
/** Bound on the audit writer flushing a call's row, on a loaded machine. */
const AUDIT_WAIT_MS = 30_000;

type CallResult = { isError?: boolean; content: unknown };
type Caller = (name: string, args: Record<string, unknown>) => Promise<CallResult>;

let stack: Stack;
const modernClients: ModernClient[] = [];
/** Per era, a caller for each token kind. */
const eras: Record<"2025-11-25" | "2026-07-28", { runOnly: Caller; full: Caller; malformed: Caller }> = {} as never;

async function modernCaller(token: string): Promise<Caller> {
  const client = new ModernClient(
    { name: "webcodex-test-2026", version: "0" },
    { versionNegotiation: { mode: { pin: MODERN } } },
  );
  await client.connect(
    new ModernTransport(stack.mcpUrl, { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
  );
  modernClients.push(client);
  return async (name, args) => (await client.callTool({ name, arguments: args }, { timeout: 60_000 })) as CallResult;
}

async function legacyCaller(token: string): Promise<Caller> {
  const client = await stack.connect(token);
  return async (name, args) =>
    (await client.callTool({ name, arguments: args }, undefined, { timeout: 60_000 })) as CallResult;
}

/** The error envelope of a refused call (asserting it is one). */
async function refusal(call: Caller, name: string, args: Record<string, unknown>): Promise<Record<string, unknown>> {
  const result = await call(name, args);
  const text = (result.content as { type: string; text: string }[])[0]?.text ?? "";
  expect(result.isError, `${name} should be refused, got ${text}`).toBe(true);
  return (JSON.parse(text) as { error: Record<string, unknown> }).error;
}

const who = (id: string, scopes: Scope[], projects: string[]): Principal => ({
  id,
  scopes: new Set(scopes),
  projects: new Set(projects),
});

beforeAll(async () => {
  stack = await startStack({
    principals: [
      { id: "alice", scopes: ALL, projects: ["demo"] },
      { id: "carol", scopes: ALL, projects: ["demo"] },
      { id: "dave", scopes: ALL, projects: ["demo"] },
    ],
    projects: [{ id: "demo", allow_patch: true }],
    runner: false,
  });
  const runOnly = await stack.issueToken("alice", ["coding_agent:run"], ["demo"]);
  const full = await stack.issueToken("alice", ALL, ["demo"]);
  eras["2025-11-25"] = {
    runOnly: await legacyCaller(runOnly),
    full: await legacyCaller(full),
    malformed: await legacyCaller(await stack.issueToken("carol", ALL, ["demo"])),
  };
  eras["2026-07-28"] = {
    runOnly: await modernCaller(runOnly),
    full: await modernCaller(full),
    malformed: await modernCaller(await stack.issueToken("dave", ALL, ["demo"])),
  };
});

afterAll(async () => {
  for (const c of modernClients) await c.close();
  await stack?.stop();
});

const start = (projectId: string, key: string) => ({
  project_id: projectId,
  provider_id: "fake",
  idempotency_key: key,
  prompt: "scenario: hello",
});
const createTask = (projectId: string, key: string) => ({
  project_id: projectId,
  instruction: "scenario: hello",
  idempotency_key: key,
});

describe.each(["2025-11-25", "2026-07-28"] as const)("one refusal, one text (%s)", (era) => {
  it("refuses a token without project:write with the run core's one message, for a run and for an agent task", async () => {
    const { runOnly } = eras[era];
    const lacking = who("alice", ["coding_agent:run"], ["demo"]);
    expect(await refusal(runOnly, "start_coding_agent", start("demo", `scope-${era}`))).toEqual(
      startRefusal(lacking, "demo", "Starting a coding agent"),
    );
    expect(await refusal(runOnly, "create_agent_task", createTask("demo", `scope-task-${era}`))).toEqual(
      startRefusal(lacking, "demo", "Using agent tasks"),
    );
    expect(startRefusal(lacking, "demo", "Starting a coding agent")).toMatchObject({
      code: "forbidden",
      missing_scopes: ["project:write"],
    });
  });

  it("refuses a project the token has no grant on with the same message from every tool", async () => {
    const { full } = eras[era];
    const expected = grantRefusal(who("alice", ALL, ["demo"]), "secret");
    expect(expected).not.toBeNull();
    expect(await refusal(full, "start_coding_agent", start("secret", `grant-${era}`))).toEqual(expected);
    expect(await refusal(full, "create_agent_task", createTask("secret", `grant-task-${era}`))).toEqual(expected);
  });

  it("refuses a malformed argument once, naming the field, with one audit row", async () => {
    const { malformed } = eras[era];
    const principalId = era === "2025-11-25" ? "carol" : "dave";
    const args = { ...start("demo", `malformed-${era}`), prompt: 42 };
    expect(await refusal(malformed, "start_coding_agent", args)).toEqual({
      code: "invalid_input",
      message: "prompt: must be a string",
      recovery_kind: "fix_input",
    });
    const rows = () =>
      stack.rows<{ tool: string; outcome: string }>("SELECT tool, outcome FROM mcp_audit WHERE principal_id = ?", [
        principalId,
      ]);
    await poll(async () => (await rows()).length > 0, {
      timeoutMs: AUDIT_WAIT_MS,
      intervalMs: 50,
      what: `${principalId}'s refused call audited`,
    });
    expect(await rows()).toEqual([{ tool: "start_coding_agent", outcome: "invalid_input" }]);
  });
});
