/**
 * Durations (ms, consecutive laps from just before the spawn) of the setup
 * stages of one dispatched run, logged once as "run timings" when the prompt
 * has been written: spawn (process start, recording its group, wiring the
 * connection), initialize, session_new, config (sequencing and its record),
 * barrier_commit (the durable dispatch barrier), prompt_write (until the
 * session/prompt request was handed to the child's stdin). scripts/bench
 * reads that line; the turn only reports when a stage is done.
 */
export interface RunTimings {
  spawn: number;
  initialize: number;
  session_new: number;
  config: number;
  barrier_commit: number;
  prompt_write: number;
}

export type TimedStage = keyof RunTimings;

/** Laps of one run's setup; `done` is true once the last stage (prompt_write) was lapped. */
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

  lap(stage: TimedStage): void {
    const now = performance.now();
    this.timings[stage] = Math.round((now - this.#stageStart) * 100) / 100;
    this.#stageStart = now;
  }
}
