/**
 * Bounded per-run mirror of a Runner's event ring, fed by `run.update` and
 * `run.sync`. Events are held contiguously by seq; a gap is reported to the
 * caller (who re-syncs with `run.sync(after_seq)`); waiters are woken on
 * every change — no polling.
 */
import { isTerminalState, RING_MAX_BYTES, RING_MAX_EVENTS, type RunEvent, type RunSummary } from "@webcodex/protocol";

export class RunMirror {
  /** agent_instance_id of the Runner process whose event seqs this mirror holds. */
  instance: string | null = null;
  summary: RunSummary | null = null;
  /** Highest contiguous seq known (events up to here were held at some point). */
  lastSeq = 0;
  /** True once a run.sync (or the admitting run.start) established the baseline for `instance`. */
  synced = false;
  /** The in-flight catch-up, if any (owned by the caller that drives syncs). */
  syncing: Promise<void> | null = null;
  version = 0;
  #events: RunEvent[] = [];
  #sizes: number[] = [];
  #bytes = 0;
  readonly #waiters = new Set<() => void>();

  constructor(
    readonly runId: string,
    readonly maxEvents = RING_MAX_EVENTS,
    readonly maxBytes = RING_MAX_BYTES,
  ) {}

  /** Lowest seq this mirror can still return. */
  get firstSeq(): number {
    return this.#events[0]?.seq ?? this.lastSeq + 1;
  }
  get size(): number {
    return this.#events.length;
  }
  get terminal(): boolean {
    return this.summary !== null && isTerminalState(this.summary.state);
  }

  /** Start over for a new Runner instance (its seqs are unrelated to the old ones). */
  reset(instance: string): void {
    this.instance = instance;
    this.#events = [];
    this.#sizes = [];
    this.#bytes = 0;
    this.lastSeq = 0;
    this.synced = false;
    this.#changed();
  }

  /** A baseline known to be empty (a run the Runner just admitted). */
  markSynced(summary: RunSummary): void {
    this.summary = summary;
    this.synced = true;
    if (this.#events.length === 0 && summary.last_seq > this.lastSeq && summary.oldest_seq > summary.last_seq) {
      this.lastSeq = summary.last_seq;
    }
    this.#changed();
  }

  #append(e: RunEvent): void {
    const size = JSON.stringify(e).length;
    this.#events.push(e);
    this.#sizes.push(size);
    this.#bytes += size;
    this.lastSeq = e.seq;
    while (this.#events.length > this.maxEvents || (this.#bytes > this.maxBytes && this.#events.length > 1)) {
      this.#events.shift();
      this.#bytes -= this.#sizes.shift() ?? 0;
    }
  }

  /** Apply a pushed update. Returns true when the mirror is behind and needs a run.sync(after_seq = lastSeq). */
  applyUpdate(summary: RunSummary, events: readonly RunEvent[]): boolean {
    this.summary = summary;
    let gap = !this.synced;
    if (!gap) {
      for (const e of events) {
        if (e.seq <= this.lastSeq) continue;
        if (e.seq !== this.lastSeq + 1) {
          gap = true;
          break;
        }
        this.#append(e);
      }
      if (summary.last_seq > this.lastSeq) gap = true;
    }
    this.#changed();
    return gap;
  }

  /** Apply a run.sync result for after_seq. Returns true when more must be fetched. */
  applySync(afterSeq: number, summary: RunSummary, events: readonly RunEvent[], hasMore: boolean): boolean {
    this.summary = summary;
    const first = events[0];
    if (first && first.seq > this.lastSeq + 1 && afterSeq === this.lastSeq) {
      // The Runner no longer holds the events in between: history before `first` is gone.
      this.#events = [];
      this.#sizes = [];
      this.#bytes = 0;
      this.lastSeq = first.seq - 1;
    }
    for (const e of events) {
      if (e.seq === this.lastSeq + 1) this.#append(e);
    }
    if (!hasMore && summary.last_seq > this.lastSeq && (events.length === 0 || summary.oldest_seq > this.lastSeq)) {
      // Nothing more is held by the Runner: the remainder is lost history.
      this.#events = [];
      this.#sizes = [];
      this.#bytes = 0;
      this.lastSeq = summary.last_seq;
    }
    this.synced = true;
    this.#changed();
    return hasMore && events.length > 0;
  }

  /** Held events with seq > afterSeq, oldest first. */
  eventsAfter(afterSeq: number): RunEvent[] {
    const first = this.firstSeq;
    const start = Math.max(0, afterSeq + 1 - first);
    return this.#events.slice(start);
  }

  /** Resolves on the next change after `sinceVersion`, after `ms`, or when `signal` aborts. */
  waitForChange(sinceVersion: number, ms: number, signal?: AbortSignal): Promise<void> {
    if (this.version !== sinceVersion || ms <= 0 || signal?.aborted) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#waiters.delete(done);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#waiters.add(done);
      signal?.addEventListener("abort", done, { once: true });
    });
  }

  /** Wake waiters without a data change (e.g. the Runner went offline). */
  touch(): void {
    this.#changed();
  }

  #changed(): void {
    this.version++;
    for (const w of [...this.#waiters]) w();
  }
}

/** The set of mirrors, bounded: terminal mirrors are evicted oldest-touched first. */
export class MirrorSet {
  readonly #map = new Map<string, RunMirror>();
  constructor(readonly maxMirrors = 1000) {}

  get(runId: string): RunMirror | undefined {
    const m = this.#map.get(runId);
    if (m) {
      this.#map.delete(runId);
      this.#map.set(runId, m);
    }
    return m;
  }

  getOrCreate(runId: string): RunMirror {
    let m = this.get(runId);
    if (!m) {
      m = new RunMirror(runId);
      this.#map.set(runId, m);
      this.#evict();
    }
    return m;
  }

  values(): IterableIterator<RunMirror> {
    return this.#map.values();
  }

  #evict(): void {
    if (this.#map.size <= this.maxMirrors) return;
    for (const [id, m] of this.#map) {
      if (this.#map.size <= this.maxMirrors) return;
      if (m.terminal) this.#map.delete(id);
    }
  }
}
