/**
 * Continuation in a `worktree` project (design §17, issues 41/42), on the Runner over a real git repository and
 * the real fake agent persisting its sessions: a follow-up turn works in its parent's workspace — the same
 * directory, the parent's branch, from the parent's recorded head (the worktree is made again there: a run's
 * worktree is removed once its change is recorded, at once here unless a case keeps it) — and its own change is its
 * turn's alone. A kept parent's worktree is the child's while the child runs: no sweep takes it from under it.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { poll, readLedger } from "../../../../scripts/test-support/index.js";
import { parseConfig } from "../../src/config/config.js";
import type { RunManager } from "../../src/runs/manager.js";
import { BASE_REF_WITH_CONTINUATION, PARENT_BRANCH_MOVED } from "../../src/runs/workspace.js";
import { openDispatchStore } from "../../src/store/open.js";
import { runBranch } from "../../src/workspace/worktree.js";
import {
  type Finished,
  makeWorkspace,
  newManager,
  runToEnd,
  startRequest,
  type Workspace,
} from "../support/harness.js";
import { commitProject, git, worktreeConfig } from "../support/worktree-project.js";

const workspaces: Workspace[] = [];
const managers: RunManager[] = [];
afterEach(async () => {
  for (const m of managers.splice(0)) await m.close();
  for (const ws of workspaces.splice(0)) ws.cleanup();
});

/** A worktree project (one commit) whose fake agent keeps its sessions in `<dir>/sessions` and can resume them. */
function setup(stateDir?: string, keep: { secs: number; now?: () => Date } = { secs: 0 }) {
  const ws = makeWorkspace();
  workspaces.push(ws);
  commitProject(ws);
  const sessions = join(ws.dir, "sessions");
  const { text, file } = worktreeConfig(ws, {
    runner: [`workspace_keep_secs = ${keep.secs}`],
    acp: ["cancel_grace_secs = 5"],
    continuation: true,
  });
  const worktrees = join(ws.dir, "worktrees");
  const store = stateDir === undefined ? undefined : openDispatchStore({ stateDir }).store;
  const made = newManager(parseConfig(text, file), {
    workspacesDir: worktrees,
    ...(store ? { store } : {}),
    ...(keep.now ? { now: keep.now } : {}),
  });
  const manager = made.manager;
  managers.push(manager);
  return { ws, manager, store: made.store, sessions, worktrees, text, file };
}

function said(finished: Finished): string {
  return finished.events.map((e) => (e.kind === "agent_message" ? e.text : "")).join("");
}

function prompts(ws: Workspace): number {
  return readLedger(ws.ledger).filter((l) => l.event === "prompt").length;
}

describe("continuation in a worktree project", () => {
  it("a chain of three turns works in the first run's worktree directory, on its branch, each turn's change its own", async () => {
    const { ws, manager, sessions, worktrees } = setup();
    const base = git(ws.projectRoot, "rev-parse", "HEAD");
    const one = await runToEnd(manager, "scenario: edit_file path=a.txt text=one\nnonce: ws-1");
    expect(one.run.state).toBe("completed");
    const branch = runBranch(one.run.run_id);
    const head1 = one.run.workspace?.head_commit ?? "";
    expect(one.run.workspace).toMatchObject({ branch, base_commit: base });
    const dir = join(worktrees, one.run.run_id);
    expect(existsSync(dir)).toBe(false);

    const two = await runToEnd(manager, "scenario: edit_file path=b.txt text=two\nnonce: ws-2", {
      continue_run_id: one.run.run_id,
    });
    expect(two.run.state).toBe("completed");
    // The parent's branch, from the parent's head; the branch now at the child's head, both files on it.
    expect(two.run.workspace).toMatchObject({ mode: "worktree", branch, base_commit: head1 });
    const head2 = two.run.workspace?.head_commit ?? "";
    expect(git(ws.projectRoot, "rev-parse", branch)).toBe(head2);
    expect(git(ws.projectRoot, "show", `${head2}:a.txt`)).toBe("one");
    expect(git(ws.projectRoot, "show", `${head2}:b.txt`)).toBe("two");
    expect(git(ws.projectRoot, "rev-list", "--count", `${head1}..${head2}`)).toBe("1");
    // Each run's change is its own turn's: the parent's still reads a.txt alone, the child's b.txt alone.
    const changes = async (runId: string) => {
      const res = await manager.changes(runId, 0, 64 * 1024);
      if (!res?.ok) throw new Error(`changes of ${runId} failed`);
      return res.changes.files.map((f) => `${f.status} ${f.path}`);
    };
    expect(await changes(one.run.run_id)).toEqual(["added a.txt"]);
    expect(await changes(two.run.run_id)).toEqual(["added b.txt"]);
    // The agent resumed its one session in the parent's directory (the session store keeps its last cwd).
    const stored = readdirSync(sessions);
    expect(stored).toHaveLength(1);
    const session = JSON.parse(readFileSync(join(sessions, stored[0] ?? ""), "utf8")) as { cwd: string };
    expect(session.cwd).toBe(dir);

    const three = await runToEnd(manager, "scenario: recall", { continue_run_id: two.run.run_id });
    expect(said(three)).toBe("recall: nonce: ws-2");
    expect(three.run.workspace).toMatchObject({ branch, base_commit: head2, head_commit: head2 });
    expect(readdirSync(sessions)).toHaveLength(1);
    // Every worktree is gone once its change is recorded; the project's own tree is untouched.
    expect(existsSync(dir)).toBe(false);
    expect(git(ws.projectRoot, "worktree", "list", "--porcelain")).not.toContain(one.run.run_id);
    expect(git(ws.projectRoot, "status", "--porcelain")).toBe("");
  });

  it("a follow-up takes over its kept parent's worktree: the parent's keep time ending never sweeps it from under the child", async () => {
    let now = Date.parse("2026-01-01T00:00:00Z");
    const { ws, manager, worktrees } = setup(undefined, { secs: 600, now: () => new Date(now) });
    const one = await runToEnd(manager, "scenario: edit_file path=a.txt text=one");
    const dir = join(worktrees, one.run.run_id);
    expect(existsSync(dir)).toBe(true);
    const child = startRequest(manager, "scenario: edit_file path=b.txt text=two hold=true", {
      continue_run_id: one.run.run_id,
    });
    expect((await manager.start(child)).ok).toBe(true);
    await poll(() => readLedger(ws.ledger).filter((l) => l.event === "file_edited").length === 2, {
      timeoutMs: 60_000,
      intervalMs: 50,
      what: "the child's edit",
    });
    // The parent's keep time runs out while the child works in that directory: nothing is swept.
    now += 601_000;
    expect(await manager.sweepWorkspaces()).toBe(0);
    expect(readFileSync(join(dir, "b.txt"), "utf8")).toBe("two\n");
    await manager.cancel(child.run_id);
    await manager.whenSettled(child.run_id);
    // The child's own keep time, then its worktree (the one directory) goes; both changes stay on the branch.
    expect(await manager.sweepWorkspaces()).toBe(0);
    expect(existsSync(dir)).toBe(true);
    now += 601_000;
    expect(await manager.sweepWorkspaces()).toBe(1);
    expect(existsSync(dir)).toBe(false);
    const head = git(ws.projectRoot, "rev-parse", runBranch(one.run.run_id));
    expect(git(ws.projectRoot, "show", `${head}:a.txt`)).toBe("one");
    expect(git(ws.projectRoot, "show", `${head}:b.txt`)).toBe("two");
  });

  it("makes a deleted branch again at the parent's head; a moved branch or a base_ref ends the child not started", async () => {
    const { ws, manager } = setup();
    const one = await runToEnd(manager, "scenario: edit_file path=a.txt text=one");
    const branch = runBranch(one.run.run_id);
    const head1 = one.run.workspace?.head_commit ?? "";
    git(ws.projectRoot, "branch", "-D", branch);

    const two = await runToEnd(manager, "scenario: edit_file path=b.txt text=two", {
      continue_run_id: one.run.run_id,
    });
    expect(two.run.state).toBe("completed");
    expect(two.run.workspace).toMatchObject({ branch, base_commit: head1 });
    const head2 = two.run.workspace?.head_commit ?? "";
    expect(git(ws.projectRoot, "rev-parse", `${head2}~1`)).toBe(head1);
    expect(git(ws.projectRoot, "rev-parse", branch)).toBe(head2);

    // Someone moves the branch back: the Runner never forces it; the follow-up starts nothing.
    git(ws.projectRoot, "branch", "-f", branch, head1);
    const before = prompts(ws);
    const moved = await runToEnd(manager, "scenario: recall", { continue_run_id: two.run.run_id });
    expect([moved.run.state, moved.run.execution_state, moved.run.failure_kind]).toEqual([
      "failed",
      "not_started",
      "workspace_failed",
    ]);
    expect(moved.run.message).toContain(PARENT_BRANCH_MOVED);
    // No worktree was made: the follow-up has no change of its own (not the moved branch's tip).
    expect(moved.run.workspace).toMatchObject({ branch, base_commit: head2, head_commit: head2 });
    expect(git(ws.projectRoot, "rev-parse", branch)).toBe(head1);

    const based = await runToEnd(manager, "scenario: recall", { continue_run_id: two.run.run_id, base_ref: "main" });
    expect([based.run.state, based.run.execution_state, based.run.recovery_kind]).toEqual([
      "failed",
      "not_started",
      "fix_input",
    ]);
    expect(based.run.message).toContain(BASE_REF_WITH_CONTINUATION);
    expect(prompts(ws)).toBe(before);
    expect(git(ws.projectRoot, "worktree", "list", "--porcelain")).not.toContain(one.run.run_id);
  });

  it("records at start-up a continuation's change a crash left unrecorded, from the parent's directory and branch", async () => {
    const stateDir = mkdtempSync(join(tmpdir(), "wc-runner-store-"));
    const { ws, manager, worktrees, text, file } = setup(stateDir);
    const one = await runToEnd(manager, "scenario: edit_file path=a.txt text=one");
    const branch = runBranch(one.run.run_id);
    const head1 = one.run.workspace?.head_commit ?? "";
    await manager.close();
    managers.splice(managers.indexOf(manager), 1);
    // What a crash during the child's turn leaves: its row on the parent's branch, the worktree made again in the
    // parent's directory and edited, no change recorded.
    const crashed = openDispatchStore({ stateDir }).store;
    const childId = "wc_agent_run_abcdefghijklmnopqrstuvwxyz";
    crashed.admit({
      run_id: childId,
      intent_fingerprint: "f".repeat(64),
      project_id: "demo",
      provider_id: "fake",
      provider_instance_id: "pi_aaaaaaaaaaaaaaaaaaaa",
      agent_instance_id: "ai_aaaaaaaaaaaaaaaaaaaa",
      created_at: new Date().toISOString(),
    });
    crashed.recordWorkspace(childId, { branch, base_commit: head1 });
    const dir = join(worktrees, one.run.run_id);
    git(ws.projectRoot, "worktree", "add", "-q", dir, branch);
    writeFileSync(join(dir, "b.txt"), "two\n");
    crashed.close();

    const store = openDispatchStore({ stateDir }).store;
    const { manager: restarted } = newManager(parseConfig(text, file), { store, workspacesDir: worktrees });
    managers.push(restarted);
    expect(await restarted.recoverWorkspaces()).toEqual({ recorded: 1, removed: 0, pending: 0 });
    const head = store.workspace(childId)?.head_commit ?? "";
    expect(git(ws.projectRoot, "show", `${head}:b.txt`)).toBe("two");
    expect(git(ws.projectRoot, "rev-parse", `${head}~1`)).toBe(head1);
    expect(git(ws.projectRoot, "rev-parse", branch)).toBe(head);
    expect(existsSync(dir)).toBe(false);
    // (A spare the restarted Runner makes once recovered may be listed: workspace/spares.ts.)
    expect(git(ws.projectRoot, "worktree", "list")).not.toContain(dir);
  });
});
