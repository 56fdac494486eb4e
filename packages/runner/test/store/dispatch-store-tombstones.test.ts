/**
 * Tombstones (design §6.1): retention replaces a pruned terminal row by a
 * compact tombstone in the same transaction; tombstones are never pruned, an
 * id with a tombstone is never admitted again, and a tombstone costs at most
 * TOMBSTONE_BYTES_PER_RUN bytes of database file.
 */
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { base32 } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import type { SqliteDispatchStore } from "../../src/store/dispatch-store.js";
import { openDispatchStore } from "../../src/store/open.js";
import { fingerprintPrefix, runKey, TOMBSTONE_BYTES_PER_RUN } from "../../src/store/tombstone.js";

const dirs: string[] = [];
const stores: SqliteDispatchStore[] = [];
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function open(): SqliteDispatchStore {
  const dir = mkdtempSync(join(tmpdir(), "wc-tomb-"));
  dirs.push(dir);
  const { store } = openDispatchStore({ stateDir: dir });
  stores.push(store);
  return store;
}

function runId(i: number): string {
  return `wc_agent_run_${base32(createHash("sha256").update(`run-${i}`).digest()).slice(0, 26)}`;
}
function fp(i: number): string {
  return createHash("sha256").update(`intent-${i}`).digest("hex");
}

function admitTerminal(store: SqliteDispatchStore, i: number, at: string, state: "completed" | "failed" = "completed") {
  store.admit({
    run_id: runId(i),
    intent_fingerprint: fp(i),
    project_id: "demo",
    provider_id: "fake",
    provider_instance_id: "pi_aaaaaaaaaaaaaaaa",
    agent_instance_id: "ai_aaaaaaaaaaaaaaaa",
    created_at: at,
  });
  if (state === "completed") store.markDispatchBarrier(runId(i));
  store.markTerminal(runId(i), {
    state,
    execution_state: state === "completed" ? "completed" : "not_started",
    stop_reason: state === "completed" ? "end_turn" : null,
    failure_kind: state === "completed" ? null : "provider_exited",
    recovery_kind: "none",
    message: "done",
    ignored_updates: 0,
    last_seq: 3,
  });
}

describe("run tombstones", () => {
  it("pruning a terminal row leaves its tombstone: id, fingerprint prefix, final state, terminal time", () => {
    const store = open();
    admitTerminal(store, 1, "2026-01-01T00:00:00.000Z");
    admitTerminal(store, 2, "2026-01-01T00:00:01.000Z", "failed");
    expect(store.tombstone(runId(1))).toBeUndefined();
    const pruned = store.prune({ retainDays: 3650, retainMax: 0 });
    expect({ ...pruned, runIds: [...pruned.runIds].sort() }).toEqual({
      byAge: 0,
      byCount: 2,
      runIds: [runId(1), runId(2)].sort(),
    });
    expect(store.get(runId(1))).toBeUndefined();
    const t1 = store.tombstone(runId(1));
    expect(t1).toMatchObject({ run_id: runId(1), state: "completed", execution_state: "completed" });
    expect(t1?.fingerprintPrefix).toBe(fingerprintPrefix(fp(1)));
    expect(Date.parse(t1?.terminal_at ?? "")).toBeGreaterThan(Date.parse("2026-01-01T00:00:00.000Z"));
    expect(store.tombstone(runId(2))).toMatchObject({ state: "failed", execution_state: "not_started" });
    expect(store.tombstone(runId(3))).toBeUndefined();
    expect(store.tombstoneCount()).toBe(2);
  });

  it("tombstones survive every later prune and a reopen of the store", () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-tomb-"));
    dirs.push(dir);
    let store = openDispatchStore({ stateDir: dir }).store;
    admitTerminal(store, 1, "2026-01-01T00:00:00.000Z");
    store.prune({ retainDays: 1, retainMax: 0, now: new Date("2030-01-01T00:00:00Z") });
    for (let i = 0; i < 3; i++) store.prune({ retainDays: 1, retainMax: 0, now: new Date("2099-01-01T00:00:00Z") });
    store.close();
    store = openDispatchStore({ stateDir: dir }).store;
    stores.push(store);
    expect(store.tombstone(runId(1))).toMatchObject({ state: "completed" });
  });

  it("an id with a tombstone is never admitted again", () => {
    const store = open();
    admitTerminal(store, 1, "2026-01-01T00:00:00.000Z");
    store.prune({ retainDays: 3650, retainMax: 0 });
    expect(() =>
      store.admit({
        run_id: runId(1),
        intent_fingerprint: fp(1),
        project_id: "demo",
        provider_id: "fake",
        provider_instance_id: "pi_aaaaaaaaaaaaaaaa",
        agent_instance_id: "ai_bbbbbbbbbbbbbbbb",
        created_at: "2026-01-02T00:00:00.000Z",
      }),
    ).toThrow(/tombstone/);
    expect(store.get(runId(1))).toBeUndefined();
  });

  it("the run key is the 130 bits of the id, so distinct ids never share a tombstone", () => {
    const a = runKey(runId(1));
    const b = runKey(`${runId(1).slice(0, -1)}${runId(1).endsWith("a") ? "b" : "a"}`);
    expect(a?.length).toBe(17);
    expect(a?.equals(b ?? Buffer.alloc(0))).toBe(false);
    expect(runKey("wc_agent_run_short")).toBeNull();
  });

  it(`costs at most ${TOMBSTONE_BYTES_PER_RUN} bytes of database file per run (20k tombstones)`, () => {
    const store = open();
    const n = 20_000;
    const before = store.tableBytes("tombstones");
    store.transaction(() => {
      for (let i = 0; i < n; i++) admitTerminal(store, i, "2026-01-01T00:00:00.000Z");
    });
    store.prune({ retainDays: 3650, retainMax: 0 });
    expect(store.tombstoneCount()).toBe(n);
    const perRun = (store.tableBytes("tombstones") - before) / n;
    expect(perRun).toBeLessThanOrEqual(TOMBSTONE_BYTES_PER_RUN);
  }, 120_000);
});
