/**
 * The run core's "updated" event: every `run.update` of a Runner linked to this instance, once its record and
 * mirror took it (runs/runs.ts `#applyUpdate`). What else follows a run subscribes here — the cluster's wake-ups
 * of observers on other instances (cluster/wake-ups.ts) — so the run core names none of them.
 */
import type { RunEvent, RunSummary } from "@webcodex/protocol";

/** One `run.update` applied here. */
export interface RunUpdated {
  runId: string;
  runnerId: string;
  /** The agent instance whose seqs the events carry (the Runner process this instance's link is to). */
  agentInstanceId: string;
  run: RunSummary;
  events: RunEvent[];
}

export type RunUpdatedListener = (update: RunUpdated) => void;

/** Subscriptions to the "updated" event, called in order, synchronously, on the path that applied the update. */
export class RunUpdates {
  readonly #listeners = new Set<RunUpdatedListener>();

  /** Call `listener` with every update applied from now on; the answer ends the subscription. */
  subscribe(listener: RunUpdatedListener): () => void {
    const own = (update: RunUpdated) => listener(update);
    this.#listeners.add(own);
    return () => {
      this.#listeners.delete(own);
    };
  }

  emit(update: RunUpdated): void {
    for (const listener of this.#listeners) listener(update);
  }
}
