/**
 * Pruning the branches of runs past the Runner's retention (design §16): `webcodex/run/<run_id>` is deleted from
 * the project's repository once that run's row was pruned by retention (the store holds its tombstone, not its
 * row) and no run the store still holds works on the branch — a continuation shares its parent's branch
 * (design §17), so a chain's branch goes only when its last retained run does. A run that may run, or whose change
 * is not recorded yet, keeps its row (retention never prunes those), and so its branch. git itself refuses to
 * delete a branch checked out in a worktree (a kept one), which is then left for a later sweep.
 *
 * Bounded: the branches are looked at one shard at a time (the first character of the run id's random part),
 * each listing at most BRANCH_PRUNE_LIST_BYTES, and at most BRANCH_PRUNE_BATCH are deleted a sweep.
 */
import { RUN_ID_PREFIX, WORKSPACE_BRANCH_PREFIX } from "@webcodex/protocol";
import type { DispatchStore } from "../store/types.js";
import { git, gitPrefix } from "./git.js";
import { branchRunId } from "./worktree.js";

/** Most branches one sweep deletes in one repository (the rest wait for the next sweep). */
export const BRANCH_PRUNE_BATCH = 64;
/** Most bytes of branch names one shard's listing reads (about 20,000 names); the rest wait for a later sweep. */
export const BRANCH_PRUNE_LIST_BYTES = 1024 * 1024;
/** How often the Runner prunes branches (and once at start-up, after recovery). */
export const BRANCH_PRUNE_INTERVAL_MS = 60 * 60 * 1000;
/** The shards: the characters a run id's random part starts with. */
export const BRANCH_SHARDS = "abcdefghijklmnopqrstuvwxyz234567";

export interface BranchPruneDeps {
  store: Pick<DispatchStore, "get" | "tombstone" | "branchInUse">;
  /** Whether the run may still be running in this process. */
  mayRun: (runId: string) => boolean;
}

/** Whether the branch of run `runId` (its name's run) may go: the run is past retention and no retained run uses it. */
export function branchPrunable(branch: string, runId: string, deps: BranchPruneDeps): boolean {
  if (deps.mayRun(runId) || deps.store.get(runId) !== undefined) return false;
  if (deps.store.tombstone(runId) === undefined) return false;
  return !deps.store.branchInUse(branch);
}

/** The run branches of one shard of the repository at `root` (at most BRANCH_PRUNE_LIST_BYTES of names). */
async function shardBranches(root: string, shard: string): Promise<string[]> {
  const pattern = `refs/heads/${WORKSPACE_BRANCH_PREFIX}${RUN_ID_PREFIX}${shard}*`;
  const out = await gitPrefix(
    ["for-each-ref", "--format=%(refname:lstrip=2)", "--", pattern],
    { cwd: root },
    BRANCH_PRUNE_LIST_BYTES,
  );
  const lines = out.stdout.toString("utf8").split("\n");
  // A listing cut at the bound ends in a partial name (or none): only whole lines count.
  if (out.truncated || !out.stdout.toString("utf8").endsWith("\n")) lines.pop();
  return lines.filter((l) => l !== "");
}

/**
 * One sweep of the repository at `root`: from shard `startShard` on, around once, delete the prunable run
 * branches, at most `batch`. Answers how many were deleted and the shard the next sweep starts at (the one this
 * sweep stopped in, when the batch filled up; else where it started).
 */
export async function pruneRunBranches(
  root: string,
  deps: BranchPruneDeps,
  startShard = 0,
  batch = BRANCH_PRUNE_BATCH,
): Promise<{ deleted: number; nextShard: number }> {
  let deleted = 0;
  for (let i = 0; i < BRANCH_SHARDS.length; i++) {
    const shard = (startShard + i) % BRANCH_SHARDS.length;
    for (const branch of await shardBranches(root, BRANCH_SHARDS.charAt(shard))) {
      if (deleted >= batch) return { deleted, nextShard: shard };
      const runId = branchRunId(branch);
      if (runId === null || !branchPrunable(branch, runId, deps)) continue;
      // `branch -D` refuses a branch checked out in a worktree (exit 1): left for a later sweep.
      const out = await git(["branch", "--quiet", "-D", "--", branch], { cwd: root, okCodes: [1] });
      if (out.code === 0) deleted += 1;
    }
  }
  return { deleted, nextShard: startShard };
}
