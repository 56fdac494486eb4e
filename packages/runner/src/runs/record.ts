/**
 * One admitted run held in memory by the run manager: its summary fields,
 * event ring, its ACP turn (acp/turn.ts: stage, event pipeline, cancellation)
 * and what the turn's events record (child, connection, phase, state). Also
 * the summary of a run known only from the durable store.
 */
import type {
  EffectiveConfigEntry,
  ExecutionState,
  FailureKind,
  RecoveryKind,
  RunPhase,
  RunState,
  RunSummary,
  RunWorkspace,
  SetupStage,
  StopReason,
} from "@webcodex/protocol";
import type { AcpClientConnection } from "../acp/session.js";
import type { CancelReason } from "../acp/terminal.js";
import type { AcpTurn } from "../acp/turn.js";
import type { TurnEvent } from "../acp/turn-events.js";
import type { AgentConfig, ProjectConfig } from "../config/config.js";
import type { RunAs } from "../config/run-as.js";
import type { EventNormalizer } from "../events/normalize.js";
import type { Redactor } from "../events/redactor.js";
import { EventRing, type RingLimits } from "../events/ring.js";
import type { AgentChild } from "../process/spawn.js";
import type { DispatchRow, TerminalUpdate } from "../store/types.js";
import type { KeptAgent } from "./kept-agents.js";

/** One admitted run held in memory: its summary fields, event ring and turn. */
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
  /** The run's ACP turn once it started (acp/turn.ts); null for a run ended before anything was spawned. */
  turn: AcpTurn | null = null;

  /** The agent process (from the turn's `spawned`) until its tree is cleaned up. */
  child: AgentChild | null = null;
  /** Where the agent works: the project root, or the run's own worktree (workspace/). */
  cwd: string;
  /** A worktree run's workspace as its summary reports it (design §16); null for a shared-tree run. */
  workspace: RunWorkspace | null = null;
  /** The turn has ended and the run's change is being recorded: its terminal follows; a cancel changes nothing. */
  settling = false;
  /** A cancel asked before the turn exists (a worktree run's checkout is still being made): handed to the turn. */
  pendingCancel: CancelReason | null = null;
  /** The run_as pool user this run holds from admission until it is swept (process/user-pool.ts); null: the Runner's user. */
  runAs: RunAs | null = null;
  /** The ACP connection (from the turn's `setup`) until the run's cleanup closes it. */
  conn: AcpClientConnection | null = null;
  /** The parent run's ACP session this run continues (design §17, acp/resume.ts); null: a fresh session. */
  continueSessionId: string | null = null;
  /** That parent run's id, whose workspace a `worktree` project's continuation works in; null: none. */
  continueRunId: string | null = null;
  /** The parent's kept agent this follow-up prompts again (runs/kept-agents.ts); null: the turn spawns one. */
  warm: KeptAgent | null = null;
  /** The caller's tenant tag from run.start (a kept agent serves a follow-up of the same tenant only). */
  tenant: string | undefined = undefined;
  /**
   * The terminal state whose durable write failed: the run stays pinned in
   * memory (never evicted) so sync/inventory/cancel answer the terminal state,
   * and the write is retried at each retain/evict and at close.
   */
  unsavedTerminal: TerminalUpdate | null = null;

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
    this.cwd = project.root;
    this.ring = new EventRing(ringLimits, now);
    this.settled = new Promise<void>((resolve) => {
      this.markSettled = resolve;
    });
  }

  /** The turn's event pipeline: the run's ignored-updates count and usage. */
  get normalizer(): EventNormalizer | null {
    return this.turn?.normalizer ?? null;
  }

  /** The run's redactor once its env is resolved (event text, and the stderr tail of its diagnostics). */
  get redactor(): Redactor | null {
    return this.turn?.redactor ?? null;
  }

  /** The setup stage the run is in, or ended in (`prompt` once dispatched). */
  get stage(): SetupStage {
    return this.turn?.stage ?? "spawn";
  }

  /**
   * Record what the turn yielded (all but its milestones, which are the timings'): "state" when the run's
   * state changed (stamp updated_at and push soon), "events" when its ring or counters did (push soon),
   * null when nothing is pushed for it.
   */
  recordTurnEvent(event: Exclude<TurnEvent, { kind: "milestone" }>): "state" | "events" | null {
    switch (event.kind) {
      case "spawned":
        this.child = event.child;
        return null;
      case "setup":
        this.conn = event.conn;
        this.phase = "setup";
        return "state";
      case "configured":
        this.effective_config = event.effective;
        return null;
      case "dispatched":
        this.phase = "dispatch_barrier";
        this.state = "running";
        this.execution_state = "started";
        this.recovery_kind = "wait";
        return "state";
      case "state":
        this.state = event.state;
        return "state";
      case "events":
        return "events";
    }
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
      ...(this.workspace ? { workspace: this.workspace } : {}),
    };
  }
}

/** A summary for a run known only from the store (another Runner process, or evicted from memory). */
export function rowToSummary(row: DispatchRow, workspace?: RunWorkspace): RunSummary {
  return {
    ...(workspace ? { workspace } : {}),
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
