/**
 * Branches of runs past the Runner's retention are pruned (design §16, issue 41 §3), on the Runner over a real git
 * repository and the real fake agent: `webcodex/run/<run_id>` goes once its run's row was pruned by retention and
 * no retained run works on it — a continuation shares its parent's branch, so a chain's branch stays while any of
 * its runs is retained — in bounded batches; a branch whose run may run, or that this store never admitted, stays.
 */
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { parseConfig } from "../../src/config/config.js";
import type { RunManager } from "../../src/runs/manager.js";
import { openDispatchStore } from "../../src/store/open.js";
import { pruneRunBranches } from "../../src/workspace/prune.js";
import { runBranch } from "../../src/workspace/worktree.js";
import { makeWorkspace, newManager, newRunId, runToEnd, type Workspace } from "../support/harness.js";
import { commitProject, git, worktreeConfig } from "../support/worktree-project.js";

const workspaces: Workspace[] = [];
const managers: RunManager[] = [];
afterEach(async () => {
  for (const m of managers.splice(0)) await m.close();
  for (const ws of workspaces.splice(0)) ws.cleanup();
});

/** A worktree project (one commit) whose fake agent can resume its sessions; the store is the test's, to prune. */
function setup() {
  const ws = makeWorkspace();
  workspaces.push(ws);
  commitProject(ws);
  const { text, file } = worktreeConfig(ws, { runner: ["workspace_keep_secs = 0"], continuation: true });
  const store = openDispatchStore({ stateDir: mkdtempSync(join(tmpdir(), "wc-runner-store-")) }).store;
  const { manager } = newManager(parseConfig(text, file), { workspacesDir: join(ws.dir, "worktrees"), store });
  managers.push(manager);
  return { ws, manager, store };
}

function branches(root: string): string[] {
  return git(root, "for-each-ref", "--format=%(refname:lstrip=2)", "refs/heads/webcodex/run/")
    .split("\n")
    .filter(Boolean)
    .sort();
}

describe("pruning the branches of runs past retention", () => {
  it("deletes a pruned run's branch, keeps a chain's branch while any run of it is retained", async () => {
    const { ws, manager, store } = setup();
    const solo = await runToEnd(manager, "scenario: edit_file path=a.txt text=one");
    const parent = await runToEnd(manager, "scenario: edit_file path=b.txt text=two");
    const child = await runToEnd(manager, "scenario: edit_file path=c.txt text=three", {
      continue_run_id: parent.run.run_id,
    });
    const recent = await runToEnd(manager, "scenario: edit_file path=d.txt text=four");
    for (const f of [solo, parent, child, recent]) expect(f.run.state).toBe("completed");
    const [soloB, chainB, recentB] = [solo, parent, recent].map((f) => runBranch(f.run.run_id)) as [
      string,
      string,
      string,
    ];
    expect(child.run.workspace?.branch).toBe(chainB);
    // An operator's branch under the same prefix, of a run this store never admitted: never pruned.
    const stranger = runBranch(newRunId());
    git(ws.projectRoot, "branch", stranger, "main");
    expect(branches(ws.projectRoot)).toEqual([soloB, chainB, recentB, stranger].sort());

    // Nothing is past retention yet: nothing goes.
    expect(await manager.pruneBranches()).toBe(0);
    // Retention keeps the newest two (the child and the recent run): the solo run and the parent are pruned.
    expect(store.prune({ retainDays: 3650, retainMax: 2 }).runIds.sort()).toEqual(
      [solo.run.run_id, parent.run.run_id].sort(),
    );
    expect(await manager.pruneBranches()).toBe(1);
    // The parent's branch stays: its child, still retained, works on it (and its change reads back).
    expect(branches(ws.projectRoot)).toEqual([chainB, recentB, stranger].sort());
    const changes = await manager.changes(child.run.run_id, 0, 64 * 1024);
    expect(changes?.ok && changes.changes.files.map((f) => f.path)).toEqual(["c.txt"]);

    // Once the child is past retention too, the chain's branch goes; the retained run's stays.
    expect(store.prune({ retainDays: 3650, retainMax: 1 }).runIds).toEqual([child.run.run_id]);
    expect(await manager.pruneBranches()).toBe(1);
    expect(branches(ws.projectRoot)).toEqual([recentB, stranger].sort());
    expect(git(ws.projectRoot, "rev-parse", recentB)).toBe(recent.run.workspace?.head_commit);
    expect(git(ws.projectRoot, "status", "--porcelain")).toBe("");
  });

  it("deletes at most a batch a sweep, never a branch whose run may run, and goes on at the next sweep", async () => {
    const { ws, manager, store } = setup();
    const ended = [];
    for (const n of [1, 2, 3]) ended.push(await runToEnd(manager, `scenario: edit_file path=f${n}.txt text=${n}`));
    const ids = ended.map((f) => f.run.run_id);
    expect(store.prune({ retainDays: 3650, retainMax: 1 }).runIds).toHaveLength(2);
    const pruned = ids.filter((id) => store.get(id) === undefined);
    const [first, second] = pruned as [string, string];

    // A run this process may still run keeps its branch, whatever the store says.
    const running = { store, mayRun: (id: string) => id === first };
    expect((await pruneRunBranches(ws.projectRoot, running)).deleted).toBe(1);
    expect(branches(ws.projectRoot)).toContain(runBranch(first));
    expect(branches(ws.projectRoot)).not.toContain(runBranch(second));

    // A batch of one deletes one; the next sweep goes on from where it stopped.
    git(ws.projectRoot, "branch", runBranch(second), "main");
    const none = { store, mayRun: () => false };
    const one = await pruneRunBranches(ws.projectRoot, none, 0, 1);
    expect(one.deleted).toBe(1);
    expect(branches(ws.projectRoot).filter((b) => pruned.map(runBranch).includes(b))).toHaveLength(1);
    expect((await pruneRunBranches(ws.projectRoot, none, one.nextShard, 1)).deleted).toBe(1);
    expect(branches(ws.projectRoot)).toEqual([runBranch(ids.find((id) => !pruned.includes(id)) ?? "")]);
  });
});
