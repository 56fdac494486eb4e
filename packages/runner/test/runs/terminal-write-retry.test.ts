/**
 * A terminal state that could not be written durably: the run stays pinned in
 * memory (sync, inventory and cancel answer its terminal state, it is never
 * evicted) and the write is retried at the next retain/evict.
 */

import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { openDispatchStore } from "../../src/store/open.js";
import type { DispatchStore } from "../../src/store/types.js";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const ws = makeWorkspace();
const config = writeConfig(ws);
const real = openDispatchStore({ stateDir: mkdtempSync(join(tmpdir(), "wc-runner-store-")) }).store;
/** Runs whose markTerminal throws (a disk error, say). */
const failing = new Set<string>();
let failedWrites = 0;
const store: DispatchStore = {
  get storeId() {
    return real.storeId;
  },
  get: (runId) => real.get(runId),
  tombstone: (runId) => real.tombstone(runId),
  listForInventory: (limit) => real.listForInventory(limit),
  admit: (row) => real.admit(row),
  ensureDurable: (runId) => real.ensureDurable(runId),
  markSetup: (runId, child) => real.markSetup(runId, child),
  recordEffectiveConfig: (runId, c) => real.recordEffectiveConfig(runId, c),
  recordAcpSession: (runId, id) => real.recordAcpSession(runId, id),
  acpSessionOf: (runId) => real.acpSessionOf(runId),
  markDispatchBarrier: (runId) => real.markDispatchBarrier(runId),
  markTerminal: (runId, update) => {
    if (failing.has(runId)) {
      failedWrites++;
      throw new Error("injected markTerminal failure");
    }
    real.markTerminal(runId, update);
  },
  clearChild: (runId) => real.clearChild(runId),
  recordWorkspace: (runId, workspace) => real.recordWorkspace(runId, workspace),
  recordChange: (runId, head) => real.recordChange(runId, head),
  workspace: (runId) => real.workspace(runId),
  unrecordedWorkspaces: () => real.unrecordedWorkspaces(),
  branchInUse: (branch) => real.branchInUse(branch),
  recordApply: (row) => real.recordApply(row),
  applyOf: (runId, keyHash) => real.applyOf(runId, keyHash),
  applyCount: (runId) => real.applyCount(runId),
  close: () => real.close(),
};
const { manager } = newManager(config, { store, maxRetainedRuns: 1 });

afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

describe("a failed terminal write", () => {
  test("keeps the run pinned in memory with its terminal state, and is retried at the next eviction", async () => {
    let pinnedId = "";
    const { run } = await runToEnd(manager, "scenario: hello\ncase: pinned", {}, (runId) => {
      pinnedId = runId;
      failing.add(runId);
    });
    expect(run.state).toBe("completed");
    expect(failedWrites).toBe(1);
    expect(real.get(pinnedId)?.phase).not.toBe("terminal");

    // Two more runs push the pinned one past maxRetainedRuns = 1: it must not be evicted.
    for (const name of ["b", "c"]) {
      expect((await runToEnd(manager, `scenario: hello\ncase: ${name}`)).run.state).toBe("completed");
    }
    expect(failedWrites).toBeGreaterThanOrEqual(2); // retried, failed again
    const synced = manager.sync(pinnedId, 0, 100);
    expect(synced?.run).toMatchObject({ phase: "terminal", state: "completed" });
    expect(synced?.events.at(-1)).toMatchObject({ kind: "terminal", state: "completed" });
    expect(manager.inventory().find((r) => r.run_id === pinnedId)).toMatchObject({ state: "completed" });
    expect(await manager.cancel(pinnedId)).toMatchObject({ cancel_requested: false, already_terminal: true });

    // The store recovers: the next retain writes the terminal state, and the run may then be evicted.
    failing.clear();
    expect((await runToEnd(manager, "scenario: hello\ncase: d")).run.state).toBe("completed");
    expect(real.get(pinnedId)).toMatchObject({ phase: "terminal", state: "completed" });
    expect(manager.ring(pinnedId)).toBeUndefined();
    expect(manager.sync(pinnedId, 0, 0)?.run).toMatchObject({ phase: "terminal", state: "completed" });
  });
});
