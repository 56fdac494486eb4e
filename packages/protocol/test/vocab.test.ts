import { describe, expect, it } from "vitest";
import {
  base32,
  FAILURE_KINDS,
  FAILURE_SUMMARIES,
  isTerminalState,
  mapStopReason,
  RUN_ID_PATTERN,
  RUN_STATES,
  truncateUtf8,
} from "../src/index.js";

describe("stop-reason mapping (design §3)", () => {
  it.each([
    ["end_turn", "completed", "end_turn", null],
    ["cancelled", "cancelled", "cancelled", null],
    ["max_tokens", "failed", "max_tokens", "stop_reason"],
    ["max_turn_requests", "failed", "max_turn_requests", "stop_reason"],
    ["refusal", "failed", "refusal", "stop_reason"],
    ["bogus", "failed", null, "protocol_violation"],
    ["", "failed", null, "protocol_violation"],
    ["END_TURN", "failed", null, "protocol_violation"],
  ] as const)("%s → %s", (input, state, stopReason, failureKind) => {
    const out = mapStopReason(input);
    expect(out.state).toBe(state);
    expect(out.stop_reason).toBe(stopReason);
    expect(out.failure_kind).toBe(failureKind);
    // A correlated response always means the prompt ran: never not_started or unknown.
    expect(out.execution_state).toBe("completed");
  });
});

describe("vocabulary", () => {
  it("has exactly the seven run states of the contract", () => {
    expect(RUN_STATES).toEqual([
      "starting",
      "running",
      "waiting_permission",
      "completed",
      "failed",
      "cancelled",
      "lost",
    ]);
    expect(RUN_STATES.filter(isTerminalState)).toEqual(["completed", "failed", "cancelled", "lost"]);
  });
  it("gives every failure kind a fixed summary without placeholders", () => {
    for (const kind of FAILURE_KINDS) {
      const text = FAILURE_SUMMARIES[kind];
      expect(text.length).toBeGreaterThan(10);
      expect(text).not.toMatch(/[{}$]/);
    }
  });
});

describe("ids", () => {
  it("base32 matches RFC 4648 test vectors (lowercase, unpadded)", () => {
    const enc = (s: string) => base32(new TextEncoder().encode(s));
    expect(enc("")).toBe("");
    expect(enc("f")).toBe("my");
    expect(enc("fo")).toBe("mzxq");
    expect(enc("foo")).toBe("mzxw6");
    expect(enc("foob")).toBe("mzxw6yq");
    expect(enc("fooba")).toBe("mzxw6ytb");
    expect(enc("foobar")).toBe("mzxw6ytboi");
  });
  it("a run id is the prefix plus 26 base32 characters", () => {
    const id = `wc_agent_run_${base32(new Uint8Array(32).fill(7)).slice(0, 26)}`;
    expect(id).toMatch(RUN_ID_PATTERN);
  });
});

describe("truncateUtf8", () => {
  it("keeps short text as is", () => {
    expect(truncateUtf8("hello", 10)).toEqual({ text: "hello", truncated: false });
  });
  it("cuts to the byte bound without splitting a character", () => {
    const out = truncateUtf8("é".repeat(10), 5);
    expect(out.truncated).toBe(true);
    expect(out.text).toBe("éé");
    expect(Buffer.byteLength(out.text)).toBeLessThanOrEqual(5);
    const emoji = truncateUtf8("😀😀😀", 6);
    expect(emoji.text).toBe("😀");
  });
});
