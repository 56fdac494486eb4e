/**
 * A follow-up turn starts warm in its parent's kept worktree (design §17, issue 41): on the Runner over a real git
 * repository and the real fake agent. When the parent's worktree is still kept and is exactly the parent's head
 * plus ignored files, the child works in it as it is — what the parent's agent produced under `.gitignore`
 * (dependencies, build output) is still there. A stray tracked edit, an untracked file, an index entry that hides
 * a file, or a worktree on another branch gives a fresh checkout of the parent's head (nothing of that survives);
 * a kept worktree swept or removed meanwhile is simply made again. Inspecting never runs the project's fsmonitor
 * or hooks.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { parseConfig } from "../../src/config/config.js";
import type { RunManager } from "../../src/runs/manager.js";
import { runBranch } from "../../src/workspace/worktree.js";
import { type Finished, makeWorkspace, newManager, runToEnd, type Workspace } from "../support/harness.js";
import { commitProject, git, worktreeConfig } from "../support/worktree-project.js";

const workspaces: Workspace[] = [];
const managers: RunManager[] = [];
afterEach(async () => {
  for (const m of managers.splice(0)) await m.close();
  for (const ws of workspaces.splice(0)) ws.cleanup();
});

/** A worktree project ignoring `node_modules/`, whose worktrees are kept 600 s on a clock the test moves. */
function setup() {
  const ws = makeWorkspace();
  workspaces.push(ws);
  commitProject(ws, { "README.md": "demo\n", ".gitignore": "node_modules/\n" });
  writeFileSync(join(ws.projectRoot, "README.md"), "demo, again\n");
  git(ws.projectRoot, "commit", "-q", "-a", "-m", "second");
  const { text, file } = worktreeConfig(ws, {
    runner: ["workspace_keep_secs = 600"],
    acp: ["cancel_grace_secs = 5"],
    continuation: true,
  });
  const worktrees = join(ws.dir, "worktrees");
  const clock = { now: Date.parse("2026-01-01T00:00:00Z") };
  const { manager } = newManager(parseConfig(text, file), { workspacesDir: worktrees, now: () => new Date(clock.now) });
  managers.push(manager);
  return { ws, manager, worktrees, clock };
}

/** The parent's turn: its agent writes an ignored file (node_modules/dep.txt); its worktree is kept. */
async function parentTurn(manager: RunManager, worktrees: string) {
  const one = await runToEnd(manager, "scenario: edit_file path=node_modules/dep.txt text=built");
  expect(one.run.state).toBe("completed");
  const dir = join(worktrees, one.run.run_id);
  expect(readFileSync(join(dir, "node_modules", "dep.txt"), "utf8")).toBe("built\n");
  return { one, dir, head1: one.run.workspace?.head_commit ?? "" };
}

async function childTurn(manager: RunManager, parent: Finished): Promise<Finished> {
  const two = await runToEnd(manager, "scenario: edit_file path=b.txt text=two", {
    continue_run_id: parent.run.run_id,
  });
  expect(two.run.state).toBe("completed");
  return two;
}

async function changedFiles(manager: RunManager, runId: string): Promise<string[]> {
  const res = await manager.changes(runId, 0, 64 * 1024);
  if (!res?.ok) throw new Error(`changes of ${runId} failed`);
  return res.changes.files.map((f) => `${f.status} ${f.path}`);
}

/** The child's checkout was fresh: the worktree is exactly its head — no ignored or untracked file, no change. */
function expectFresh(dir: string, head: string): void {
  expect(existsSync(join(dir, "node_modules"))).toBe(false);
  expect(git(dir, "status", "--porcelain", "--ignored=matching", "--untracked-files=all")).toBe("");
  expect(git(dir, "rev-parse", "HEAD")).toBe(head);
}

describe("a follow-up starts warm in its parent's kept worktree", () => {
  it("reuses a clean kept worktree as it is: the parent's ignored files are the child's, its change its own turn's", async () => {
    const { ws, manager, worktrees } = setup();
    const { one, dir, head1 } = await parentTurn(manager, worktrees);
    const two = await childTurn(manager, one);
    // The ignored file the parent's agent left is still there: no checkout was made.
    expect(readFileSync(join(dir, "node_modules", "dep.txt"), "utf8")).toBe("built\n");
    expect(two.run.workspace).toMatchObject({ branch: runBranch(one.run.run_id), base_commit: head1 });
    const head2 = two.run.workspace?.head_commit ?? "";
    expect(git(ws.projectRoot, "rev-parse", `${head2}~1`)).toBe(head1);
    expect(head1).toBe(git(ws.projectRoot, "rev-parse", "main"));
    expect(await changedFiles(manager, two.run.run_id)).toEqual(["added b.txt"]);
    expect(git(dir, "status", "--porcelain", "--untracked-files=all")).toBe("");
    expect(git(dir, "rev-parse", "HEAD")).toBe(head2);
  });

  it("never runs the project's fsmonitor or hooks while inspecting the kept worktree", async () => {
    const { ws, manager, worktrees } = setup();
    const { one, dir } = await parentTurn(manager, worktrees);
    // Planted after the parent's turn, in the repository's config and hooks every worktree of it reads.
    const canary = join(ws.dir, "planted-ran");
    const script = join(ws.dir, "plant.sh");
    writeFileSync(script, `#!/bin/sh\necho ran >> ${JSON.stringify(canary)}\n`);
    chmodSync(script, 0o755);
    git(ws.projectRoot, "config", "core.fsmonitor", script);
    const hooks = join(ws.projectRoot, ".git", "hooks");
    mkdirSync(hooks, { recursive: true });
    for (const hook of ["post-index-change", "post-checkout", "reference-transaction"]) {
      writeFileSync(join(hooks, hook), `#!/bin/sh\n${JSON.stringify(script)}\n`);
      chmodSync(join(hooks, hook), 0o755);
    }
    await childTurn(manager, one);
    expect(readFileSync(join(dir, "node_modules", "dep.txt"), "utf8")).toBe("built\n");
    expect(existsSync(canary)).toBe(false);
  });

  const readme = (dir: string) => join(dir, "README.md");
  const spoilers: [string, (dir: string) => void][] = [
    ["a stray tracked edit", (dir) => writeFileSync(readme(dir), "stray\n")],
    ["an untracked file", (dir) => writeFileSync(join(dir, "stray.txt"), "stray\n")],
    [
      "a staged file",
      (dir) => {
        writeFileSync(join(dir, "stray.txt"), "stray\n");
        git(dir, "add", "stray.txt");
      },
    ],
    [
      "an edit hidden by assume-unchanged",
      (dir) => {
        git(dir, "update-index", "--assume-unchanged", "README.md");
        writeFileSync(readme(dir), "hidden\n");
      },
    ],
    [
      "an edit hidden by skip-worktree",
      (dir) => {
        git(dir, "update-index", "--skip-worktree", "README.md");
        writeFileSync(readme(dir), "hidden\n");
      },
    ],
    ["the worktree on another branch at the same commit", (dir) => git(dir, "checkout", "-q", "-b", "side")],
    ["a detached HEAD at the same commit", (dir) => git(dir, "checkout", "-q", "--detach")],
  ];
  for (const [what, spoil] of spoilers) {
    it(`makes the worktree again from the parent's head over ${what}`, async () => {
      const { manager, worktrees } = setup();
      const { one, dir, head1 } = await parentTurn(manager, worktrees);
      spoil(dir);
      const two = await childTurn(manager, one);
      expect(two.run.workspace).toMatchObject({ base_commit: head1 });
      // The child's change is its own turn's: nothing of the stray state reached it.
      expect(await changedFiles(manager, two.run.run_id)).toEqual(["added b.txt"]);
      expectFresh(dir, two.run.workspace?.head_commit ?? "");
      expect(readFileSync(readme(dir), "utf8")).toBe("demo, again\n");
      expect(existsSync(join(dir, "stray.txt"))).toBe(false);
    });
  }

  it("a kept worktree swept at its keep time's end, or removed by hand, is made again", async () => {
    const { manager, worktrees, clock } = setup();
    const { one, dir } = await parentTurn(manager, worktrees);
    clock.now += 601_000;
    expect(await manager.sweepWorkspaces()).toBe(1);
    expect(existsSync(dir)).toBe(false);
    const two = await childTurn(manager, one);
    expectFresh(dir, two.run.workspace?.head_commit ?? "");
    // The child's worktree is kept in turn; removed without git, the next follow-up makes it again.
    rmSync(dir, { recursive: true, force: true });
    const three = await childTurn(manager, two);
    expect(three.run.workspace).toMatchObject({ base_commit: two.run.workspace?.head_commit });
    expectFresh(dir, three.run.workspace?.head_commit ?? "");
  });

  it("a branch moved since the parent's change is never forced, kept worktree or not", async () => {
    const { ws, manager, worktrees } = setup();
    const { one, dir } = await parentTurn(manager, worktrees);
    const branch = runBranch(one.run.run_id);
    git(ws.projectRoot, "update-ref", `refs/heads/${branch}`, "main~1");
    const moved = await runToEnd(manager, "scenario: edit_file path=b.txt text=two", {
      continue_run_id: one.run.run_id,
    });
    expect([moved.run.state, moved.run.execution_state, moved.run.failure_kind]).toEqual([
      "failed",
      "not_started",
      "workspace_failed",
    ]);
    expect(git(ws.projectRoot, "rev-parse", branch)).toBe(git(ws.projectRoot, "rev-parse", "main~1"));
    expect(existsSync(dir)).toBe(false);
  });
});
