/**
 * A run's updates to whoever listens (the link): its summary and every event newer than the last push, in
 * frame-sized batches (@webcodex/protocol batches.ts). A state change is pushed at most one setImmediate later,
 * so a burst of changes is one push; the terminal is pushed at once.
 */
import { eventBatches, type RunEvent, type RunSummary } from "@webcodex/protocol";
import type { Logger } from "../logger.js";
import type { Run } from "./record.js";
import type { RunUpdateListener } from "./service.js";

export class RunUpdates {
  readonly #listeners = new Set<RunUpdateListener>();
  readonly #log: Logger;
  readonly #now: () => Date;

  constructor(options: { logger: Logger; now: () => Date }) {
    this.#log = options.logger;
    this.#now = options.now;
  }

  onUpdate(listener: RunUpdateListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** State changed: push soon (at most one setImmediate later). */
  touch(run: Run): void {
    run.updated_at = this.#now().toISOString();
    this.schedulePush(run);
  }

  schedulePush(run: Run): void {
    if (run.pushScheduled) return;
    run.pushScheduled = true;
    setImmediate(() => {
      run.pushScheduled = false;
      this.push(run);
    });
  }

  /** Send the summary and every event newer than the last push, in frame-sized batches (@webcodex/protocol batches.ts). */
  push(run: Run): void {
    const summary = run.summary();
    const { events } = run.ring.read(run.pushedSeq, Number.MAX_SAFE_INTEGER);
    run.pushedSeq = run.ring.lastSeq;
    if (this.#listeners.size === 0) return;
    for (const batch of eventBatches(events, { sizeOf: (e) => run.ring.sizeOf(e) + 1 })) this.#emit(summary, batch);
  }

  #emit(summary: RunSummary, events: readonly RunEvent[]): void {
    for (const listener of this.#listeners) {
      try {
        listener(summary, events);
      } catch (error) {
        this.#log.error({ run_id: summary.run_id, err_name: (error as Error)?.name }, "update listener threw");
      }
    }
  }
}
