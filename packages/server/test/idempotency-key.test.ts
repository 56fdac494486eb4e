/**
 * One rule for idempotency keys: the MCP tool schema and the run core's own validation (which every front
 * end, including the test API, goes through) accept exactly the same strings. Workflow session selectors are
 * the MCP tools' (sessions/service.ts): the run core refuses them rather than silently dropping one.
 */
import { describe, expect, it } from "vitest";
import { validateStart } from "../src/runs/admission.js";
import type { StartInput } from "../src/runs/api.js";
import { StartToolInput } from "../src/runs/tool-schemas.js";

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
    const schema = StartToolInput.safeParse({ ...base, idempotency_key: key }).success;
    const core = validateStart({ ...base, idempotency_key: key });
    expect(schema).toBe(valid);
    expect(core === null).toBe(valid);
    if (!valid) expect(core).toBe("idempotency_key must be 1-128 printable ASCII characters without spaces.");
  });

  it.each(CASES)("workflow_session_id $key is not a session id, and the run core never takes one", ({ key }) => {
    expect(StartToolInput.safeParse({ ...base, workflow_session_id: key }).success).toBe(false);
    expect(validateStart({ ...base, workflow_session_id: key })).toContain("resolved by the MCP tools");
  });

  it("the tool schema takes a wc_sess_ id as workflow_session_id and context_session_id", () => {
    const id = `wc_sess_${"a".repeat(26)}`;
    expect(StartToolInput.safeParse({ ...base, workflow_session_id: id, context_session_id: id }).success).toBe(true);
    expect(validateStart({ ...base, workflow_session_id: id })).toContain("resolved by the MCP tools");
  });
});
