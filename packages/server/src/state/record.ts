/**
 * An admission record (design §6): what the Server keeps of a run — identity, routing, fences and lifecycle
 * only, NEVER the prompt, config bodies, events or the idempotency key — its columns, and how a row of either
 * engine becomes one. StateStore (state/store.ts) reads and writes them.
 */
import type {
  EffectiveConfigEntry,
  ExecutionState,
  FailureKind,
  RecoveryKind,
  RunState,
  StopReason,
} from "@webcodex/protocol";

export type AdmissionStatus = "intent_recorded" | "sent" | "admitted" | "rejected_pre_admission";

export interface AdmissionRecord {
  run_id: string;
  principal_id: string;
  project_id: string;
  provider_id: string;
  runner_id: string;
  intent_fingerprint: string;
  /** Fences captured at resolve time (null when the runner was offline). */
  agent_instance_id: string | null;
  provider_instance_id: string | null;
  /** The Runner store the run was sent to. */
  store_id: string | null;
  admission: AdmissionStatus;
  state: RunState;
  execution_state: ExecutionState;
  stop_reason: StopReason | null;
  failure_kind: FailureKind | null;
  recovery_kind: RecoveryKind;
  message: string | null;
  cancel_forwarded: boolean;
  /**
   * A cancel was sent and its delivery is unknown (the answer never came): sent again after the Runner's
   * next hello, on whichever instance accepts it (runs/cancel.ts). Cleared once the Runner answered.
   */
  cancel_pending: boolean;
  /** Every config option the agent advertised, with its value, as the Runner last reported (bounded). */
  effective_config: readonly EffectiveConfigEntry[];
  /**
   * The latest usage the Runner reported for the run (ACP usage_update: context tokens used / window
   * size, cost amount and ISO 4217 currency): numbers and a code only, each null until reported.
   */
  usage_used_tokens: number | null;
  usage_context_size: number | null;
  usage_cost_amount: number | null;
  usage_cost_currency: string | null;
  /**
   * Where in the Runner's own order the summary the record last took stands: its `last_seq` and the Runner's
   * `updated_at` (null until a summary was taken). A non-terminal summary behind it is stale (runs/context.ts).
   */
  runner_seq: number | null;
  runner_updated_at: string | null;
  created_at: string;
  updated_at: string;
}

export type RecordPatch = Partial<Omit<AdmissionRecord, "run_id" | "principal_id" | "created_at" | "updated_at">>;

export const RECORD_COLUMNS = [
  "run_id",
  "principal_id",
  "project_id",
  "provider_id",
  "runner_id",
  "intent_fingerprint",
  "agent_instance_id",
  "provider_instance_id",
  "store_id",
  "admission",
  "state",
  "execution_state",
  "stop_reason",
  "failure_kind",
  "recovery_kind",
  "message",
  "cancel_forwarded",
  "cancel_pending",
  "effective_config",
  "usage_used_tokens",
  "usage_context_size",
  "usage_cost_amount",
  "usage_cost_currency",
  "runner_seq",
  "runner_updated_at",
  "created_at",
  "updated_at",
] as const;

export const PATCHABLE = new Set<string>(
  RECORD_COLUMNS.filter((c) => c !== "run_id" && c !== "principal_id" && c !== "created_at"),
);

export type RecordRow = Omit<AdmissionRecord, "cancel_forwarded" | "cancel_pending" | "effective_config"> & {
  cancel_forwarded: number;
  cancel_pending: number;
  effective_config: string;
};

export function fromRow(row: RecordRow): AdmissionRecord {
  let effective: EffectiveConfigEntry[] = [];
  try {
    const parsed: unknown = JSON.parse(row.effective_config);
    if (Array.isArray(parsed)) effective = parsed as EffectiveConfigEntry[];
  } catch {
    effective = [];
  }
  return Object.freeze({
    ...row,
    cancel_forwarded: row.cancel_forwarded === 1,
    cancel_pending: row.cancel_pending === 1,
    effective_config: effective,
    // PostgreSQL's BIGINT arrives as a string.
    runner_seq: row.runner_seq === null || row.runner_seq === undefined ? null : Number(row.runner_seq),
  });
}

/** Which records `listRecent` returns (the operator console's filters). */
export interface RecordFilter {
  /** A state, or "active" for every non-terminal one. */
  state?: RunState | "active";
  project_id?: string;
  principal_id?: string;
}

/** The fields of a record the operator console lists. */
export type RecordListing = Pick<
  AdmissionRecord,
  | "run_id"
  | "principal_id"
  | "project_id"
  | "provider_id"
  | "runner_id"
  | "state"
  | "execution_state"
  | "stop_reason"
  | "failure_kind"
  | "recovery_kind"
  | "admission"
  | "created_at"
  | "updated_at"
  | "usage_used_tokens"
  | "usage_context_size"
  | "usage_cost_amount"
  | "usage_cost_currency"
>;

/** The reported cost of one principal's runs created on one UTC day, in one currency (numbers only). */
export interface CostTotal {
  /** YYYY-MM-DD (UTC), the day the runs were created. */
  day: string;
  principal_id: string;
  currency: string | null;
  amount: number;
  runs: number;
}

/** Whether `current` is still the record a decision was made on (both absent, or the same write). */
export function sameRecord(current: AdmissionRecord | undefined, seen: AdmissionRecord | undefined): boolean {
  if (current === undefined || seen === undefined) return current === seen;
  return (
    current.admission === seen.admission &&
    current.state === seen.state &&
    current.updated_at === seen.updated_at &&
    current.intent_fingerprint === seen.intent_fingerprint
  );
}
