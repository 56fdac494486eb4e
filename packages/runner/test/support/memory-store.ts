/** A tiny in-memory DispatchStore for unit tests that do not exercise durability. */
import type { EffectiveConfigEntry } from "@webcodex/protocol";
import type { DispatchRow, DispatchStore, TerminalUpdate } from "../../src/dispatch-store-types.js";

export class MemoryStore implements DispatchStore {
  readonly storeId = "st_memory_store_for_tests";
  readonly rows = new Map<string, DispatchRow>();
  readonly barriers: string[] = [];
  closed = false;

  get(runId: string): DispatchRow | undefined {
    return this.rows.get(runId);
  }
  listForInventory(limit: number): DispatchRow[] {
    return [...this.rows.values()].reverse().slice(0, limit);
  }
  admit(row: Omit<DispatchRow, "phase" | "updated_at" | "child_pgid" | "child_start_time">): DispatchRow {
    if (this.rows.has(row.run_id)) throw new Error("exists");
    const full: DispatchRow = {
      ...row,
      phase: "admitted",
      updated_at: row.created_at,
      child_pgid: null,
      child_start_time: null,
    };
    this.rows.set(row.run_id, full);
    return full;
  }
  #row(runId: string): DispatchRow {
    const row = this.rows.get(runId);
    if (!row) throw new Error("unknown run");
    return row;
  }
  markSetup(runId: string, child: { pgid: number; startTime: string } | null): void {
    const row = this.#row(runId);
    row.phase = "setup";
    row.child_pgid = child?.pgid ?? null;
    row.child_start_time = child?.startTime ?? null;
  }
  recordEffectiveConfig(runId: string, config: EffectiveConfigEntry[]): void {
    this.#row(runId).effective_config = config;
  }
  markDispatchBarrier(runId: string): void {
    const row = this.#row(runId);
    row.phase = "dispatch_barrier";
    row.state = "running";
    row.execution_state = "started";
    this.barriers.push(runId);
  }
  markTerminal(runId: string, update: TerminalUpdate): void {
    Object.assign(this.#row(runId), update, { phase: "terminal" });
  }
  clearChild(runId: string): void {
    const row = this.#row(runId);
    row.child_pgid = null;
    row.child_start_time = null;
  }
  close(): void {
    this.closed = true;
  }
}
