/**
 * Notices of changed runs to the other instances (design §14: `webcodex_run_changes`), at most one per run
 * in flight: a change told while that run's notice is still being sent is folded into one more notice,
 * sent when the first has gone. A notice only says "this run changed; catch up": the receiver fetches
 * whatever is newest, so one notice after the last change covers every change before it. Without this,
 * every `run.update` on the holder is one statement on the state pool — half of what the holder sent
 * per update in the cluster fan-out bench, where the pool filled (docs/benchmarks.md).
 */
export class ChangeNotices {
  /** Runs whose notice is in flight, with the payload of a change told meanwhile (null: none). */
  readonly #inFlight = new Map<string, string | null>();

  /** `send` tells the others of one run; its failure goes to `onError` (a notice is a hint, never retried). */
  constructor(
    private readonly send: (runId: string, payload: string) => Promise<void>,
    private readonly onError: (runId: string, err: unknown) => void,
  ) {}

  /** Notices in flight right now (bounded by the runs with updates at the same time). */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /**
   * `runId` changed: tell the others now, or right after the notice of it already in flight — then with the
   * payload of the last change told meanwhile (a payload may name the change, runs/runs.ts).
   */
  tell(runId: string, payload: string): void {
    if (this.#inFlight.has(runId)) {
      this.#inFlight.set(runId, payload);
      return;
    }
    this.#inFlight.set(runId, null);
    void this.#send(runId, payload);
  }

  async #send(runId: string, first: string): Promise<void> {
    let payload = first;
    for (;;) {
      try {
        await this.send(runId, payload);
      } catch (err) {
        this.onError(runId, err);
      }
      const next = this.#inFlight.get(runId);
      if (next === null || next === undefined) {
        this.#inFlight.delete(runId);
        return;
      }
      payload = next;
      this.#inFlight.set(runId, null);
    }
  }
}
