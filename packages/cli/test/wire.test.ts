/**
 * The CLI reads the tools' results with the protocol package's output schemas (the ones the Server's tools write
 * them with), tolerantly (src/tolerant.ts): what the Server's schema accepts, the CLI reads field for field; what a
 * Server one version apart may add is dropped or kept as sent, never fatal; the run state stays closed.
 */
import {
  EVENT_KINDS,
  ObserveToolOutput,
  type RunEvent as ProtocolRunEvent,
  ReadSessionOutput,
  ReconcileOutput,
} from "@webcodex/protocol";
import { describe, expect, it } from "vitest";
import { SessionRead } from "../src/session-wire.js";
import { ReconcileResult } from "../src/task-wire.js";
import { Observation, StartResult } from "../src/wire.js";

const RUN = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const AT = "2026-12-06T00:00:00.000Z";

/** One protocol-valid event of every kind the protocol has. */
const EVENTS: ProtocolRunEvent[] = [
  { seq: 1, at: AT, kind: "agent_message", text: "hi", truncated: false },
  { seq: 2, at: AT, kind: "reasoning", text: "hm", truncated: false },
  { seq: 3, at: AT, kind: "plan", entries: [{ content: "a", status: "pending", priority: "high" }], truncated: false },
  { seq: 4, at: AT, kind: "tool_activity", tool_call_id: "c1", title: "Read", tool_kind: "read", status: "completed" },
  { seq: 5, at: AT, kind: "file_change", tool_call_id: "c1", path: "src/a.js" },
  { seq: 6, at: AT, kind: "terminal_activity", tool_call_id: "c1", terminal_id: "t1" },
  { seq: 7, at: AT, kind: "usage", used_tokens: 1, context_size: null, cost_amount: null, cost_currency: null },
  {
    seq: 8,
    at: AT,
    kind: "permission_request",
    tool_call_id: "c1",
    title: "Write",
    options: [{ option_id: "o1", name: "Allow", kind: "allow_once" }],
  },
  { seq: 9, at: AT, kind: "agent_state", change: "session_info", title: null, truncated: false },
  {
    seq: 10,
    at: AT,
    kind: "terminal",
    state: "completed",
    execution_state: "completed",
    stop_reason: "end_turn",
    failure_kind: null,
    message: "done",
  },
];

const OBSERVED = {
  run_id: RUN,
  state: "completed",
  execution_state: "completed",
  stop_reason: "end_turn",
  recovery_kind: "none",
  events: EVENTS,
  observation_token: "wcobs1.x",
  history_lost: false,
  has_more: false,
  effective_config: [{ id: "mode", value: "plan" }],
};

describe("the CLI reads results with the protocol's output schemas", () => {
  it("reads every event kind of the protocol as known, with null fields absent", () => {
    expect(ObserveToolOutput.safeParse(OBSERVED).success).toBe(true);
    const obs = Observation.parse(OBSERVED);
    expect(obs.events.map((e) => e.kind)).toEqual([...EVENT_KINDS]);
    const usage = obs.events.find((e) => e.kind === "usage");
    expect(usage).toEqual({ seq: 7, at: AT, kind: "usage", used_tokens: 1 });
    const terminal = obs.events.find((e) => e.kind === "terminal");
    expect(terminal && "failure_kind" in terminal).toBe(false);
  });

  it("keeps what a newer Server may send as sent or drops it, never failing", () => {
    const obs = Observation.parse({
      ...OBSERVED,
      stop_reason: "a_new_reason",
      added_field: 1,
      events: [
        { seq: 1, at: AT, kind: "a_new_kind", body: 1 },
        { seq: 2, at: AT, kind: "agent_message", text: 5, truncated: false },
        { ...EVENTS[3], tool_kind: "a_new_tool_kind" },
      ],
    });
    expect(obs.stop_reason).toBe("a_new_reason");
    expect("added_field" in obs).toBe(false);
    expect(obs.events).toEqual([
      { seq: 1, at: AT, kind: "other", original_kind: "a_new_kind" },
      { seq: 2, at: AT, kind: "other", original_kind: "agent_message" },
      { ...EVENTS[3], tool_kind: "a_new_tool_kind" },
    ]);
  });

  it("refuses a run state the protocol does not have: the exit code is a function of it", () => {
    expect(Observation.safeParse({ ...OBSERVED, state: "paused" }).success).toBe(false);
    expect(
      StartResult.safeParse({
        run_id: RUN,
        state: "paused",
        execution_state: "started",
        replayed: false,
        observation_token: "t",
      }).success,
    ).toBe(false);
  });

  it("reads a reconcile and a session result the Server's schemas accept, nulls kept where the protocol has them", () => {
    const task = {
      task_id: "wc_task_aaaaaaaaaaaaaaaaaaaaaaaaaa",
      project_id: "demo",
      title: "t",
      state: "open",
      instruction_bytes: 3,
      created_at: AT,
      updated_at: AT,
    };
    const reconcile = { task, attempt: null, attempts: 0 };
    expect(ReconcileOutput.safeParse(reconcile).success).toBe(true);
    expect(ReconcileResult.parse(reconcile)).toEqual(reconcile);
    const session = {
      session_id: "wc_sess_aaaaaaaaaaaaaaaaaaaaaaaaaa",
      project_id: "demo",
      title: "s",
      handoff: "h",
      handoff_version: 1,
      goal: "g",
      goal_version: 1,
      version: 2,
      created_at: AT,
      updated_at: AT,
      evidence: [
        {
          seq: 1,
          at: AT,
          kind: "coding_agent_started",
          run_id: RUN,
          provider_id: "fake",
          state: "running",
          execution_state: "started",
        },
      ],
      evidence_dropped: 0,
      has_more: false,
    };
    expect(ReadSessionOutput.safeParse(session).success).toBe(true);
    const read = SessionRead.parse(session);
    expect(read.evidence[0]).toEqual({ seq: 1, at: AT, kind: "coding_agent_started", run_id: RUN, state: "running" });
    expect(read.version).toBe(2);
  });
});
