/**
 * One run's git worktree (design §16): made from the base commit on `webcodex/run/<run_id>` in a directory the
 * Runner owns, its change recorded as the agent's commits plus one commit of what it left (untracked included,
 * .gitignore respected) by the configured identity, then removed. Every git call goes through git.ts.
 */
import { mkdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { RUN_ID_PATTERN, WORKSPACE_BRANCH_PREFIX } from "@webcodex/protocol";
import type { WorkspaceAuthor } from "../config/config.js";
import { GitError, git } from "./git.js";
import { adminDir, unfinished } from "./locks.js";
import { makeOwnedWorkspace, recordOwnedChange, runOwned, type WorkspaceOwner } from "./owned.js";

/** Where a Runner keeps its runs' worktrees: `<state_dir>/workspaces/<run_id>`. */
export function worktreesDir(stateDir: string): string {
  return join(stateDir, "workspaces");
}

/** One run's worktree in `dir` (worktreesDir). */
export function worktreeDir(dir: string, runId: string): string {
  return join(dir, runId);
}

export function runBranch(runId: string): string {
  return `${WORKSPACE_BRANCH_PREFIX}${runId}`;
}

/**
 * The run whose id names a workspace branch (`webcodex/run/<run_id>`), and so its worktree's directory: a
 * conversation's first run (a continuation works on its parent's branch, design §17). Null for any other name.
 */
export function branchRunId(branch: string): string | null {
  if (!branch.startsWith(WORKSPACE_BRANCH_PREFIX)) return null;
  const runId = branch.slice(WORKSPACE_BRANCH_PREFIX.length);
  return RUN_ID_PATTERN.test(runId) ? runId : null;
}

/**
 * The commit `ref` names in the project at `root`, or null when it names none. `ref` was checked by the
 * protocol's BaseRef (never an option, never a revision expression); `--end-of-options` says so to git as well.
 */
export async function resolveBase(root: string, ref: string): Promise<string | null> {
  const out = await git(["rev-parse", "--verify", "--quiet", "--end-of-options", `${ref}^{commit}`], {
    cwd: root,
    okCodes: [1, 128],
  });
  const commit = out.stdout.trim();
  return out.code === 0 && /^[0-9a-f]{40}(?:[0-9a-f]{24})?$/.test(commit) ? commit : null;
}

/** The commit the branch `branch` of `root` points at, or null when there is no such branch. */
export async function branchTip(root: string, branch: string): Promise<string | null> {
  const tip = await git(["rev-parse", "--verify", "--quiet", `refs/heads/${branch}^{commit}`], {
    cwd: root,
    okCodes: [1, 128],
  });
  return tip.code === 0 ? tip.stdout.trim() : null;
}

/**
 * A continuation's worktree (design §17): `dir` on the existing branch `branch` at `head`, the parent's recorded
 * head — or the branch made again at `head` when it is gone. False, and nothing made, when the branch moved since
 * (someone committed to it or reset it): the Runner never forces a branch.
 */
export async function reopenWorktree(
  root: string,
  dir: string,
  branch: string,
  head: string,
  owner?: WorkspaceOwner,
): Promise<boolean> {
  const tip = await branchTip(root, branch);
  if (tip === null) {
    await addWorktree(root, dir, branch, head, owner);
    return true;
  }
  if (tip !== head) return false;
  // A run_as run's workspace is a repository of its own, made again (owned.ts).
  if (owner) {
    await makeOwnedWorkspace(root, dir, branch, head, owner);
    return true;
  }
  await mkdir(join(dir, ".."), { recursive: true, mode: 0o700 });
  await git(["worktree", "add", "--quiet", "--", dir, branch], { cwd: root });
  return true;
}

/** Make the worktree at `dir` on a new branch `branch` at `base`; a run_as run's is its pool user's (owned.ts). */
export async function addWorktree(
  root: string,
  dir: string,
  branch: string,
  base: string,
  owner?: WorkspaceOwner,
): Promise<void> {
  if (owner) {
    await git(["branch", "--quiet", "--no-track", "--", branch, base], { cwd: root });
    await makeOwnedWorkspace(root, dir, branch, base, owner);
    return;
  }
  await mkdir(join(dir, ".."), { recursive: true, mode: 0o700 });
  await git(["worktree", "add", "--quiet", "--no-track", "-b", branch, "--", dir, base], { cwd: root });
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Whether `dir` holds a worktree git finished making. One `git worktree add` never finished (killed mid-way, its
 * checkout maybe partial) saw no agent, and committing its files would record as the run's change the deletion
 * of every file not yet checked out: it holds no change (locks.ts `unfinished`).
 */
async function madeWorktree(root: string, dir: string): Promise<boolean> {
  // A run_as run's workspace is moved to its name once whole (owned.ts): nothing of it may be read as git's here.
  if (await runOwned(dir)) return true;
  if (!(await exists(join(dir, ".git")))) return false;
  const admin = await adminDir(root, dir);
  return admin === null || !(await unfinished(admin));
}

/** The message of the Runner's commit: the run id, never the prompt. */
export function leftoverMessage(runId: string): string {
  return `webcodex: uncommitted changes of run ${runId}\n\nRecorded by the WebCodex Runner when the run ended.\n`;
}

/**
 * Record the run's change and return its head: commit what the agent left in the worktree (if anything), point
 * the run's branch (its own, or the parent's for a continuation) at the worktree's HEAD (the agent may have
 * committed or moved it), and answer that commit. Without a worktree (never made or never finished, or already
 * removed) the branch's tip — or, without a branch, `base` — is it; for a continuation (a branch not the run's
 * own, whose tip is its parent's or someone else's doing) it is `base`: no change of its own.
 */
export async function recordChange(
  root: string,
  dir: string,
  runId: string,
  branch: string,
  base: string,
  author: WorkspaceAuthor,
): Promise<string> {
  if (await runOwned(dir)) return recordOwnedChange(root, dir, branch, base, leftoverMessage(runId), author);
  if (await madeWorktree(root, dir)) {
    await git(["add", "--all", "--", "."], { cwd: dir });
    const staged = await git(["diff", "--cached", "--quiet", "--no-ext-diff"], { cwd: dir, okCodes: [1] });
    if (staged.code === 1) {
      const identity = {
        GIT_AUTHOR_NAME: author.name,
        GIT_AUTHOR_EMAIL: author.email,
        GIT_COMMITTER_NAME: author.name,
        GIT_COMMITTER_EMAIL: author.email,
      };
      await git(["commit", "--quiet", "--no-verify", "--allow-empty-message", "-m", leftoverMessage(runId)], {
        cwd: dir,
        env: identity,
      });
    }
    const head = (await git(["rev-parse", "--verify", "HEAD^{commit}"], { cwd: dir })).stdout.trim();
    await git(["update-ref", `refs/heads/${branch}`, head], { cwd: root });
    return head;
  }
  if (branch !== runBranch(runId)) return base;
  return (await branchTip(root, branch)) ?? base;
}

/** Remove the worktree (its change is recorded on the branch, which stays) and git's record of it. */
export async function removeWorktree(root: string, dir: string): Promise<void> {
  try {
    if (await exists(dir)) await git(["worktree", "remove", "--force", "--force", "--", dir], { cwd: root });
  } catch (error) {
    if (!(error instanceof GitError)) throw error;
    await rm(dir, { recursive: true, force: true });
  }
  await pruneWorktrees(root);
}

/** Forget the worktrees of `root` whose directories are gone. */
export async function pruneWorktrees(root: string): Promise<void> {
  await git(["worktree", "prune"], { cwd: root });
}
