import type { RunSummary } from "@webcodex/protocol";

/**
 * A Runner's summary of a run, as a run.update or a run.sync answer carries it: a started run's fields
 * (project `demo`, provider `fake`, one event), with `over` on top.
 */
export function runSummary(over: Partial<RunSummary> & Pick<RunSummary, "run_id">): RunSummary {
  const now = new Date().toISOString();
  return {
    intent_fingerprint: "f".repeat(64),
    project_id: "demo",
    provider_id: "fake",
    provider_instance_id: "pi_1",
    agent_instance_id: "ai_1",
    phase: "dispatch_barrier",
    state: "running",
    execution_state: "started",
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "none",
    message: null,
    effective_config: [],
    ignored_updates: 0,
    last_seq: 1,
    oldest_seq: 1,
    created_at: now,
    updated_at: now,
    ...over,
  };
}
