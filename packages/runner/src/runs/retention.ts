/**
 * Which terminal runs stay in memory with their event rings after their
 * process tree is gone. Bounded by count (maxRetainedRuns) and by the bytes
 * of all retained rings together (RETAINED_RINGS_MAX_BYTES); beyond either
 * the oldest leave memory first, and their summaries are answered from the
 * store (an observer behind them is told history_lost). Never evicted: the
 * run just retained, and a run whose terminal write failed (it is pinned
 * until `persist` succeeds — only memory knows its terminal state).
 */
import type { Run } from "./record.js";

/**
 * Budget of the serialized event bytes held by the rings of retained terminal
 * runs, all together (each ring alone may hold RING_MAX_BYTES, 8 MiB; 64 of
 * them would be 512 MiB).
 */
export const RETAINED_RINGS_MAX_BYTES = 64 * 1024 * 1024;
/** Terminal runs kept in memory with their rings (default of maxRetainedRuns). */
export const MAX_RETAINED_RUNS = 64;

export interface RetentionOptions {
  /** The manager's map of runs held in memory; evicted runs are deleted from it. */
  runs: Map<string, Run>;
  maxRuns?: number;
  maxRingBytes?: number;
  /** Write a run's pending terminal state; false when it still failed (the run stays pinned). */
  persist: (run: Run) => boolean;
}

export class RunRetention {
  readonly #runs: Map<string, Run>;
  readonly #maxRuns: number;
  readonly #maxRingBytes: number;
  readonly #persist: (run: Run) => boolean;
  /** Retained run ids, oldest first. */
  readonly #order: string[] = [];

  constructor(options: RetentionOptions) {
    this.#runs = options.runs;
    this.#maxRuns = options.maxRuns ?? MAX_RETAINED_RUNS;
    this.#maxRingBytes = options.maxRingBytes ?? RETAINED_RINGS_MAX_BYTES;
    this.#persist = options.persist;
  }

  /** Keep a settled run; evict the oldest beyond the bounds. */
  retain(run: Run): void {
    this.#order.push(run.run_id);
    let ringBytes = 0;
    for (const id of this.#order) ringBytes += this.#runs.get(id)?.ring.bytes ?? 0;
    const pinned: string[] = [];
    while (this.#order.length > this.#maxRuns || (ringBytes > this.#maxRingBytes && this.#order.length > 1)) {
      const evicted = this.#order.shift();
      if (evicted === undefined) break;
      const old = this.#runs.get(evicted);
      ringBytes -= old?.ring.bytes ?? 0;
      if (old && !this.#persist(old)) pinned.push(evicted);
      else this.#runs.delete(evicted);
    }
    if (pinned.length > 0) this.#order.unshift(...pinned);
  }
}
