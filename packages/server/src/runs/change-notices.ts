import { MAX_NOTIFICATIONS_PER_STATEMENT } from "../state/engine.js";

/**
 * Notices of changed runs to the other instances (design §14: `webcodex_run_changes`), one statement in
 * flight at a time: the changes told while it is out wait, each run's newest payload only, and go together
 * in the next statement (at most MAX_NOTIFICATIONS_PER_STATEMENT; more wait for the one after). A notice only
 * says "this run changed up to here; catch up": the receiver fetches whatever is newest, so one notice after
 * the last change covers every change before it. Without this, every `run.update` on the holder is one
 * statement on the state pool — in the cluster fan-out bench, as many as the observers' reads.
 */
export class ChangeNotices {
  /** Payloads waiting for the next statement, by run id (a run's newest one). */
  readonly #waiting = new Map<string, string>();
  /** Runs whose notice is in the statement in flight. */
  #sending: string[] = [];

  /** `send` tells the others of the runs' changes; its failure goes to `onError` (a notice is a hint, never retried). */
  constructor(
    private readonly send: (payloads: string[]) => Promise<void>,
    private readonly onError: (runIds: readonly string[], err: unknown) => void,
  ) {}

  /** Runs whose notice is out or waiting (bounded by the runs changed while one statement is out). */
  get inFlight(): number {
    return this.#sending.length + this.#waiting.size;
  }

  /** `runId` changed: tell the others now, or with the next statement when one is out. */
  tell(runId: string, payload: string): void {
    this.#waiting.set(runId, payload);
    if (this.#sending.length === 0) void this.#drain();
  }

  async #drain(): Promise<void> {
    while (this.#waiting.size > 0) {
      const batch = [...this.#waiting].slice(0, MAX_NOTIFICATIONS_PER_STATEMENT);
      for (const [runId] of batch) this.#waiting.delete(runId);
      this.#sending = batch.map(([runId]) => runId);
      try {
        await this.send(batch.map(([, payload]) => payload));
      } catch (err) {
        this.onError(this.#sending, err);
      }
    }
    this.#sending = [];
  }
}
