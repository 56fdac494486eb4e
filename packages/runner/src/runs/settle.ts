/**
 * How a run ends (design §4.4–4.5): its terminal is written durably first — a write that fails keeps it pinned in
 * memory (`unsavedTerminal`) and is retried by retention and at close — then projected: the ring's terminal event,
 * the run's state, a push. Then cleanup: the agent's process tree ended (its identity kept in the store when
 * something survived SIGKILL), the diagnostics file written, the run_as user released and swept, the capacity slot
 * freed and the run retained; only then is the run settled.
 *
 * Failpoint (test-only SIGKILL, see failpoints.ts): after_terminal_before_projection.
 */
import type { Terminal } from "../acp/terminal.js";
import type { FailpointName } from "../failpoints.js";
import type { Logger } from "../logger.js";
import type { AgentChild } from "../process/spawn.js";
import type { UserPool } from "../process/user-pool.js";
import type { DispatchStore } from "../store/types.js";
import { writeDiagnostics } from "./diagnostics.js";
import type { KeptAgent, KeptAgents } from "./kept-agents.js";
import type { Run } from "./record.js";
import type { RunRetention } from "./retention.js";
import type { RunTimings } from "./timings.js";
import type { RunUpdates } from "./updates.js";

export interface RunSettlerOptions {
  store: DispatchStore;
  logger: Logger;
  /** Grace of each cleanup step: stdin EOF → SIGTERM → SIGKILL. */
  graceMs: number;
  /** Where each run's diagnostics file goes; none written when undefined. */
  diagnosticsDir: string | undefined;
  updates: RunUpdates;
  users: UserPool;
  /** The runs holding a capacity slot; a run leaves it here once its tree is gone. */
  active: Set<Run>;
  retention: RunRetention;
  failpoint: (name: FailpointName) => void;
  now: () => Date;
}

/** Where a run's agent may wait for a follow-up (runs/kept-agents.ts); set once the pool exists. */
export type KeepPool = Pick<KeptAgents, "accepting" | "keep">;

export class RunSettler {
  readonly #store: DispatchStore;
  readonly #log: Logger;
  readonly #graceMs: number;
  readonly #diagnosticsDir: string | undefined;
  readonly #updates: RunUpdates;
  readonly #users: UserPool;
  readonly #active: Set<Run>;
  readonly #retention: RunRetention;
  readonly #failpoint: (name: FailpointName) => void;
  readonly #now: () => Date;
  /** Kept agents (`[acp] keep_agent_alive_secs`); null: none are kept. */
  kept: KeepPool | null = null;

  constructor(options: RunSettlerOptions) {
    this.#store = options.store;
    this.#log = options.logger;
    this.#graceMs = options.graceMs;
    this.#diagnosticsDir = options.diagnosticsDir;
    this.#updates = options.updates;
    this.#users = options.users;
    this.#active = options.active;
    this.#retention = options.retention;
    this.#failpoint = options.failpoint;
    this.#now = options.now;
  }

  /** The run's terminal: written durably, then projected (the ring's terminal event, the run's state, a push). */
  finish(run: Run, t: Terminal): void {
    if (run.terminal) return;
    const ignored = run.normalizer?.ignoredUpdates ?? 0;
    const lastSeq = run.ring.lastSeq + 1; // the terminal event below
    run.unsavedTerminal = {
      state: t.state,
      execution_state: t.execution_state,
      stop_reason: t.stop_reason,
      failure_kind: t.failure_kind,
      recovery_kind: t.recovery_kind,
      message: t.message,
      ignored_updates: ignored,
      last_seq: lastSeq,
    };
    saveTerminal(run, this.#store, this.#log);
    this.#failpoint("after_terminal_before_projection");
    run.ring.push({
      kind: "terminal",
      state: t.state,
      execution_state: t.execution_state,
      stop_reason: t.stop_reason,
      failure_kind: t.failure_kind,
      message: t.message,
    });
    run.phase = "terminal";
    run.state = t.state;
    run.execution_state = t.execution_state;
    run.stop_reason = t.stop_reason;
    run.failure_kind = t.failure_kind;
    run.recovery_kind = t.recovery_kind;
    run.message = t.message;
    run.updated_at = this.#now().toISOString();
    run.ring.close();
    this.#log.info(
      {
        run_id: run.run_id,
        state: t.state,
        execution_state: t.execution_state,
        stop_reason: t.stop_reason,
        failure_kind: t.failure_kind,
        ignored_updates: ignored,
        refused_permissions: run.turn?.refusedPermissions ?? 0,
        events: lastSeq,
      },
      "run terminal",
    );
    this.#updates.push(run);
  }

  /** The run's tree ended, its pool user released and swept, its slot freed, the run retained; then settled. */
  async cleanup(run: Run, timings: RunTimings): Promise<void> {
    if (run.warm !== null && run.child === null) {
      // A follow-up that ended before adopting its parent's kept agent (aborted setup): that agent ends here.
      const warm = run.warm;
      run.warm = null;
      await this.stopKept(warm);
    }
    const agent = run.child;
    if (agent !== null && this.#keep(run)) {
      // Its process, connection and pool user are the kept agent's now: nothing of them ends here. Its
      // diagnostics are the turn's (stage, timings, the stderr tail so far; no exit: the agent lives on).
      this.#writeDiagnostics(run, agent, timings);
      run.child = null;
      run.conn = null;
      this.#active.delete(run);
      this.#retention.retain(run);
      run.markSettled();
      return;
    }
    try {
      run.conn?.close();
      const child = run.child;
      if (child) {
        const result = await child.terminateTree(this.#graceMs);
        this.#log.info(
          {
            run_id: run.run_id,
            escalation: result.escalation,
            survivors: result.survivors,
            exit_code: child.exit?.code ?? null,
            exit_signal: child.exit?.signal ?? null,
            stderr_bytes: child.stderrBytes,
            dropped_responses: run.conn?.droppedResponses ?? 0,
          },
          "agent process tree cleaned up",
        );
        this.#writeDiagnostics(run, child, timings);
        if (result.survivors > 0) {
          // Keep the group's identity in the store: the next start's reaper must still find it.
          this.#log.error({ run_id: run.run_id, survivors: result.survivors }, "agent processes survived SIGKILL");
        } else {
          try {
            this.#store.clearChild(run.run_id);
          } catch (error) {
            this.#log.error({ run_id: run.run_id, err_name: (error as Error)?.name }, "clearing the child failed");
          }
        }
      }
    } finally {
      run.child = null;
      run.conn = null;
      // Whatever of the run left its process group dies here, before the user can serve another run.
      if (run.runAs) await this.#users.release(run.runAs, run.run_id);
      this.#active.delete(run);
      this.#retention.retain(run);
      run.markSettled();
    }
  }

  /**
   * Keep the run's agent for a follow-up (runs/kept-agents.ts) when the run completed in the project's own tree
   * with its agent alive and the pool takes it. A worktree run's follow-up works in a checkout of its own (another
   * cwd), so its agent is never kept.
   */
  #keep(run: Run): boolean {
    const kept = this.kept;
    const { child, conn } = run;
    const session = run.turn?.session ?? null;
    if (kept === null || !kept.accepting || child === null || conn === null || session === null) return false;
    if (run.state !== "completed" || run.workspace !== null || run.cwd !== run.project.root) return false;
    return kept.keep({
      runId: run.run_id,
      providerId: run.agent.id,
      projectId: run.project.id,
      tenant: run.tenant,
      runAs: run.runAs,
      cwd: run.cwd,
      child,
      conn,
      sessionId: session.sessionId,
      configOptions: session.configOptions,
    });
  }

  /** A kept agent stopped (its time ended, the Runner stops, its slot is needed): a run's cleanup, done late. */
  async stopKept(kept: KeptAgent): Promise<void> {
    try {
      kept.conn.close();
      const result = await kept.child.terminateTree(this.#graceMs);
      this.#log.info(
        { run_id: kept.runId, escalation: result.escalation, survivors: result.survivors },
        "kept agent process tree cleaned up",
      );
      if (result.survivors > 0) {
        this.#log.error({ run_id: kept.runId, survivors: result.survivors }, "agent processes survived SIGKILL");
      } else {
        try {
          this.#store.clearChild(kept.runId);
        } catch (error) {
          this.#log.error({ run_id: kept.runId, err_name: (error as Error)?.name }, "clearing the child failed");
        }
      }
    } finally {
      if (kept.runAs) await this.#users.release(kept.runAs, kept.runId);
    }
  }

  /** The run's diagnostics file (redacted stderr tail, exit, stage, timings); logged for a failed or lost run. */
  #writeDiagnostics(run: Run, child: AgentChild, timings: RunTimings): void {
    const dir = this.#diagnosticsDir;
    if (dir === undefined) return;
    try {
      const redact = (text: string) => run.redactor?.redact(text) ?? text;
      const file = writeDiagnostics(dir, {
        run_id: run.run_id,
        state: run.state,
        execution_state: run.execution_state,
        failure_kind: run.failure_kind,
        stop_reason: run.stop_reason,
        message: run.message,
        stage: run.stage,
        timings_ms: timings,
        exit_code: child.exit?.code ?? null,
        exit_signal: child.exit?.signal ?? null,
        stderr_bytes: child.stderrBytes,
        stderr_tail: redact(child.stderrTail()),
        written_at: this.#now().toISOString(),
      });
      if (run.state === "failed" || run.state === "lost") {
        this.#log.warn(
          { run_id: run.run_id, state: run.state, failure_kind: run.failure_kind, diagnostics: file },
          "run failed; agent stderr tail and timings in the diagnostics file",
        );
      }
    } catch (error) {
      this.#log.error({ run_id: run.run_id, err_name: (error as Error)?.name }, "writing diagnostics failed");
    }
  }
}

/**
 * Write the run's terminal state durably. On failure the run keeps it as
 * unsavedTerminal: pinned in memory (the durable row still says non-terminal,
 * so only memory answers right) until a later retry succeeds.
 */
export function saveTerminal(run: Run, store: DispatchStore, log: Logger): boolean {
  const update = run.unsavedTerminal;
  if (!update) return true;
  try {
    store.markTerminal(run.run_id, update);
  } catch (error) {
    log.error(
      { run_id: run.run_id, err_name: (error as Error)?.name },
      "recording the terminal state failed; the run stays pinned in memory and the write is retried",
    );
    return false;
  }
  if (run.phase === "terminal") log.info({ run_id: run.run_id }, "terminal state recorded on retry");
  run.unsavedTerminal = null;
  return true;
}
