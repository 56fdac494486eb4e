/**
 * One rule for idempotency keys (and workflow session ids): the MCP tool schema and the run core's own
 * validation (which every front end, including the test API, goes through) accept exactly the same strings.
 */
import { describe, expect, it } from "vitest";
import { validateStart } from "../src/admission.js";
import { StartToolInput } from "../src/mcp-tools.js";
import type { StartInput } from "../src/runs-api.js";

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

  it.each(CASES)(
    "the tool schema and the run core agree on workflow_session_id $key (valid: $valid)",
    ({ key, valid }) => {
      const schema = StartToolInput.safeParse({ ...base, workflow_session_id: key }).success;
      const core = validateStart({ ...base, workflow_session_id: key });
      expect(schema).toBe(valid);
      expect(core === null).toBe(valid);
    },
  );
});
