/**
 * What observers read of the runs (design §4.5): a run held in memory answers from its record and ring, any other
 * from its durable row (with its workspace, when it has one); a pruned run from its tombstone. `sync` pages the
 * ring (at most MAX_EVENTS_PER_SYNC events), `inventory` lists the runs holding a slot first, then the newest rows
 * (at most MAX_INVENTORY_RUNS), newest first.
 */
import { MAX_EVENTS_PER_SYNC, MAX_INVENTORY_RUNS, type RunSummary, type RunTombstone } from "@webcodex/protocol";
import { wireTombstone } from "../store/tombstone.js";
import type { DispatchRow, DispatchStore } from "../store/types.js";
import { type Run, rowToSummary } from "./record.js";
import type { RunSyncResult } from "./service.js";
import type { RunWorkspaces } from "./workspace.js";

export interface RunViewsOptions {
  store: DispatchStore;
  /** The runs this process holds in memory. */
  runs: ReadonlyMap<string, Run>;
  /** The runs holding a capacity slot. */
  active: ReadonlySet<Run>;
  workspaces: RunWorkspaces;
}

export class RunViews {
  readonly #store: DispatchStore;
  readonly #runs: ReadonlyMap<string, Run>;
  readonly #active: ReadonlySet<Run>;
  readonly #workspaces: RunWorkspaces;

  constructor(options: RunViewsOptions) {
    this.#store = options.store;
    this.#runs = options.runs;
    this.#active = options.active;
    this.#workspaces = options.workspaces;
  }

  /** The run's summary, from memory or from its row; null for an id never admitted (or pruned). */
  summaryOf(runId: string): RunSummary | null {
    const run = this.#runs.get(runId);
    if (run) return run.summary();
    const row = this.#store.get(runId);
    return row ? this.rowSummary(row) : null;
  }

  /** A summary from the store, with the run's workspace when it has one. */
  rowSummary(row: DispatchRow): RunSummary {
    return rowToSummary(row, this.#workspaces.summary(row.run_id));
  }

  sync(runId: string, afterSeq: number, maxEvents: number): RunSyncResult | null {
    const run = this.#runs.get(runId);
    if (run) {
      run.normalizer?.flushStreamed();
      const { events, hasMore } = run.ring.read(afterSeq, Math.min(maxEvents, MAX_EVENTS_PER_SYNC));
      return { run: run.summary(), events, has_more: hasMore };
    }
    const row = this.#store.get(runId);
    return row ? { run: this.rowSummary(row), events: [], has_more: false } : null;
  }

  tombstone(runId: string): RunTombstone | null {
    if (this.#runs.has(runId)) return null;
    const tomb = this.#store.tombstone(runId);
    return tomb ? wireTombstone(tomb) : null;
  }

  inventory(): RunSummary[] {
    const out: RunSummary[] = [];
    const seen = new Set<string>();
    for (const run of this.#active) {
      out.push(run.summary());
      seen.add(run.run_id);
    }
    for (const row of this.#store.listForInventory(MAX_INVENTORY_RUNS)) {
      if (out.length >= MAX_INVENTORY_RUNS) break;
      if (seen.has(row.run_id)) continue;
      seen.add(row.run_id);
      out.push(this.#runs.get(row.run_id)?.summary() ?? this.rowSummary(row));
    }
    return out.sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
  }
}
