/**
 * run.start / sync / cancel for a run whose row retention pruned: the
 * tombstone's outcome or a conflict, never a fresh admission; and no
 * tombstone (never admitted) stays distinguishable from "pruned".
 */
import { afterAll, describe, expect, test } from "vitest";
import { readLedger } from "../../../../scripts/test-support/index.js";
import type { SqliteDispatchStore } from "../../src/store/dispatch-store.js";
import { makeWorkspace, newManager, startRequest, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const { manager, store } = newManager(writeConfig(ws));
const sqlite = store as SqliteDispatchStore;
afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

describe("tombstoned runs", () => {
  test("a start for a pruned run answers its tombstone (same intent) or a conflict, and never dispatches again", async () => {
    const request = startRequest(manager, "scenario: hello\ncase: tombstone");
    expect(await manager.start(request)).toMatchObject({ ok: true, created: true });
    await manager.whenSettled(request.run_id);
    const prompts = () => readLedger(ws.ledger).filter((e) => e.event === "prompt").length;
    expect(prompts()).toBe(1);
    // Evict it from memory (retention keeps 64 in memory; the store is what a restarted Runner has), then prune.
    sqlite.prune({ retainDays: 3650, retainMax: 0 });
    expect(sqlite.get(request.run_id)).toBeUndefined();

    const fresh = newManager(writeConfig(ws), { store }).manager;
    const again = await fresh.start({
      ...startRequest(fresh, "x"),
      run_id: request.run_id,
      intent_fingerprint: request.intent_fingerprint,
      prompt: request.prompt,
    });
    expect(again).toMatchObject({
      ok: false,
      code: "pruned",
      tombstone: { run_id: request.run_id, state: "completed", execution_state: "completed" },
    });
    const other = await fresh.start({
      ...startRequest(fresh, "x"),
      run_id: request.run_id,
      intent_fingerprint: "0".repeat(64),
    });
    expect(other).toMatchObject({ ok: false, code: "idempotency_conflict" });
    expect(fresh.sync(request.run_id, 0, 10)).toBeNull();
    expect(await fresh.cancel(request.run_id)).toBeNull();
    expect(fresh.tombstone(request.run_id)).toMatchObject({ state: "completed" });
    expect(fresh.tombstone(startRequest(fresh, "never").run_id)).toBeNull();
    // No run exists on this manager (sync and cancel found none above), so nothing of it can be dispatched later.
    expect(prompts()).toBe(1);
  });
});
