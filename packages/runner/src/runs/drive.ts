/**
 * A run driven from admission to its end (design §4.2–4.5): its worktree (runs/workspace.ts) when it has one,
 * then its ACP turn (acp/turn.ts), its change recorded, and its end (runs/settle.ts: terminal, then cleanup).
 *
 * The turn is an async generator of what the run records (acp/turn.ts `TurnEvent`); the driver consumes it and
 * writes the record, the timings (runs/timings.ts, fed by the turn's milestones) and, with the Terminal it returns,
 * the terminal state. Pushes to the link go through runs/updates.ts. A cancel asked before the turn exists waits
 * on the run (`requestCancel`) and is handed to the turn when it starts.
 */
import { FAILURE_SUMMARIES, type FailureKind } from "@webcodex/protocol";
import { type CancelReason, lost, notStarted, type Terminal } from "../acp/terminal.js";
import { AcpTurn, type TurnOptions } from "../acp/turn.js";
import type { Logger } from "../logger.js";
import type { Run } from "./record.js";
import type { RunStartRequest } from "./service.js";
import type { RunSettler } from "./settle.js";
import { StageClock } from "./timings.js";
import type { RunUpdates } from "./updates.js";
import type { RunWorkspaces } from "./workspace.js";

/** Faults that close() itself causes by closing connections and killing trees. */
const CUT_BY_SHUTDOWN: ReadonlySet<FailureKind> = new Set(["io_error", "provider_exited", "stdout_closed"]);

export interface RunDriverOptions {
  /** What every run's turn is built with (acp/turn.ts). */
  turnOptions: TurnOptions;
  workspaces: RunWorkspaces;
  updates: RunUpdates;
  settler: RunSettler;
  logger: Logger;
  /** Whether the Runner is stopping (RunManager.close): a turn started now stops, a fault it causes is a restart's. */
  closing: () => boolean;
}

/** What a start hands the run's turn besides the run itself. */
export interface TurnInput {
  prompt: string;
  callerConfig: RunStartRequest["config"];
  baseRef: string | undefined;
}

/** Idempotent: the first reason sticks; session/cancel is sent at most once (the turn's `cancel`). */
export function requestCancel(run: Run, reason: CancelReason): void {
  if (run.terminal) return;
  // A worktree run's checkout comes before its turn: a cancel meanwhile waits for the turn (see RunDriver.drive).
  if (run.turn) run.turn.cancel(reason);
  else run.pendingCancel ??= reason;
}

export class RunDriver {
  readonly #o: RunDriverOptions;

  constructor(options: RunDriverOptions) {
    this.#o = options;
  }

  /** The run's workspace, its turn, its change recorded, then its end. Never rejects. */
  async drive(run: Run, input: TurnInput): Promise<void> {
    let terminal: Terminal;
    const clock = new StageClock();
    try {
      // A shared-tree run enters the turn without an await, so its agent is forked (and recorded) before start()
      // answers, as always; a worktree run's checkout comes first.
      const ownWorkspace = run.project.workspace === "worktree" || input.baseRef !== undefined;
      const workspaceEnd = ownWorkspace ? await this.#o.workspaces.prepare(run, input.baseRef) : null;
      if (workspaceEnd) terminal = workspaceEnd;
      else {
        if (ownWorkspace) this.#o.updates.touch(run);
        terminal = await this.#runTurn(run, input, clock);
      }
    } catch (error) {
      this.#o.logger.error({ run_id: run.run_id, err_name: (error as Error)?.name, stage: run.stage }, "turn failed");
      terminal = run.dispatched ? lost("io_error", FAILURE_SUMMARIES.io_error) : notStarted("io_error", run.stage);
    }
    // A shutdown (close()) cut the turn: record it as a restart would (store/recovery.ts), not as an agent fault.
    const closing = this.#o.closing();
    const cut = terminal.failure_kind !== null && CUT_BY_SHUTDOWN.has(terminal.failure_kind);
    if (closing && cut && terminal.execution_state === "not_started") {
      terminal = notStarted("runner_restarted", run.stage);
    } else if (closing && cut && terminal.state === "lost") {
      terminal = lost("transport_lost", FAILURE_SUMMARIES.transport_lost);
    }
    if (run.workspace) await this.#o.workspaces.recordChange(run);
    this.#o.settler.finish(run, terminal);
    await this.#o.settler.cleanup(run, clock.timings);
  }

  /** A run refused after admission, before anything is spawned: terminal at once, nothing to clean up. */
  async endBeforeSpawn(run: Run, terminal: Terminal): Promise<void> {
    this.#o.settler.finish(run, terminal);
    await this.#o.settler.cleanup(run, new StageClock().timings);
  }

  /** The turn: its events are recorded as they come, and it resolves to its terminal. */
  async #runTurn(run: Run, input: TurnInput, clock: StageClock): Promise<Terminal> {
    const turn = new AcpTurn(this.#o.turnOptions, {
      runId: run.run_id,
      project: run.project,
      cwd: run.cwd,
      continueSessionId: run.continueSessionId,
      warm: run.warm,
      agent: run.agent,
      runAs: run.runAs,
      timeoutSecs: run.timeoutSecs,
      prompt: input.prompt,
      callerConfig: input.callerConfig,
      ring: run.ring,
    });
    run.turn = turn;
    if (run.pendingCancel !== null) turn.cancel(run.pendingCancel);
    if (this.#o.closing()) turn.stopping();
    let terminal: Terminal;
    // The first next() runs the turn up to its spawn synchronously (see RunManager.start).
    const events = turn.events();
    for (let next = await events.next(); ; next = await events.next()) {
      if (next.done) {
        terminal = next.value;
        break;
      }
      const event = next.value;
      if (event.kind === "milestone") {
        clock.lap(event.stage, event.at);
        if (event.stage === "prompt_write") {
          this.#o.logger.info({ run_id: run.run_id, timings_ms: clock.timings }, "run timings");
          this.#o.workspaces.dispatched(run);
        }
        continue;
      }
      const changed = run.recordTurnEvent(event);
      if (changed === "state") this.#o.updates.touch(run);
      else if (changed === "events") this.#o.updates.schedulePush(run);
    }
    return terminal;
  }
}
