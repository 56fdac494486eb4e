/**
 * What the managed path shows its callers (design §10): the task, attempt and run-outcome views and the
 * mapping from stored rows to them. Nothing here reads or writes the stores; optional fields are left out
 * rather than sent as null, and times are ISO 8601.
 */
import type { RunState, RunUsage } from "@webcodex/protocol";
import { recordUsage } from "../runs/usage.js";
import type { AdmissionRecord } from "../state/record.js";
import type { AttemptRefs } from "./claim.js";
import type { AttemptRow, TaskOutcome, TaskRow } from "./store.js";

export interface TaskView {
  task_id: string;
  project_id: string;
  title: string;
  state: "open" | "closed";
  outcome?: TaskOutcome;
  instruction_bytes: number;
  current_attempt_id?: string;
  created_at: string;
  updated_at: string;
  closed_at?: string;
}

export interface AttemptClaimView {
  task_id: string;
  attempt_id: string;
  attempt_ref: string;
  assignee: string;
  fence: number;
  controller_generation: number;
  lease_expires_at: string;
}

export interface RunOutcomeView {
  run_id: string;
  state: RunState;
  execution_state: AdmissionRecord["execution_state"];
  stop_reason?: NonNullable<AdmissionRecord["stop_reason"]>;
  failure_kind?: NonNullable<AdmissionRecord["failure_kind"]>;
  recovery_kind: AdmissionRecord["recovery_kind"];
  message?: string;
  /** The run's latest reported usage (numbers only), as observe shows it. */
  usage?: RunUsage;
  reconciled_at: string;
  /** Continuation (design §17): the run this one continues, and the run that continues it (reconcile only). */
  parent_run_id?: string;
  continued_by?: string;
}

export interface AttemptView extends AttemptClaimView {
  state: AttemptRow["state"];
  lease_live: boolean;
  superseded_run_id?: string;
  run: RunOutcomeView | null;
}

export function iso(ms: number): string {
  return new Date(ms).toISOString();
}

export function taskView(row: TaskRow): TaskView {
  return {
    task_id: row.task_id,
    project_id: row.project_id,
    title: row.title,
    state: row.state,
    ...(row.outcome !== null ? { outcome: row.outcome } : {}),
    instruction_bytes: row.instruction_bytes,
    ...(row.current_attempt_id !== null ? { current_attempt_id: row.current_attempt_id } : {}),
    created_at: row.created_at,
    updated_at: row.updated_at,
    ...(row.closed_at !== null ? { closed_at: row.closed_at } : {}),
  };
}

/** The attempt's claim, with a freshly issued attempt_ref naming it. */
export function claimView(row: AttemptRow, refs: AttemptRefs): AttemptClaimView {
  return {
    task_id: row.task_id,
    attempt_id: row.attempt_id,
    attempt_ref: refs.issue(row),
    assignee: row.assignee,
    fence: row.fence,
    controller_generation: row.controller_generation,
    lease_expires_at: iso(row.lease_expires_ms),
  };
}

/** The run's authoritative state (its admission record) as read at `reconciledAt`. */
export function runOutcomeView(rec: AdmissionRecord, reconciledAt: string): RunOutcomeView {
  const usage = recordUsage(rec);
  return {
    run_id: rec.run_id,
    state: rec.state,
    execution_state: rec.execution_state,
    recovery_kind: rec.recovery_kind,
    ...(rec.stop_reason !== null ? { stop_reason: rec.stop_reason } : {}),
    ...(rec.failure_kind !== null ? { failure_kind: rec.failure_kind } : {}),
    ...(rec.message !== null ? { message: rec.message } : {}),
    ...(usage ? { usage } : {}),
    reconciled_at: reconciledAt,
  };
}
