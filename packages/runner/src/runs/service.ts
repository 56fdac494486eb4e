/**
 * The seam between the Runner's run lifecycle (runs/manager.ts) and its
 * Server link (link/link.ts) / local commands (exec). The link only ever talks to
 * a RunService; it never sees ACP, processes or the store.
 */
import type {
  CapacityReason,
  ConfigMap,
  HelloFrame,
  RunEvent,
  RunnerErrorCode,
  RunSummary,
  RunTombstone,
} from "@webcodex/protocol";
import type { ApplyOutcome } from "../workspace/applies.js";
import type { ChangesOutcome } from "../workspace/changes.js";

/** Everything run.start carries, already validated by the protocol schema. */
export interface RunStartRequest {
  run_id: string;
  intent_fingerprint: string;
  project_id: string;
  provider_id: string;
  /** Fence: must equal the Runner's current agent_instance_id. */
  agent_instance_id: string;
  /** Fence: must equal the provider's current provider_instance_id. */
  provider_instance_id: string;
  prompt: string;
  config: ConfigMap;
  /** null = the Runner's default_run_timeout_secs; clamped to max_run_timeout_secs. */
  timeout_secs: number | null;
  /** The caller's opaque tenant tag (design §4.2); absent from older Servers and from `exec`. */
  tenant?: string | undefined;
  /** Only for a `worktree` project: what the run's checkout starts from (protocol BaseRef); absent: HEAD. */
  base_ref?: string | undefined;
  /** The terminal run whose ACP session this one continues (design §17); absent: a fresh session. */
  continue_run_id?: string | undefined;
}

/** One page of a run's recorded change (workspace/changes.ts), or why there is none. */
export type RunChangesOutcome = ChangesOutcome;

/** What applying a run's change did, why it was refused, or why it could not be asked (workspace/applies.ts). */
export type RunApplyOutcome = ApplyOutcome;

export type RunStartOutcome =
  | { ok: true; run: RunSummary; created: boolean }
  | {
      ok: false;
      code: RunnerErrorCode;
      message: string;
      run?: RunSummary;
      tombstone?: RunTombstone;
      /** Only with code `capacity`: why. */
      capacity_reason?: CapacityReason;
    };

export interface RunSyncResult {
  run: RunSummary;
  /** Events with seq > after_seq still in the ring, oldest first, at most max_events. */
  events: RunEvent[];
  has_more: boolean;
}

export interface RunCancelResult {
  run: RunSummary;
  cancel_requested: boolean;
  already_terminal: boolean;
}

/**
 * Pushed after every change of a run: its summary and the events new since the
 * last push. One call carries at most MAX_EVENTS_PER_UPDATE events of at most
 * UPDATE_EVENT_BYTES serialized, so it fits one run.update frame as it is.
 */
export type RunUpdateListener = (run: RunSummary, events: readonly RunEvent[]) => void;

export type HelloBody = Omit<HelloFrame, "type" | "protocol_version" | "inventory">;

export interface RunService {
  readonly agentInstanceId: string;
  readonly storeId: string;
  /** capabilities, providers and projects for `hello` (no paths, argv, env). */
  helloBody(): HelloBody;
  /**
   * Admit (durably) and start a run. Resolves once the admission row is
   * committed (or the run was rejected / already exists) — never waits for
   * the turn. Rejections before admission: stale_runner, stale_provider,
   * unknown_project, project_not_writable, unknown_provider, capacity.
   * Same run_id: same fingerprint → {ok, created:false}; else idempotency_conflict. A run_id with only a
   * tombstone left: same fingerprint → code `pruned` with the tombstone (the recorded outcome); else
   * idempotency_conflict. Never a fresh admission for an id this store ever admitted.
   *
   * Invariant: the admission (and every rejection) is decided synchronously,
   * before start() first awaits. The link builds a hello/inventory while a
   * start may be in flight; a run that will be admitted must never be
   * reported as unknown, or the Server would close it as never admitted.
   */
  start(request: RunStartRequest): Promise<RunStartOutcome>;
  /** null when the store holds no row for the run_id (then ask `tombstone`). */
  sync(runId: string, afterSeq: number, maxEvents: number): RunSyncResult | null;
  /** Idempotent. null when the store holds no row for the run_id (then ask `tombstone`). */
  cancel(runId: string): Promise<RunCancelResult | null>;
  /**
   * The tombstone of a run this store admitted and whose row retention pruned; null when there is none.
   * sync/cancel null + tombstone null = this store never admitted the run (the link's `not_found`).
   */
  tombstone(runId: string): RunTombstone | null;
  /** Bounded inventory: active runs and recent terminal runs, newest first. */
  inventory(): RunSummary[];
  /**
   * One page of a worktree run's recorded change from byte `offset` of its diff (design §16). null when the
   * store holds no row for the run_id (then ask `tombstone`).
   */
  changes(runId: string, offset: number, maxBytes: number): Promise<RunChangesOutcome | null>;
  /**
   * Bring a worktree run's recorded change into `target` of its project, remembered under `keyHash` (design §16).
   * null when the store holds no row for the run_id (then ask `tombstone`).
   */
  apply(runId: string, target: string, keyHash: string): Promise<RunApplyOutcome | null>;
  onUpdate(listener: RunUpdateListener): () => void;
  /** Cancel nothing, stop accepting, kill every child tree, close the store. */
  close(): Promise<void>;
}
