/**
 * Log lines for refused unauthenticated requests (401 on `/mcp` and `/runner`), at most
 * REFUSAL_LOG_PER_SECOND per remote address per second. A flood from one address cannot fill the
 * disk or drown other lines: the rest are counted, and the next line logged for that address
 * carries `suppressed` (how many were left out since the previous one). The hub also keys one by
 * runner id for refused authenticated hellos (`link_in_use`), with one line per runner per
 * LINK_REFUSAL_LOG_WINDOW_MS (link/hub.ts), forgotten when that runner's hello is accepted. Addresses tracked are
 * bounded by REFUSAL_LOG_MAX_ADDRESSES (past it, the table starts over — a flood from many
 * addresses is logged at most that many lines per second plus one).
 * With `summarize`, a window in which refusals were counted and not logged ends with one line of its own
 * carrying that count (`suppressed`), so a flood that stops inside one window is still reported with its size:
 * at most `perSecond` + 1 lines per key and window (cluster requests, cluster/peer-auth.ts; console keys).
 */
import type { Logger } from "pino";

export const REFUSAL_LOG_PER_SECOND = 5;
export const REFUSAL_LOG_MAX_ADDRESSES = 4096;
const WINDOW_MS = 1000;

interface Window {
  start: number;
  logged: number;
  suppressed: number;
  /** The summary line of this window, when it is to be written (`summarize`). */
  summary: NodeJS.Timeout | null;
  message: string;
}

export class RefusalLog {
  readonly #windows = new Map<string, Window>();

  constructor(
    private readonly logger: Logger,
    /** Lines per key per window (the name says the default window). */
    private readonly perSecond = REFUSAL_LOG_PER_SECOND,
    private readonly now: () => number = Date.now,
    private readonly windowMs = WINDOW_MS,
    private readonly summarize = false,
  ) {}

  /** Start `key` over (its next refusal is logged at once); returns how many of its refusals were not logged. */
  forget(key: string): number {
    const w = this.#windows.get(key);
    const suppressed = w?.suppressed ?? 0;
    if (w?.summary) clearTimeout(w.summary);
    this.#windows.delete(key);
    return suppressed;
  }

  /** Log one refusal from `remote` (fields must be secret-free), or count it as suppressed. */
  refused(remote: string, fields: Record<string, unknown>, message: string): void {
    const t = this.now();
    let w = this.#windows.get(remote);
    if (w === undefined) {
      if (this.#windows.size >= REFUSAL_LOG_MAX_ADDRESSES) this.#clear();
      w = { start: t, logged: 0, suppressed: 0, summary: null, message };
      this.#windows.set(remote, w);
    } else if (t - w.start >= this.windowMs) {
      w.start = t;
      w.logged = 0;
    }
    if (w.logged >= this.perSecond) {
      w.suppressed++;
      w.message = message;
      if (this.summarize && w.summary === null) this.#summarizeAtEnd(remote, w);
      return;
    }
    w.logged++;
    const suppressed = w.suppressed;
    w.suppressed = 0;
    this.logger.warn({ remote, ...fields, ...(suppressed > 0 ? { suppressed } : {}) }, message);
  }

  /** At the end of `w`'s window: one line with the count of its refusals not logged, if any. */
  #summarizeAtEnd(remote: string, w: Window): void {
    w.summary = setTimeout(
      () => {
        w.summary = null;
        if (w.suppressed === 0 || this.#windows.get(remote) !== w) return;
        const suppressed = w.suppressed;
        w.suppressed = 0;
        this.logger.warn({ remote, suppressed }, `${w.message} (${suppressed} more in this window)`);
      },
      Math.max(0, w.start + this.windowMs - this.now()),
    );
    w.summary.unref();
  }

  #clear(): void {
    for (const w of this.#windows.values()) if (w.summary) clearTimeout(w.summary);
    this.#windows.clear();
  }
}
