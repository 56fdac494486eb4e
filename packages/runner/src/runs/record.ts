/**
 * One admitted run held in memory by the run manager: its summary fields,
 * event ring, and the controls of its turn (child, connection, cancel,
 * permission waiters, timers). Also the summary of a run known only from the
 * durable store.
 */
import type {
  EffectiveConfigEntry,
  ExecutionState,
  FailureKind,
  RecoveryKind,
  RunPhase,
  RunState,
  RunSummary,
  SetupStage,
  StopReason,
} from "@webcodex/protocol";
import type { AcpClientConnection } from "../acp/session.js";
import type { AgentConfig, ProjectConfig } from "../config/config.js";
import type { EventNormalizer } from "../events/normalize.js";
import type { Redactor } from "../events/redactor.js";
import { EventRing, type RingLimits } from "../events/ring.js";
import type { TextPacer } from "../events/text-pacer.js";
import type { RunAs } from "../process/run-as.js";
import type { AgentChild } from "../process/spawn.js";
import type { DispatchRow, TerminalUpdate } from "../store/types.js";
import type { CancelReason, PermissionAnswer } from "./terminal.js";

/** One admitted run held in memory: its summary fields, event ring and turn controls. */
export class Run {
  phase: RunPhase = "admitted";
  state: RunState = "starting";
  execution_state: ExecutionState = "not_started";
  stop_reason: StopReason | null = null;
  failure_kind: FailureKind | null = null;
  recovery_kind: RecoveryKind = "wait";
  message: string | null = null;
  effective_config: EffectiveConfigEntry[] = [];
  updated_at: string;
  readonly ring: EventRing;
  normalizer: EventNormalizer | null = null;
  /** When the normalizer's streamed text is flushed (stopped with the timers). */
  textPacer: TextPacer | null = null;

  child: AgentChild | null = null;
  /** The run_as pool user this run holds from admission until it is swept (process/user-pool.ts); null: the Runner's user. */
  runAs: RunAs | null = null;
  /** The run's redactor once its env is resolved (event text, and the stderr tail of its diagnostics). */
  redactor: Redactor | null = null;
  conn: AcpClientConnection | null = null;
  sessionId: string | null = null;
  /** The parent run's ACP session this run continues (design §17, acp/resume.ts); null: a fresh session. */
  continueSessionId: string | null = null;
  stage: SetupStage = "spawn";

  cancelReason: CancelReason | null = null;
  setupExpired = false;
  readonly setupAbort = new AbortController();
  sessionCancelSent = false;
  /** Resolves when the cancel grace (armed by a cancel or the deadline) has run out. */
  readonly graceExpired: Promise<void>;
  expireGrace!: () => void;
  readonly permissionWaiters = new Set<(why: CancelReason) => void>();
  pendingPermissions = 0;
  /**
   * The terminal state whose durable write failed: the run stays pinned in
   * memory (never evicted) so sync/inventory/cancel answer the terminal state,
   * and the write is retried at each retain/evict and at close.
   */
  unsavedTerminal: TerminalUpdate | null = null;
  /** Permission requests answered `cancelled` at once because MAX_PENDING_PERMISSIONS were waiting. */
  refusedPermissions = 0;
  /** Why the first permission request was answered `cancelled` (for the terminal message). */
  permissionAnswered: PermissionAnswer | null = null;
  readonly timers = new Set<NodeJS.Timeout>();

  pushedSeq = 0;
  pushScheduled = false;
  settled: Promise<void>;
  markSettled!: () => void;

  constructor(
    readonly run_id: string,
    readonly intent_fingerprint: string,
    readonly project: ProjectConfig,
    readonly agent: AgentConfig,
    readonly provider_instance_id: string,
    readonly agent_instance_id: string,
    readonly created_at: string,
    readonly timeoutSecs: number,
    ringLimits: Partial<RingLimits> | undefined,
    now: () => Date,
  ) {
    this.updated_at = created_at;
    this.ring = new EventRing(ringLimits, now);
    this.settled = new Promise<void>((resolve) => {
      this.markSettled = resolve;
    });
    this.graceExpired = new Promise<void>((resolve) => {
      this.expireGrace = resolve;
    });
  }

  get terminal(): boolean {
    return this.phase === "terminal";
  }

  get dispatched(): boolean {
    return this.phase === "dispatch_barrier";
  }

  summary(): RunSummary {
    return {
      run_id: this.run_id,
      intent_fingerprint: this.intent_fingerprint,
      project_id: this.project.id,
      provider_id: this.agent.id,
      provider_instance_id: this.provider_instance_id,
      agent_instance_id: this.agent_instance_id,
      phase: this.phase,
      state: this.state,
      execution_state: this.execution_state,
      stop_reason: this.stop_reason,
      failure_kind: this.failure_kind,
      recovery_kind: this.recovery_kind,
      message: this.message,
      effective_config: this.effective_config,
      ignored_updates: this.normalizer?.ignoredUpdates ?? 0,
      last_seq: this.ring.lastSeq,
      oldest_seq: this.ring.oldestSeq,
      created_at: this.created_at,
      updated_at: this.updated_at,
      ...(this.normalizer?.usage ? { usage: this.normalizer.usage } : {}),
    };
  }

  timer(ms: number, fn: () => void): void {
    const t = setTimeout(() => {
      this.timers.delete(t);
      fn();
    }, ms);
    this.timers.add(t);
  }

  clearTimers(): void {
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    this.textPacer?.stop();
  }
}

/** A summary for a run known only from the store (another Runner process, or evicted from memory). */
export function rowToSummary(row: DispatchRow): RunSummary {
  return {
    run_id: row.run_id,
    intent_fingerprint: row.intent_fingerprint,
    project_id: row.project_id,
    provider_id: row.provider_id,
    provider_instance_id: row.provider_instance_id,
    agent_instance_id: row.agent_instance_id,
    phase: row.phase,
    state: row.state,
    execution_state: row.execution_state,
    stop_reason: row.stop_reason,
    failure_kind: row.failure_kind,
    recovery_kind: row.recovery_kind,
    message: row.message,
    effective_config: row.effective_config,
    ignored_updates: row.ignored_updates,
    last_seq: row.last_seq,
    oldest_seq: row.last_seq + 1,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}
