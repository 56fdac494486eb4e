/**
 * When streamed message/reasoning text becomes an event (design §4.5
 * coalescing). Adaptive: a chunk arriving while the stream is quiet is
 * flushed at the next setImmediate — after everything read from the same
 * stdout chunk has been handled, so one read still becomes one event — and
 * an observer waiting on the run wakes at once. Only while a flood is going
 * on (the previous text flush was less than FLOOD_GAP_MS ago) does pending
 * text wait up to COALESCE_MS for more chunks, so a burst still becomes few
 * events (each also bounded by the 4 KiB text bound in the normalizer).
 */

/** Longest time streamed text waits for more chunks while a flood is going on. */
export const COALESCE_MS = 100;
/** A text flush less than this long ago means the stream is flooding: hold new text up to COALESCE_MS. */
export const FLOOD_GAP_MS = 20;

export interface TextPacerOptions {
  /** Flush the pending text (the normalizer's flushStreamed). */
  flush: () => void;
  /** Monotonic ms clock (default performance.now). */
  now?: () => number;
  holdMs?: number;
  floodGapMs?: number;
}

export class TextPacer {
  readonly #flush: () => void;
  readonly #now: () => number;
  readonly #holdMs: number;
  readonly #floodGapMs: number;
  #lastFlushAt = Number.NEGATIVE_INFINITY;
  #timer: NodeJS.Timeout | null = null;
  #immediate: NodeJS.Immediate | null = null;
  #stopped = false;

  constructor(options: TextPacerOptions) {
    this.#flush = options.flush;
    this.#now = options.now ?? (() => performance.now());
    this.#holdMs = options.holdMs ?? COALESCE_MS;
    this.#floodGapMs = options.floodGapMs ?? FLOOD_GAP_MS;
  }

  /**
   * New text (or a held event) is pending: arrange one flush (no-op while one
   * is already arranged). `delayMs` > 0 asks for a flush no sooner than that;
   * the flush callback re-asks if it fired early for what it holds.
   */
  schedule(delayMs = 0): void {
    if (this.#stopped || this.#timer !== null || this.#immediate !== null) return;
    if (delayMs > 0) {
      this.#timer = setTimeout(this.#fire, delayMs);
    } else if (this.#now() - this.#lastFlushAt < this.#floodGapMs) {
      this.#timer = setTimeout(this.#fire, this.#holdMs);
    } else {
      this.#immediate = setImmediate(this.#fire);
    }
  }

  /** A text event left the normalizer by another path (the size bound, another kind of event, a sync). */
  noteFlush(): void {
    this.#lastFlushAt = this.#now();
  }

  /** The run ended: drop any arranged flush (the final flush is the owner's). */
  stop(): void {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    if (this.#immediate !== null) clearImmediate(this.#immediate);
    this.#timer = null;
    this.#immediate = null;
  }

  readonly #fire = (): void => {
    this.#timer = null;
    this.#immediate = null;
    if (this.#stopped) return;
    this.#lastFlushAt = this.#now();
    this.#flush();
  };
}
