/**
 * The durable dispatch record contract (design §4.4). Implemented by
 * store/dispatch-store.ts (better-sqlite3, WAL, synchronous=FULL); used by the run
 * lifecycle. Only these fields are ever stored: never the prompt, config
 * bodies, transcript, idempotency key, credentials, ACP session id or messages.
 */
import type {
  ApplyResultKind,
  EffectiveConfigEntry,
  ExecutionState,
  FailureKind,
  RecoveryKind,
  RunPhase,
  RunState,
  RunTombstone,
  StopReason,
} from "@webcodex/protocol";

export interface DispatchRow {
  run_id: string;
  intent_fingerprint: string;
  project_id: string;
  provider_id: string;
  provider_instance_id: string;
  agent_instance_id: string;
  phase: RunPhase;
  state: RunState;
  execution_state: ExecutionState;
  stop_reason: StopReason | null;
  failure_kind: FailureKind | null;
  recovery_kind: RecoveryKind;
  /** Fixed, secret-free text. */
  message: string | null;
  effective_config: EffectiveConfigEntry[];
  ignored_updates: number;
  /** Last event seq produced while this Runner process held the run. */
  last_seq: number;
  created_at: string;
  updated_at: string;
  /** Local only, never sent: the child's process-group id and its start time (/proc starttime ticks). */
  child_pgid: number | null;
  child_start_time: string | null;
}

/**
 * What the store keeps of a run after retention pruned its row (encoding: store/tombstone.ts): the wire
 * shape plus the fingerprint prefix, which is never sent.
 */
export interface Tombstone extends RunTombstone {
  fingerprintPrefix: string;
}

/** What a caller decides about a new run; everything else in its first row is fixed by `admit`. */
export type AdmissionRow = Pick<
  DispatchRow,
  | "run_id"
  | "intent_fingerprint"
  | "project_id"
  | "provider_id"
  | "provider_instance_id"
  | "agent_instance_id"
  | "created_at"
>;

export type TerminalUpdate = Pick<
  DispatchRow,
  | "state"
  | "execution_state"
  | "stop_reason"
  | "failure_kind"
  | "recovery_kind"
  | "message"
  | "ignored_updates"
  | "last_seq"
>;

/**
 * A worktree run's workspace (design §16; workspace/): its branch and base commit, recorded before the worktree is
 * made, and the head of its change, recorded once that change is committed — before the run's terminal is reported.
 */
export interface WorkspaceRow {
  run_id: string;
  branch: string;
  base_commit: string;
  /** null until the run's change is recorded. */
  head_commit: string | null;
}

/**
 * One apply of a worktree run's change (design §16), remembered under the SHA-256 of the caller's idempotency key
 * so that the same key gets the same answer. Recorded only when the apply answered (applied, up to date, or a
 * conflict), never for a refusal.
 */
export interface ApplyRow {
  run_id: string;
  key_hash: string;
  target_branch: string;
  result: ApplyResultKind;
  target_before: string;
  target_after: string;
}

export interface DispatchStore {
  /** Random id created with the database; changes only with --new-store. */
  readonly storeId: string;
  get(runId: string): DispatchRow | undefined;
  /** The tombstone of a run whose row retention pruned (store/tombstone.ts); undefined when there is none. */
  tombstone(runId: string): Tombstone | undefined;
  /** Rows for the inventory: every non-terminal row plus the newest terminal rows, newest first, bounded. */
  listForInventory(limit: number): DispatchRow[];
  /**
   * Insert the admission row: these identity fields, and the one lifecycle every run starts in (phase
   * admitted, state starting, execution not_started, recovery wait, no config, seq 0). Throws if run_id exists
   * as a row or as a tombstone. Committed without an fsync of its own (kept by a crash of the process); durable
   * after the next FULL commit or `ensureDurable`.
   */
  admit(row: AdmissionRow): DispatchRow;
  /**
   * Make every commit so far durable (fsync'd), if one was made without an fsync since the last that was
   * (the admission, the effective config: store/dispatch-store.ts). Called before run.start is answered.
   */
  ensureDurable(runId: string): void;
  /** phase setup, with the child's identity (called right after the fork, durably: it also covers the admission). */
  markSetup(runId: string, child: { pgid: number; startTime: string } | null): void;
  /** Record the effective config snapshot (before the barrier, whose durable commit makes it durable too). */
  recordEffectiveConfig(runId: string, config: EffectiveConfigEntry[]): void;
  /**
   * Keep the run's ACP session id (design §17; not a secret) for a later run that continues it: committed
   * without an fsync of its own, durable with the barrier's commit. Survives restarts; gone with the row.
   */
  recordAcpSession(runId: string, sessionId: string): void;
  /** The ACP session id a run kept, or null (none recorded, or no such row). */
  acpSessionOf(runId: string): string | null;
  /**
   * The barrier: commit phase dispatch_barrier, state running, execution_state started,
   * durably (fsync'd) before returning. The prompt is written only after this returns.
   */
  markDispatchBarrier(runId: string): void;
  /** Non-terminal state changes that matter across restarts are NOT stored (waiting_permission is in memory). */
  markTerminal(runId: string, update: TerminalUpdate): void;
  /** Clear the child identity once its tree is reaped. */
  clearChild(runId: string): void;
  /** A worktree run's branch and base commit, durably, before its worktree is made. Throws if recorded before. */
  recordWorkspace(runId: string, workspace: { branch: string; base_commit: string }): void;
  /** The head of a worktree run's recorded change, durably. */
  recordChange(runId: string, headCommit: string): void;
  workspace(runId: string): WorkspaceRow | undefined;
  /** Workspaces whose change is not recorded yet (start-up: a previous process ended before it did). */
  unrecordedWorkspaces(): WorkspaceRow[];
  /** Whether a run this store still holds a row of works on `branch` (a continuation shares its parent's). */
  branchInUse(branch: string): boolean;
  /** An apply's answer, durably (fsync'd), under its run and key hash. Throws if that key was recorded before. */
  recordApply(row: ApplyRow): void;
  applyOf(runId: string, keyHash: string): ApplyRow | undefined;
  /** How many keys the run's applies are remembered under (bounded by MAX_APPLIES_PER_RUN). */
  applyCount(runId: string): number;
  close(): void;
}
