/**
 * Per-run event ring (design §4.5): bounded by count and serialized bytes,
 * `seq` monotonic from 1, oldest events dropped first. Readers page with
 * `read(afterSeq, max)`, and `waitFor` resolves as soon as something newer
 * exists — no polling.
 */
import { RING_MAX_BYTES, RING_MAX_EVENTS, type RunEvent, type RunEventBody } from "@webcodex/protocol";

export interface RingLimits {
  maxEvents: number;
  maxBytes: number;
}

export interface RingRead {
  events: RunEvent[];
  /** More events newer than the last returned one are in the ring. */
  hasMore: boolean;
}

export class EventRing {
  readonly #limits: RingLimits;
  readonly #now: () => Date;
  /** Events in seq order; `#head` is the index of the oldest live one (compacted lazily). */
  #events: RunEvent[] = [];
  #sizes: number[] = [];
  #head = 0;
  #bytes = 0;
  #lastSeq = 0;
  #closed = false;
  #waiters: Array<() => void> = [];
  /** The last `at` and the millisecond it was formatted for. */
  #atMs = Number.NaN;
  #atText = "";

  constructor(limits: Partial<RingLimits> = {}, now: () => Date = () => new Date()) {
    this.#limits = { maxEvents: limits.maxEvents ?? RING_MAX_EVENTS, maxBytes: limits.maxBytes ?? RING_MAX_BYTES };
    this.#now = now;
  }

  /** Highest seq ever assigned (0 = none). */
  get lastSeq(): number {
    return this.#lastSeq;
  }

  /** Lowest seq still held; lastSeq + 1 when empty. */
  get oldestSeq(): number {
    const oldest = this.#events[this.#head];
    return oldest ? oldest.seq : this.#lastSeq + 1;
  }

  get size(): number {
    return this.#events.length - this.#head;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /** Assign seq and `at`, append, evict the oldest beyond the bounds, wake readers. */
  push(body: RunEventBody): RunEvent {
    if (this.#closed) throw new Error("event ring is closed");
    // The body's fields, then seq and at (as `{ ...body, seq, at }`, which V8 builds several times slower).
    const event = Object.assign({}, body) as RunEvent;
    event.seq = this.#lastSeq + 1;
    event.at = this.#at();
    this.#lastSeq = event.seq;
    const size = Buffer.byteLength(JSON.stringify(event), "utf8");
    this.#events.push(event);
    this.#sizes.push(size);
    this.#bytes += size;
    while (this.size > 1 && (this.size > this.#limits.maxEvents || this.#bytes > this.#limits.maxBytes)) {
      this.#bytes -= this.#sizes[this.#head] ?? 0;
      this.#head++;
    }
    if (this.#head > 1024 && this.#head * 2 > this.#events.length) {
      this.#events = this.#events.slice(this.#head);
      this.#sizes = this.#sizes.slice(this.#head);
      this.#head = 0;
    }
    this.#wake();
    return event;
  }

  /** `now()` as ISO 8601, formatted once per millisecond (a burst pushes many events in the same one). */
  #at(): string {
    const now = this.#now();
    const ms = now.getTime();
    if (ms !== this.#atMs) {
      this.#atText = now.toISOString();
      this.#atMs = ms;
    }
    return this.#atText;
  }

  /** Events with seq > afterSeq still held, oldest first, at most `max`. */
  read(afterSeq: number, max: number): RingRead {
    const first = Math.max(afterSeq + 1, this.oldestSeq);
    const start = this.#head + (first - this.oldestSeq);
    const end = Math.min(this.#events.length, start + Math.max(0, max));
    const events = start < end ? this.#events.slice(start, end) : [];
    return { events, hasMore: end < this.#events.length };
  }

  /** Serialized size of the events `read` would return, for callers packing frames. */
  sizeOf(event: RunEvent): number {
    const index = this.#head + (event.seq - this.oldestSeq);
    return this.#sizes[index] ?? Buffer.byteLength(JSON.stringify(event), "utf8");
  }

  /** Resolves once lastSeq > afterSeq, the ring closes, or `signal` aborts. */
  waitFor(afterSeq: number, signal?: AbortSignal): Promise<void> {
    if (this.#lastSeq > afterSeq || this.#closed || signal?.aborted) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        signal?.removeEventListener("abort", done);
        resolve();
      };
      signal?.addEventListener("abort", done, { once: true });
      this.#waiters.push(done);
    });
  }

  /** No more events (after the terminal one); wakes every waiter. */
  close(): void {
    this.#closed = true;
    this.#wake();
  }

  get closed(): boolean {
    return this.#closed;
  }

  #wake(): void {
    if (this.#waiters.length === 0) return;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const wake of waiters) wake();
  }
}
