/**
 * Bounded per-run mirror of a Runner's event ring, fed by `run.update` and
 * `run.sync`. Events are held contiguously by seq; a gap is reported to the
 * caller (who re-syncs with `run.sync(after_seq)`); waiters are woken on
 * every change — no polling.
 */
import {
  isTerminalState,
  RING_MAX_BYTES,
  RING_MAX_EVENTS,
  type RunEvent,
  type RunSummary,
  utf8Length,
} from "@webcodex/protocol";

/** The newest tool step of a run: its `tool_activity` event's title, kind and status. */
export interface ToolStep {
  title: string;
  tool_kind: string;
  status: string;
}

/** At most this many mirrors are held at once (least recently used idle ones are evicted). */
export const MIRRORS_MAX_COUNT = 256;
/** Global budget of event bytes (UTF-8 JSON) over all mirrors; idle mirrors are evicted LRU beyond it. */
export const MIRRORS_MAX_TOTAL_BYTES = 256 * 1024 * 1024;

export class RunMirror {
  /** agent_instance_id of the Runner process whose event seqs this mirror holds. */
  instance: string | null = null;
  summary: RunSummary | null = null;
  /** Highest contiguous seq known (events up to here were held at some point). */
  lastSeq = 0;
  /** True once a run.sync (or the admitting run.start) established the baseline for `instance`. */
  synced = false;
  /** Counts `unsync` calls: a catch-up whose answer left before one of them catches up again. */
  unsyncs = 0;
  /** The Runner (`instance`) answered with the run's tombstone: it holds none of its events any more. */
  pruned = false;
  /** The in-flight catch-up, if any (owned by the caller that drives syncs). */
  syncing: Promise<void> | null = null;
  version = 0;
  /**
   * The last update another instance pushed here that this mirror took whole (cluster/following.ts `applyPushed`):
   * that instance's id and its number of the update. A notice of that update or an earlier one needs no
   * catch-up. Cleared by `reset`.
   */
  pushed: { holder: string; update: number } | null = null;
  /** When an observer last waited on this mirror (epoch ms; 0: never). */
  lastWaitAt = 0;
  /** The newest `tool_activity` this mirror appended (kept when held events are dropped), or null. */
  lastToolStep: ToolStep | null = null;
  #events: RunEvent[] = [];
  #sizes: number[] = [];
  #bytes = 0;
  readonly #waiters = new Set<() => void>();

  constructor(
    readonly runId: string,
    readonly maxEvents = RING_MAX_EVENTS,
    readonly maxBytes = RING_MAX_BYTES,
    /** Told every change of held bytes (the owning MirrorSet keeps a global total). */
    readonly onBytes: (delta: number) => void = () => undefined,
  ) {}

  /** UTF-8 bytes of the held events' JSON. */
  get bytes(): number {
    return this.#bytes;
  }
  /** Nobody waits on it and no catch-up is in flight: it may be evicted (and rebuilt by run.sync later). */
  get idle(): boolean {
    return this.#waiters.size === 0 && this.syncing === null;
  }

  #clear(): void {
    this.#events = [];
    this.#sizes = [];
    this.#setBytes(0);
  }

  #setBytes(n: number): void {
    const delta = n - this.#bytes;
    this.#bytes = n;
    if (delta !== 0) this.onBytes(delta);
  }

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
    this.#clear();
    this.lastSeq = 0;
    this.synced = false;
    this.pruned = false;
    this.pushed = null;
    this.#changed();
  }

  /** The Runner may hold more than this mirror (a change elsewhere, a link lost): the next observe catches up. */
  unsync(): void {
    this.synced = false;
    this.unsyncs += 1;
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
    const size = utf8Length(JSON.stringify(e));
    let bytes = this.#bytes + size;
    this.#events.push(e);
    this.#sizes.push(size);
    this.lastSeq = e.seq;
    if (e.kind === "tool_activity") this.lastToolStep = { title: e.title, tool_kind: e.tool_kind, status: e.status };
    while (this.#events.length > this.maxEvents || (bytes > this.maxBytes && this.#events.length > 1)) {
      this.#events.shift();
      bytes -= this.#sizes.shift() ?? 0;
    }
    this.#setBytes(bytes);
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
      this.#clear();
      this.lastSeq = first.seq - 1;
    }
    for (const e of events) {
      if (e.seq === this.lastSeq + 1) this.#append(e);
    }
    if (!hasMore && summary.last_seq > this.lastSeq && (events.length === 0 || summary.oldest_seq > this.lastSeq)) {
      // Nothing more is held by the Runner: the remainder is lost history.
      this.#clear();
      this.lastSeq = summary.last_seq;
    }
    this.synced = true;
    this.#changed();
    return hasMore && events.length > 0;
  }

  /**
   * When the run began and ended, on the Runner's clock: its admission (the summary's `created_at`) and its
   * terminal event's `at`; each null while unknown (no summary yet; not ended, or the end is not held).
   */
  get times(): { started_at: string | null; ended_at: string | null } {
    const last = this.#events.at(-1);
    return {
      started_at: this.summary?.created_at ?? null,
      ended_at: this.terminal && last?.kind === "terminal" ? last.at : null,
    };
  }

  /** Held events with seq > afterSeq, oldest first. */
  eventsAfter(afterSeq: number): RunEvent[] {
    const first = this.firstSeq;
    const start = Math.max(0, afterSeq + 1 - first);
    return this.#events.slice(start);
  }

  /** Serialized UTF-8 size of an event `eventsAfter` returned, measured once when it was appended. */
  sizeOf(e: RunEvent): number {
    const i = e.seq - this.firstSeq;
    return this.#events[i] === e ? (this.#sizes[i] ?? 0) : utf8Length(JSON.stringify(e));
  }

  /** Resolves on the next change after `sinceVersion`, after `ms`, or when `signal` aborts. */
  waitForChange(sinceVersion: number, ms: number, signal?: AbortSignal): Promise<void> {
    this.lastWaitAt = Date.now();
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

/**
 * The set of mirrors, bounded in count and in total bytes: beyond either, the least recently used
 * idle mirrors (no waiters, no catch-up in flight) are evicted, terminal or not. The Runner's ring
 * is the source of truth; an evicted mirror is rebuilt with run.sync when next needed.
 */
export class MirrorSet {
  readonly #map = new Map<string, RunMirror>();
  #bytes = 0;
  constructor(
    readonly maxMirrors = MIRRORS_MAX_COUNT,
    readonly maxTotalBytes = MIRRORS_MAX_TOTAL_BYTES,
    readonly mirrorLimits: { maxEvents?: number; maxBytes?: number } = {},
  ) {}

  /** UTF-8 bytes held over all mirrors. */
  get totalBytes(): number {
    return this.#bytes;
  }
  get size(): number {
    return this.#map.size;
  }

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
      const created: RunMirror = new RunMirror(
        runId,
        this.mirrorLimits.maxEvents,
        this.mirrorLimits.maxBytes,
        (delta) => {
          if (this.#map.get(runId) !== created) return; // evicted: no longer counted
          this.#bytes += delta;
          if (delta > 0 && this.#bytes > this.maxTotalBytes) this.#evict(created);
        },
      );
      m = created;
      this.#map.set(runId, m);
      this.#evict(m);
    }
    return m;
  }

  values(): IterableIterator<RunMirror> {
    return this.#map.values();
  }

  /** Evict LRU idle mirrors (never `keep`, the one being used) until within both bounds. */
  #evict(keep: RunMirror): void {
    for (const [id, m] of this.#map) {
      if (this.#map.size <= this.maxMirrors && this.#bytes <= this.maxTotalBytes) return;
      if (m === keep || !m.idle) continue;
      this.#map.delete(id);
      this.#bytes -= m.bytes;
    }
  }
}
