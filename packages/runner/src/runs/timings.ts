/**
 * Durations (ms, consecutive laps from just before the spawn) of the setup
 * stages of one dispatched run, logged once as "run timings" when the prompt
 * has been written: spawn (process start, recording its group, wiring the
 * connection), initialize, session_new, config (sequencing and its record),
 * barrier_commit (the durable dispatch barrier), prompt_write (until the
 * session/prompt request was handed to the child's stdin). scripts/bench
 * reads that line; the turn only reports when a stage is done (its
 * `milestone` events, acp/turn.ts, stamped where the stage ended).
 */
import type { TimedStage } from "../acp/turn-events.js";

export type RunTimings = Record<TimedStage, number>;

/** Laps of one run's setup. */
export class StageClock {
  readonly timings: RunTimings = {
    spawn: 0,
    initialize: 0,
    session_new: 0,
    config: 0,
    barrier_commit: 0,
    prompt_write: 0,
  };
  #stageStart = performance.now();

  /** `stage` ended at `at` (performance.now() where it ended; default now). */
  lap(stage: TimedStage, at: number = performance.now()): void {
    this.timings[stage] = Math.round((at - this.#stageStart) * 100) / 100;
    this.#stageStart = at;
  }
}
