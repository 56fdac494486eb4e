/**
 * Whether a continuation (design §17) may take its parent's kept worktree as it is — warm, with the ignored files
 * the parent's agent produced (dependencies, build output) — instead of a fresh checkout of the parent's head.
 * Only when the tree is exactly what a fresh checkout would give, ignored files aside: a finished linked worktree
 * of this repository, on the parent's branch, its HEAD the parent's recorded head, no operation under way, and
 * clean after an index refresh — no tracked change, no untracked file, no index entry that hides a file from the
 * comparison (assume-unchanged, skip-worktree). Anything else, or any git failure, is a no: the caller makes it
 * again. git runs only through git.ts (hooks and fsmonitor off, no system or global config), with the flags that
 * a run's config could otherwise change (which untracked files count) given explicitly.
 */
import { stat } from "node:fs/promises";
import { join } from "node:path";
import { git, gitPrefix } from "./git.js";
import { adminDir, unfinished } from "./locks.js";

/** Most bytes of `git ls-files -v` read to check the index's entries; a bigger index is made again instead. */
export const WARM_INDEX_LIST_BYTES = 16 * 1024 * 1024;

/** What git leaves in a worktree's admin dir while a merge, rebase, cherry-pick, revert or bisect is under way. */
const UNDER_WAY = [
  "MERGE_HEAD",
  "CHERRY_PICK_HEAD",
  "REVERT_HEAD",
  "sequencer",
  "rebase-merge",
  "rebase-apply",
  "BISECT_LOG",
];

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * True when the worktree at `dir` of the repository at `root` may be reused as it is for a turn on `branch` from
 * `head`. Refreshes the worktree's index (stat data only); changes nothing else. Throws GitError on a git failure.
 */
export async function warmWorktree(root: string, dir: string, branch: string, head: string): Promise<boolean> {
  // A linked worktree of this repository (its `.git` names an admin dir that names it back), finished.
  const admin = await adminDir(root, dir);
  if (admin === null || (await unfinished(admin))) return false;
  for (const name of UNDER_WAY) if (await exists(join(admin, name))) return false;
  const symbolic = await git(["symbolic-ref", "--quiet", "HEAD"], { cwd: dir, okCodes: [1] });
  if (symbolic.code !== 0 || symbolic.stdout.trim() !== `refs/heads/${branch}`) return false;
  const at = await git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], { cwd: dir, okCodes: [1] });
  if (at.code !== 0 || at.stdout.trim() !== head) return false;
  // Stat data refreshed, assume-unchanged ignored (and so cleared for a changed file): 1 = a tracked file differs.
  const refresh = await git(["update-index", "-q", "--really-refresh"], { cwd: dir, okCodes: [1] });
  if (refresh.code !== 0) return false;
  // Any line at all is a staged or unstaged change or an untracked file (ignored files are not listed).
  const status = await gitPrefix(
    ["status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored=no", "--ignore-submodules=none"],
    { cwd: dir },
    0,
  );
  if (status.truncated) return false;
  // Every index entry plainly tracked: `H <path>`, never `h` (assume-unchanged) or `S`/`s` (skip-worktree).
  const index = await gitPrefix(["ls-files", "-v", "-z"], { cwd: dir }, WARM_INDEX_LIST_BYTES);
  if (index.truncated) return false;
  let pos = 0;
  while (pos < index.stdout.length) {
    if (index.stdout[pos] !== 0x48 || index.stdout[pos + 1] !== 0x20) return false;
    const end = index.stdout.indexOf(0, pos);
    if (end < 0) return false;
    pos = end + 1;
  }
  return true;
}
