/**
 * One validator for a start's input: the run core's StartInput schema, which start_coding_agent's tool schema
 * extends. Both accept exactly the same idempotency keys and say the same about a bad one. Workflow session
 * selectors are the MCP tools' (sessions/service.ts): the run core's schema refuses them rather than silently
 * dropping one, and its type has no such field.
 */
import { describe, expect, it } from "vitest";
import { StartInput } from "../../src/runs/api.js";
import { StartToolInput } from "../../src/runs/tool-schemas.js";
import { parseToolInput } from "../../src/tools/input.js";

const base: StartInput = { project_id: "demo", provider_id: "fake", idempotency_key: "k", prompt: "hi" };

const CASES: { key: string; valid: boolean }[] = [
  { key: "k", valid: true },
  { key: "a".repeat(128), valid: true },
  { key: "!~{}[]:,'\"", valid: true },
  { key: "", valid: false },
  { key: "a".repeat(129), valid: false },
  { key: "has space", valid: false },
  { key: "tab\there", valid: false },
  { key: "nl\n", valid: false },
  { key: "\u007f", valid: false },
  { key: "ünïcode", valid: false },
  { key: "€", valid: false },
];

describe("idempotency key rule", () => {
  it.each(CASES)("the tool schema and the run core agree on key $key (valid: $valid)", ({ key, valid }) => {
    const tool = parseToolInput(StartToolInput, { ...base, idempotency_key: key });
    const core = parseToolInput(StartInput, { ...base, idempotency_key: key });
    expect(tool.ok).toBe(valid);
    expect(core.ok).toBe(valid);
    if (!tool.ok && !core.ok) {
      expect(core.error).toEqual(tool.error);
      expect(core.error.message).toMatch(/^idempotency_key: /);
    }
  });

  it("says which rule a printable-ASCII violation breaks", () => {
    const core = parseToolInput(StartInput, { ...base, idempotency_key: "has space" });
    expect(core).toMatchObject({
      ok: false,
      error: {
        code: "invalid_input",
        message: "idempotency_key: must be 1-128 printable ASCII characters without spaces",
      },
    });
  });

  it.each(CASES)("workflow_session_id $key is not a session id, and the run core never takes one", ({ key }) => {
    expect(StartToolInput.safeParse({ ...base, workflow_session_id: key }).success).toBe(false);
    expect(parseToolInput(StartInput, { ...base, workflow_session_id: key })).toMatchObject({
      ok: false,
      error: { code: "invalid_input", message: "unknown field 'workflow_session_id' not allowed" },
    });
  });

  it("the tool schema takes a wc_sess_ id as workflow_session_id and context_session_id; the run core does not", () => {
    const id = `wc_sess_${"a".repeat(26)}`;
    expect(StartToolInput.safeParse({ ...base, workflow_session_id: id, context_session_id: id }).success).toBe(true);
    expect(StartInput.safeParse({ ...base, workflow_session_id: id }).success).toBe(false);
    // @ts-expect-error the run core's input type has no session selector
    const typed: StartInput = { ...base, workflow_session_id: id };
    expect(typed.prompt).toBe("hi");
  });
});
