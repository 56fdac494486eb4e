import { MAX_NOTIFICATIONS_PER_STATEMENT } from "../state/engine.js";

/**
 * A change waits this long before its notice's statement leaves. The notice is the other instances'
 * safety net (a following instance gets the update pushed, cluster/run-push.ts); sent at once, its statement,
 * PostgreSQL delivering it and every listening instance reading it compete for the CPU with the wake-up
 * of this instance's own observers and with the push. Measured in the cluster wake-up bench: the observer
 * on the holder woke about 0.7 ms sooner at p50 with the notice held back 10 ms (docs/benchmarks.md).
 */
export const NOTICE_DELAY_MS = 10;

/**
 * Notices of changed runs to the other instances (design §14: `webcodex_run_changes`), one statement in
 * flight at a time: a change is held NOTICE_DELAY_MS, and the changes told while it is held or while a
 * statement is out wait, each run's newest payload only, and go together in the next statement (at most
 * MAX_NOTIFICATIONS_PER_STATEMENT; more wait for the one after). A notice only says "this run changed up
 * to here; catch up": the receiver fetches whatever is newest, so one notice after the last change covers
 * every change before it. Without this, every `run.update` on the holder is one statement on the state
 * pool — in the cluster fan-out bench, as many as the observers' reads.
 */
export class ChangeNotices {
  /** Payloads waiting for the next statement, by run id (a run's newest one). */
  readonly #waiting = new Map<string, string>();
  /** Runs whose notice is in the statement in flight. */
  #sending: string[] = [];
  #timer: NodeJS.Timeout | null = null;
  #closed = false;

  /** `send` tells the others of the runs' changes; its failure goes to `onError` (a notice is a hint, never retried). */
  constructor(
    private readonly send: (payloads: string[]) => Promise<void>,
    private readonly onError: (runIds: readonly string[], err: unknown) => void,
    private readonly delayMs = NOTICE_DELAY_MS,
  ) {}

  /** Runs whose notice is out or waiting (bounded by the runs changed while one statement is out). */
  get inFlight(): number {
    return this.#sending.length + this.#waiting.size;
  }

  /** `runId` changed: tell the others after NOTICE_DELAY_MS, or with the next statement when one is out. */
  tell(runId: string, payload: string): void {
    if (this.#closed) return;
    this.#waiting.set(runId, payload);
    if (this.#sending.length > 0 || this.#timer !== null) return;
    this.#timer = setTimeout(() => {
      this.#timer = null;
      void this.#drain();
    }, this.delayMs);
    this.#timer.unref();
  }

  /** The instance stops: what waits is dropped (the others catch up from the database as they would anyway). */
  close(): void {
    this.#closed = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    this.#waiting.clear();
  }

  async #drain(): Promise<void> {
    while (this.#waiting.size > 0 && !this.#closed) {
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
