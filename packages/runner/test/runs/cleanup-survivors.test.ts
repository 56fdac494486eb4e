/**
 * A process group that (as terminateTree reports) survived SIGKILL keeps its
 * identity in the durable row, so the next start's reaper can still find it;
 * a clean tree's identity is cleared. terminateTree is wrapped to report a
 * survivor (the real tree is still killed).
 *
 * Why a double of our own spawn.js here: a process that outlives SIGKILL
 * (uninterruptible sleep in the kernel, e.g. on a hung NFS mount) cannot be
 * made on demand by a test, so only the report is faked. Everything else is
 * real: the fake agent process, its process group, the kill sequence and the
 * SQLite row. The reaper's side (finding and killing a recorded group on the
 * next start) runs against real processes in reaper.test.ts and the crash
 * matrix's grandchild cases.
 */
import { afterAll, describe, expect, test, vi } from "vitest";
import { makeWorkspace, newManager, runToEnd, writeConfig } from "../support/harness.js";

const report = vi.hoisted(() => ({ survivors: 0 }));
vi.mock("../../src/process/spawn.js", async (importOriginal) => {
  const mod = await importOriginal<typeof import("../../src/process/spawn.js")>();
  return {
    ...mod,
    spawnAgent: async (options: Parameters<typeof mod.spawnAgent>[0]) => {
      const child = await mod.spawnAgent(options);
      const terminate = child.terminateTree.bind(child);
      (child as { terminateTree: typeof terminate }).terminateTree = async (graceMs) => ({
        ...(await terminate(graceMs)),
        survivors: report.survivors,
      });
      return child;
    },
  };
});

const ws = makeWorkspace();
const { manager, store } = newManager(writeConfig(ws));

afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

describe("process tree cleanup bookkeeping", () => {
  test("the child identity is cleared only when no process survived", async () => {
    report.survivors = 0;
    const clean = await runToEnd(manager, "scenario: hello\ncase: clean");
    expect(store.get(clean.run.run_id)).toMatchObject({ phase: "terminal", child_pgid: null });

    report.survivors = 1;
    const survived = await runToEnd(manager, "scenario: hello\ncase: survived");
    expect(survived.run.state).toBe("completed");
    const row = store.get(survived.run.run_id);
    expect(row?.phase).toBe("terminal");
    expect(row?.child_pgid).toEqual(expect.any(Number));
    expect(row?.child_start_time).toEqual(expect.any(String));
  });
});
