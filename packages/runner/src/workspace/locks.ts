/**
 * git's lock files a killed git leaves behind a run's worktree (design §16, recovery). git writes a file through
 * `<file>.lock` (made with O_EXCL, written, renamed over the file): a git killed mid-write — the Runner's process
 * group or cgroup SIGKILLed, systemd's default — leaves the `.lock`, and every later git that needs that file
 * fails until it is gone. Only the locks of the run's own worktree are ours to judge: the `*.lock` files of its
 * admin dir (`<common dir>/worktrees/<name>/`: its index, its HEAD) and its branch's ref lock
 * (`refs/heads/webcodex/run/<run_id>.lock`); of a run_as run's own repository (owned.ts) only that ref lock in the
 * project, nothing in the repository (the Runner takes no lock there, and reads nothing of the run's `.git`). Never
 * the project's own `.git/index.lock` or another ref's: those may be the operator's own git at work.
 *
 * A lock is stale — no git will finish it, so it may be removed — once BOTH hold:
 * - its mtime is older than STALE_GIT_LOCK_MS, the git command bound (GIT_TIMEOUT_MS) plus GIT_LOCK_MARGIN_MS:
 *   every git a Runner process runs is killed by that process at GIT_TIMEOUT_MS, and the margin covers the kill's
 *   delivery, the process's exit and a coarse file clock;
 * - no process has it open (Linux `/proc/<pid>/fd`): a git orphaned by a Runner killed alone (its pid, not its
 *   group) runs on without that timer, so age alone proves nothing about it; git keeps a lock's descriptor open
 *   from its creation until it renames or removes it (hooks, which could see it closed, are off: git.ts).
 * Each rule covers the other's blind spot: age alone misses a long orphan; the scan alone misses a holder in
 * another pid namespace, a `/proc` we may not read, and the instant between close and rename. A lock younger
 * than the bound, or held, is left: recording waits and is retried later (workspaces.ts).
 */
import { readdir, readFile, readlink, realpath, stat, unlink } from "node:fs/promises";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { RUN_ID_PATTERN, WORKSPACE_BRANCH_PREFIX } from "@webcodex/protocol";
import { GIT_TIMEOUT_MS, git } from "./git.js";
import { runOwned } from "./owned.js";

/** Slack past the git command bound before a lock counts as stale (see the rules above). */
export const GIT_LOCK_MARGIN_MS = 30_000;
/** Age past which a lock nobody holds open is stale: the git command bound plus the margin. */
export const STALE_GIT_LOCK_MS = GIT_TIMEOUT_MS + GIT_LOCK_MARGIN_MS;
/** Most entries of a worktree's admin dir looked at for locks (git keeps a handful there). */
const MAX_ADMIN_ENTRIES = 256;

/** What git's `worktree add` writes into `locked` until the worktree is made (LC_ALL=C: git.ts). */
const INITIALIZING = "initializing";

/**
 * The admin dir of the worktree at `dir` of the repository at `root`, or null when `dir` is no worktree of it:
 * its `.git` file names a directory `<common dir>/worktrees/<name>` whose `gitdir` names `dir/.git` back.
 */
export async function adminDir(root: string, dir: string): Promise<string | null> {
  let pointer: string;
  try {
    pointer = (await readFile(join(dir, ".git"), "utf8")).trim();
  } catch {
    return null;
  }
  if (!pointer.startsWith("gitdir: ")) return null;
  const named = pointer.slice("gitdir: ".length);
  const common = (await git(["rev-parse", "--path-format=absolute", "--git-common-dir"], { cwd: root })).stdout;
  try {
    const admin = await realpath(isAbsolute(named) ? named : resolve(dir, named));
    if (dirname(admin) !== join(await realpath(common.trim()), "worktrees")) return null;
    const back = (await readFile(join(admin, "gitdir"), "utf8")).trim();
    return (await realpath(back)) === (await realpath(join(dir, ".git"))) ? admin : null;
  } catch {
    return null;
  }
}

/**
 * Whether `git worktree add` never finished this worktree (killed mid-way): its `locked` still says so. The
 * agent never ran in it (a run starts once its worktree is made), so it holds no change, whatever its files.
 */
export async function unfinished(admin: string): Promise<boolean> {
  try {
    return (await readFile(join(admin, "locked"), "utf8")).trim() === INITIALIZING;
  } catch {
    return false;
  }
}

/**
 * The lock files now present for the run's workspace (absolute, resolved): its admin dir's (a linked worktree's;
 * null for a run_as run's own repository, whose locks the Runner never takes: owned.ts) and its branch's in the
 * project's common dir `common`.
 */
async function worktreeLocks(admin: string | null, common: string, branch: string): Promise<string[]> {
  const locks: string[] = [];
  if (admin !== null) {
    const names = (await readdir(admin)).slice(0, MAX_ADMIN_ENTRIES);
    for (const name of names) if (name.endsWith(".lock")) locks.push(join(admin, name));
  }
  // Only a workspace branch (`webcodex/run/<run_id>`): no other ref is the Runner's to unlock.
  if (branch.startsWith(WORKSPACE_BRANCH_PREFIX) && RUN_ID_PATTERN.test(branch.slice(WORKSPACE_BRANCH_PREFIX.length))) {
    const refLock = join(common, "refs", "heads", ...branch.split("/"));
    locks.push(`${refLock}.lock`);
  }
  const present: string[] = [];
  for (const lock of locks) {
    try {
      if ((await stat(lock)).isFile()) present.push(lock);
    } catch {
      // not there
    }
  }
  return present;
}

/**
 * The files among `paths` some process has open, by `/proc/<pid>/fd`. Where `/proc` cannot be read (not Linux)
 * nothing is seen and the age rule alone decides.
 */
export async function openedFiles(paths: readonly string[]): Promise<Set<string>> {
  const wanted = new Set(paths);
  const held = new Set<string>();
  let pids: string[];
  try {
    pids = (await readdir("/proc")).filter((p) => /^[0-9]+$/.test(p));
  } catch {
    return held;
  }
  for (const pid of pids) {
    let fds: string[];
    try {
      fds = await readdir(join("/proc", pid, "fd"));
    } catch {
      continue; // gone, or not ours to read
    }
    for (const fd of fds) {
      try {
        const target = await readlink(join("/proc", pid, "fd", fd));
        if (wanted.has(target)) held.add(target);
      } catch {
        // closed meanwhile
      }
    }
    if (held.size === wanted.size) break;
  }
  return held;
}

export interface LockSweep {
  /** Stale locks removed. */
  removed: number;
  /** Locks left because they are younger than STALE_GIT_LOCK_MS or held open: recording must wait. */
  waiting: number;
}

/**
 * Remove the stale locks of the run's worktree at `dir` (see the rules above) and count those that must be waited
 * for. Nothing to do for a directory that is neither a worktree of `root` nor a run_as run's own repository.
 */
export async function clearStaleLocks(root: string, dir: string, branch: string, now: number): Promise<LockSweep> {
  let locks: string[];
  if (await runOwned(dir)) {
    // A run_as run's own repository: nothing in it is read (its `.git` is the run's to make a symlink or a FIFO);
    // the one lock of the Runner's is its branch's in the project, which its recording moves (owned.ts).
    const common = await git(["rev-parse", "--path-format=absolute", "--git-common-dir"], { cwd: root });
    locks = await worktreeLocks(null, await realpath(common.stdout.trim()), branch);
  } else {
    const admin = await adminDir(root, dir);
    if (admin === null) return { removed: 0, waiting: 0 };
    locks = await worktreeLocks(admin, dirname(dirname(admin)), branch);
  }
  if (locks.length === 0) return { removed: 0, waiting: 0 };
  const held = await openedFiles(locks);
  let removed = 0;
  let waiting = 0;
  for (const lock of locks) {
    let mtime: number;
    try {
      mtime = (await stat(lock)).mtimeMs;
    } catch {
      continue; // its git finished meanwhile
    }
    if (held.has(lock) || now - mtime < STALE_GIT_LOCK_MS) {
      waiting += 1;
      continue;
    }
    try {
      await unlink(lock);
      removed += 1;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    }
  }
  return { removed, waiting };
}
