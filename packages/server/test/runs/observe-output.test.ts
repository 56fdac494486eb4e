/**
 * The observe tool's output check (runs/observe-output.ts): the same result as `ObserveToolOutput.parse` of
 * the whole answer, with each event object checked once and its checked copy shared by every answer that
 * shows it (the observers of a run woken by one update).
 */
import { ObserveToolOutput, type RunEvent } from "@webcodex/protocol";
import { describe, expect, it } from "vitest";
import type { ObserveOutput } from "../../src/runs/api.js";
import { checkObserveOutput } from "../../src/runs/observe-output.js";

const RUN_ID = `wc_agent_run_${"a".repeat(26)}`;

function answer(events: RunEvent[], token: string): ObserveOutput {
  return {
    run_id: RUN_ID,
    state: "running",
    execution_state: "started",
    recovery_kind: "none",
    events,
    observation_token: token,
    history_lost: false,
    has_more: false,
    effective_config: [],
    started_at: "2026-01-01T00:00:00.000Z",
  };
}

const event = (seq: number): RunEvent => ({
  seq,
  at: "2026-01-01T00:00:01.000Z",
  kind: "agent_message",
  text: `message ${seq}`,
  truncated: false,
});

describe("checkObserveOutput", () => {
  it("gives what ObserveToolOutput.parse gives, key order included", () => {
    const value = answer([event(1), event(2)], "wcobs1.x.y");
    const checked = checkObserveOutput(value);
    expect(JSON.stringify(checked)).toBe(JSON.stringify(ObserveToolOutput.parse(value)));
  });

  it("shares each event's checked copy between the answers that show it", () => {
    const shared = [event(3), event(4)];
    const a = checkObserveOutput(answer(shared, "wcobs1.a.a"));
    const b = checkObserveOutput(answer([...shared], "wcobs1.b.b"));
    expect(b.events[0]).toBe(a.events[0]);
    expect(b.events[1]).toBe(a.events[1]);
    expect(a.observation_token).toBe("wcobs1.a.a");
    expect(b.observation_token).toBe("wcobs1.b.b");
  });

  it("refuses what the schema refuses: a bad event, an unknown key", () => {
    const bad = { ...event(5), kind: "no_such_kind" } as unknown as RunEvent;
    expect(() => checkObserveOutput(answer([bad], "t"))).toThrow();
    const extra = { ...answer([], "t"), surprise: true } as ObserveOutput;
    expect(() => checkObserveOutput(extra)).toThrow();
  });
});
