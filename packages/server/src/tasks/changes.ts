/**
 * The task changes others may follow (design §18: the `task.*` webhooks), told to a listener inside the
 * transaction that makes the change, so whatever the listener writes commits with it or not at all:
 *
 * - `attempt_expired`: the current attempt's lease ran out and this is the first time a transaction of this
 *   Server noticed it for that claim's generation (the expiry sweep, or a renewal, new attempt or close that met
 *   the expired lease first); the attempt row records the generation announced, so it is told once.
 * - `closed`: `close_agent_task` closed the task (not a repeated close).
 *
 * The rows are handed as they are; a listener picks its fields (the instruction and title are task data and
 * never leave through it: webhooks/events.ts builds bodies from ids, states and counts).
 */
import type { Logger } from "pino";
import type { StateQueries } from "../state/engine.js";
import type { AttemptRow, TaskRow, TaskStore } from "./store.js";

/** How often the expiry sweep looks for attempts whose lease ran out unannounced. */
export const EXPIRY_SWEEP_INTERVAL_MS = 2000;
/** Expired attempts one sweep announces at most (the rest wait for the next sweep). */
export const MAX_EXPIRIES_PER_SWEEP = 100;

export type TaskChange =
  | { kind: "attempt_expired"; task: TaskRow; attempt: AttemptRow; run_id: string | null }
  | { kind: "closed"; task: TaskRow; attempts: number; runs: number };

export type TaskChangeListener = (change: TaskChange, tx: StateQueries) => Promise<void>;

export interface TaskAnnouncerOptions {
  tasks: TaskStore;
  log: Logger;
  now: () => number;
  /** Without one, nothing is announced, recorded or swept. */
  listener: TaskChangeListener | undefined;
}

/** Tells the listener of task changes (tasks/service.ts calls it inside its transactions) and sweeps expiries. */
export class TaskAnnouncer {
  readonly #opts: TaskAnnouncerOptions;
  #timer: NodeJS.Timeout | null = null;
  #sweeping: Promise<void> | null = null;

  constructor(opts: TaskAnnouncerOptions) {
    this.#opts = opts;
  }

  /** Start the expiry sweep, every EXPIRY_SWEEP_INTERVAL_MS (one at a time). */
  start(): void {
    if (this.#opts.listener === undefined || this.#timer !== null) return;
    this.#timer = setInterval(() => {
      if (this.#sweeping !== null) return;
      this.#sweeping = this.sweep()
        .then(() => undefined)
        .catch((err: unknown) => this.#opts.log.warn({ err: (err as Error).message }, "attempt expiry sweep failed"))
        .finally(() => {
          this.#sweeping = null;
        });
    }, EXPIRY_SWEEP_INTERVAL_MS);
    this.#timer.unref();
  }

  async stop(): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    await this.#sweeping;
  }

  /** Tell the listener of `change`, in `tx` (the transaction that makes it). */
  async tell(change: TaskChange, tx: StateQueries): Promise<void> {
    await this.#opts.listener?.(change, tx);
  }

  /**
   * When `attempt` is the task's current claim, its lease ran out and that expiry (for its generation) was not
   * announced yet: record it as announced and tell the listener, in `tx` (which locked the task). True when told.
   */
  async expiry(task: TaskRow, attempt: AttemptRow | undefined, tx: StateQueries): Promise<boolean> {
    if (this.#opts.listener === undefined || !attempt) return false;
    if (attempt.attempt_id !== task.current_attempt_id || attempt.state !== "active") return false;
    if (Number(attempt.lease_expires_ms) > this.#opts.now()) return false;
    const generation = Number(attempt.controller_generation);
    if (Number(attempt.expiry_announced_generation) >= generation) return false;
    await this.#opts.tasks.markExpiryAnnounced(attempt.attempt_id, generation, tx);
    const runId = (await this.#opts.tasks.binding(attempt.attempt_id, tx))?.run_id ?? null;
    await this.tell({ kind: "attempt_expired", task, attempt, run_id: runId }, tx);
    return true;
  }

  /**
   * Announce the lease expiries nobody met yet (at most MAX_EXPIRIES_PER_SWEEP), each decided under its task's
   * lock (`lockTask`), so that of several instances sweeping at once one announces it. Returns how many.
   */
  async sweep(): Promise<number> {
    if (this.#opts.listener === undefined) return 0;
    const { tasks } = this.#opts;
    const due = await tasks.unannouncedExpiries(this.#opts.now(), MAX_EXPIRIES_PER_SWEEP);
    let announced = 0;
    for (const { task_id, attempt_id } of due) {
      announced += await tasks.transaction(async (tx) => {
        const task = await tasks.lockTask(task_id, tx);
        if (task?.state !== "open") return 0;
        return (await this.expiry(task, await tasks.attempt(attempt_id, tx), tx)) ? 1 : 0;
      });
    }
    return announced;
  }
}
