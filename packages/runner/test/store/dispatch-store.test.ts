import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it, vi } from "vitest";
import { SCHEMA_VERSION, type SqliteDispatchStore } from "../../src/store/dispatch-store.js";
import { openDispatchStore, STORE_DB_FILE, STORE_MARKER_FILE, StoreRefusedError } from "../../src/store/open.js";
import { RECOVERED_LOST_MESSAGE, recoverStore } from "../../src/store/recovery.js";

const dirs: string[] = [];
const stores: SqliteDispatchStore[] = [];
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "wc-store-"));
  dirs.push(dir);
  return dir;
}
function open(stateDir: string, newStore = false): SqliteDispatchStore {
  const { store } = openDispatchStore({ stateDir, newStore });
  stores.push(store);
  return store;
}
afterEach(() => {
  vi.restoreAllMocks();
  for (const s of stores.splice(0)) s.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

let counter = 0;
function runId(): string {
  counter++;
  return `wc_agent_run_${"a".repeat(24)}${String.fromCharCode(97 + Math.floor(counter / 26))}${String.fromCharCode(97 + (counter % 26))}`;
}

function admission(id: string, created_at = new Date().toISOString()) {
  return {
    run_id: id,
    intent_fingerprint: "f".repeat(64),
    project_id: "demo",
    provider_id: "fake",
    provider_instance_id: "prov_instance_0000001",
    agent_instance_id: "agent_instance_000001",
    created_at,
  };
}

const completed = {
  state: "completed",
  execution_state: "completed",
  stop_reason: "end_turn",
  failure_kind: null,
  recovery_kind: "none",
  message: null,
  ignored_updates: 2,
  last_seq: 7,
} as const;

describe("dispatch store", () => {
  it("round-trips a run through every phase", () => {
    const store = open(tempDir());
    const id = runId();
    const admitted = store.admit(admission(id));
    expect(admitted).toMatchObject({
      ...admission(id, admitted.created_at),
      phase: "admitted",
      state: "starting",
      execution_state: "not_started",
      stop_reason: null,
      failure_kind: null,
      recovery_kind: "wait",
      message: null,
      effective_config: [],
      ignored_updates: 0,
      last_seq: 0,
      updated_at: admitted.created_at,
    });
    expect(admitted.child_pgid).toBeNull();
    store.markSetup(id, { pgid: 4242, startTime: "123456" });
    store.recordEffectiveConfig(id, [
      { id: "model", value: "m1" },
      { id: "fast", value: true },
    ]);
    store.markDispatchBarrier(id);
    let row = store.get(id)!;
    expect(row).toMatchObject({ phase: "dispatch_barrier", state: "running", execution_state: "started" });
    expect(row.effective_config).toEqual([
      { id: "model", value: "m1" },
      { id: "fast", value: true },
    ]);
    expect(row).toMatchObject({ child_pgid: 4242, child_start_time: "123456" });
    expect(store.acpSessionOf(id)).toBeNull();
    store.recordAcpSession(id, "agent-session-1");
    store.markTerminal(id, completed);
    store.clearChild(id);
    // The ACP session id outlives the terminal write (a later run may continue it, design §17).
    expect(store.acpSessionOf(id)).toBe("agent-session-1");
    expect(store.acpSessionOf("wc_agent_run_unknown")).toBeNull();
    row = store.get(id)!;
    expect(row).toMatchObject({ ...completed, phase: "terminal", child_pgid: null, child_start_time: null });
    expect(Object.keys(row).sort()).toEqual(
      [
        "run_id",
        "intent_fingerprint",
        "project_id",
        "provider_id",
        "provider_instance_id",
        "agent_instance_id",
        "phase",
        "state",
        "execution_state",
        "stop_reason",
        "failure_kind",
        "recovery_kind",
        "message",
        "effective_config",
        "ignored_updates",
        "last_seq",
        "created_at",
        "updated_at",
        "child_pgid",
        "child_start_time",
      ].sort(),
    );
  });

  it("rejects a duplicate admission and out-of-order phase changes", () => {
    const store = open(tempDir());
    const id = runId();
    store.admit(admission(id));
    expect(() => store.admit(admission(id))).toThrow();
    store.markDispatchBarrier(id);
    expect(() => store.markDispatchBarrier(id)).toThrow(/phase dispatch_barrier/);
    expect(() => store.markSetup(id, null)).toThrow();
    store.markTerminal(id, completed);
    expect(() => store.markTerminal(id, completed)).toThrow(/phase terminal/);
    expect(() => store.markDispatchBarrier(runId())).toThrow(/not in the store/);
  });

  it("opens with WAL and synchronous=FULL", () => {
    const store = open(tempDir());
    expect(store.pragma("journal_mode")).toBe("wal");
    expect(store.pragma("synchronous")).toBe(2); // FULL
    expect(store.pragma("user_version")).toBe(SCHEMA_VERSION);
  });

  it("fsyncs the child's identity, the barrier and the terminal state; admission and config commit without one", () => {
    const store = open(tempDir());
    const id = runId();
    // The synchronous level in force when each write statement runs (each is its own commit, or inside
    // admit's transaction, whose level is the one at its commit).
    const probe = new Database(":memory:");
    const statementProto = Object.getPrototypeOf(probe.prepare("SELECT 1")) as { run: (...a: unknown[]) => unknown };
    probe.close();
    const run = statementProto.run;
    const writes: { sql: string; level: unknown }[] = [];
    vi.spyOn(statementProto, "run").mockImplementation(function (
      this: Database.Statement,
      ...args: unknown[]
    ): unknown {
      const sql = this.source.trim().split(/\s+/).slice(0, 2).join(" ");
      if (/^(INSERT|UPDATE)/.test(sql))
        writes.push({ sql, level: this.database.pragma("synchronous", { simple: true }) });
      return run.apply(this, args);
    });
    store.admit(admission(id));
    store.markSetup(id, { pgid: 4242, startTime: "12345" });
    store.ensureDurable(id); // nothing to do: markSetup's commit was fsync'd
    store.recordEffectiveConfig(id, [{ id: "mode", value: "agent" }]);
    store.markDispatchBarrier(id);
    store.markTerminal(id, completed);
    // FULL = 2 (fsync before the call returns), NORMAL = 1: admission, child, config, barrier, terminal.
    expect(writes.map((w) => w.level)).toEqual([1, 2, 1, 2, 2]);
    expect(writes[0]?.sql).toBe("INSERT INTO");
    // An admission followed by no FULL commit: ensureDurable makes one.
    const other = runId();
    store.admit(admission(other));
    store.ensureDurable(other);
    store.ensureDurable(other); // and only one
    expect(writes.slice(5).map((w) => `${w.sql}@${w.level}`)).toEqual(["INSERT INTO@1", "UPDATE runs@2"]);
    // The connection is back at FULL, and the setup records are committed.
    expect(store.pragma("synchronous")).toBe(2);
    expect(store.get(id)).toMatchObject({
      phase: "terminal",
      child_pgid: 4242,
      effective_config: [{ id: "mode", value: "agent" }],
    });
  });

  it("keeps its store_id and rows across reopen, migrations are idempotent", () => {
    const dir = tempDir();
    const first = open(dir);
    const id = runId();
    first.admit(admission(id));
    const storeId = first.storeId;
    expect(storeId).toMatch(/^[A-Za-z0-9_-]{16,64}$/);
    first.close();
    for (let i = 0; i < 2; i++) {
      const again = open(dir);
      expect(again.storeId).toBe(storeId);
      expect(again.pragma("user_version")).toBe(SCHEMA_VERSION);
      expect(again.get(id)?.phase).toBe("admitted");
      again.close();
    }
    const marker = JSON.parse(readFileSync(join(dir, STORE_MARKER_FILE), "utf8"));
    expect(marker.store_id).toBe(storeId);
  });

  it("lists active rows first, then the newest terminal rows, bounded", () => {
    const store = open(tempDir());
    const ids = [runId(), runId(), runId(), runId()];
    for (const id of ids) store.admit(admission(id));
    store.markTerminal(ids[0]!, completed);
    store.markTerminal(ids[1]!, completed);
    const all = store.listForInventory(10).map((r) => r.run_id);
    expect(all.slice(0, 2).sort()).toEqual([ids[2], ids[3]].sort());
    expect(all).toHaveLength(4);
    expect(store.listForInventory(3)).toHaveLength(3);
  });

  it("prunes old and excess terminal rows but never active or lost ones", () => {
    const store = open(tempDir());
    const old = "2020-01-01T00:00:00.000Z";
    const active = runId();
    const lost = runId();
    const oldDone = runId();
    const withChild = runId();
    store.admit(admission(active, old));
    store.admit(admission(lost, old));
    store.markDispatchBarrier(lost);
    store.markTerminal(lost, { ...completed, state: "lost", execution_state: "outcome_unknown", stop_reason: null });
    store.admit(admission(oldDone, old));
    store.markTerminal(oldDone, completed);
    store.admit(admission(withChild, old));
    store.markSetup(withChild, { pgid: 1, startTime: "1" });
    store.markTerminal(withChild, completed);
    const recent = [runId(), runId(), runId()];
    for (const id of recent) {
      store.admit(admission(id));
      store.markTerminal(id, completed);
    }
    const future = new Date(Date.now() + 1000);
    // Age: "old" rows are those updated before now-7d; use a clock 10 days ahead for the old ones only
    // by pruning by count first (keeps 2 newest terminal), then by age with a far-future clock.
    const first = store.prune({ retainDays: 7, retainMax: 2, now: future });
    expect(first.byAge).toBe(0); // all updated just now
    expect(first.byCount).toBe(2); // 4 prunable terminal rows → keep 2
    const second = store.prune({ retainDays: 7, retainMax: 1000, now: new Date(Date.now() + 30 * 86_400_000) });
    expect(second.byAge).toBe(2);
    expect(store.get(active)?.phase).toBe("admitted");
    expect(store.get(lost)?.state).toBe("lost");
    expect(store.get(withChild)?.child_pgid).toBe(1);
    expect(store.get(oldDone)).toBeUndefined();
  });
});

describe("startup recovery", () => {
  it("closes pre-barrier rows as failed/not_started and barrier rows as lost/outcome_unknown", () => {
    const store = open(tempDir());
    const [admitted, setup, barrier, done] = [runId(), runId(), runId(), runId()];
    for (const id of [admitted, setup, barrier, done]) store.admit(admission(id));
    store.markSetup(setup, { pgid: 99999, startTime: "1" });
    store.markSetup(barrier, null);
    store.markDispatchBarrier(barrier);
    store.markTerminal(done, completed);
    const before = store.get(done);

    const recovered = recoverStore(store);
    expect(recovered.map((r) => r.run_id).sort()).toEqual([admitted, setup, barrier].sort());
    for (const id of [admitted, setup]) {
      expect(store.get(id)).toMatchObject({
        phase: "terminal",
        state: "failed",
        execution_state: "not_started",
        failure_kind: "runner_restarted",
        recovery_kind: "none",
      });
    }
    expect(store.get(setup)?.child_pgid).toBe(99999); // kept for the reaper
    expect(store.get(barrier)).toMatchObject({
      phase: "terminal",
      state: "lost",
      execution_state: "outcome_unknown",
      failure_kind: "transport_lost",
      recovery_kind: "reconcile",
      message: RECOVERED_LOST_MESSAGE,
    });
    expect(store.get(done)).toEqual(before);
    expect(recoverStore(store)).toEqual([]);
  });
});

describe("store identity and refusal", () => {
  function refusal(fn: () => unknown): StoreRefusedError {
    try {
      fn();
    } catch (error) {
      if (error instanceof StoreRefusedError) return error;
      throw error;
    }
    throw new Error("expected a refusal");
  }

  it("refuses a deleted database when the marker says one existed", () => {
    const dir = tempDir();
    open(dir).close();
    rmSync(join(dir, STORE_DB_FILE));
    const error = refusal(() => open(dir));
    expect(error.reason).toBe("missing");
    expect(error.exitCode).toBe(3);
    expect(error.message).toContain(join(dir, STORE_DB_FILE));
    expect(error.message).toContain("--new-store");
  });

  it("refuses a truncated or overwritten database without modifying it", () => {
    for (const content of [Buffer.alloc(0), Buffer.from("this is not a database at all ".repeat(200))]) {
      const dir = tempDir();
      open(dir).close();
      const db = join(dir, STORE_DB_FILE);
      writeFileSync(db, content);
      const error = refusal(() => open(dir));
      expect(["not_a_store", "corrupt"]).toContain(error.reason);
      expect(error.exitCode).toBe(3);
      expect(readFileSync(db).equals(content)).toBe(true);
    }
  });

  it("refuses a half-truncated database (integrity or open failure)", () => {
    const dir = tempDir();
    const store = open(dir);
    for (let i = 0; i < 200; i++) store.admit(admission(runId()));
    store.checkpoint();
    store.close();
    const db = join(dir, STORE_DB_FILE);
    const bytes = readFileSync(db);
    writeFileSync(db, bytes.subarray(0, Math.floor(bytes.length / 2)));
    const error = refusal(() => open(dir));
    expect(["integrity", "corrupt"]).toContain(error.reason);
  });

  it("refuses a database replaced by another store, and an unreadable marker", () => {
    const dir = tempDir();
    const other = tempDir();
    open(dir).close();
    open(other).close();
    copyFileSync(join(other, STORE_DB_FILE), join(dir, STORE_DB_FILE));
    expect(refusal(() => open(dir)).reason).toBe("mismatch");

    const third = tempDir();
    open(third).close();
    writeFileSync(join(third, STORE_MARKER_FILE), "{not json");
    const error = refusal(() => open(third));
    expect(error.reason).toBe("marker_corrupt");
    expect(error.file).toBe(join(third, STORE_MARKER_FILE));
  });

  it("refuses a second process-level open of a store in use, and --new-store does not move it", () => {
    const dir = tempDir();
    const first = open(dir);
    const error = refusal(() => openDispatchStore({ stateDir: dir }));
    expect(error.reason).toBe("locked");
    expect(error.exitCode).toBe(3);
    const again = refusal(() => openDispatchStore({ stateDir: dir, newStore: true }));
    expect(again.reason).toBe("locked");
    first.admit(admission(runId()));
    first.close();
    expect(open(dir).storeId).toBe(first.storeId);
  });

  it("--new-store moves the old files aside and creates a new store_id", () => {
    const dir = tempDir();
    const first = open(dir);
    const oldId = first.storeId;
    first.close();
    rmSync(join(dir, STORE_DB_FILE));
    const { store, created, movedAside } = openDispatchStore({ stateDir: dir, newStore: true });
    stores.push(store);
    expect(created).toBe(true);
    expect(store.storeId).not.toBe(oldId);
    expect(movedAside.some((p) => p.includes(`${STORE_MARKER_FILE}.replaced-`))).toBe(true);
    store.close();
    expect(open(dir).storeId).toBe(store.storeId);
  });
});
