/**
 * The git locks start-up judges before it records a run_as run's change (workspace/locks.ts, owned.ts): of a
 * repository a pool user owns only the lock of the run's branch in the project is the Runner's, and nothing of
 * the run's `.git` is read — not even through a symlink the run made to a FIFO, which would hold start-up forever.
 *
 * Handing a directory to another uid needs root (CI runs the suite as root); as any other user this file's tests
 * are skipped, and the describe title says why.
 */
import { execFileSync } from "node:child_process";
import {
  existsSync,
  lchownSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { clearStaleLocks, STALE_GIT_LOCK_MS } from "../../src/workspace/locks.js";
import { runBranch } from "../../src/workspace/worktree.js";
import { newRunId } from "../support/harness.js";
import { IS_ROOT } from "../support/test-user.js";

/** A uid that is not the Runner's (the owner of a pool user's workspace); no account is needed for lchown. */
const OTHER_UID = 65534;
/** Bound on one sweep: far past what reading a few files takes, and it fails a sweep held by a FIFO. */
const SWEEP_BOUND_MS = 20_000;

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A project (a git repository with one commit) and a run_as run's workspace dir beside it, owned by OTHER_UID. */
function setUp(): { root: string; dir: string; runId: string; branch: string } {
  const tmp = mkdtempSync(join(tmpdir(), "wc-owned-locks-"));
  dirs.push(tmp);
  const root = join(tmp, "project");
  mkdirSync(root);
  const git = (...args: string[]) =>
    execFileSync("git", ["-C", root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", ...args], {
      stdio: "ignore",
    });
  git("init", "-q", "-b", "main");
  writeFileSync(join(root, "README.md"), "demo\n");
  git("add", "-A");
  git("commit", "-qm", "initial");
  const runId = newRunId();
  const branch = runBranch(runId);
  git("branch", branch);
  const dir = join(tmp, "workspaces", runId);
  mkdirSync(dir, { recursive: true });
  return { root, dir, runId, branch };
}

function bounded<T>(work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error("the lock sweep did not end")), SWEEP_BOUND_MS);
  });
  return Promise.race([work, bound]).finally(() => clearTimeout(timer));
}

/** The lock of `branch` in the project, last written `ageMs` ago. */
function plantRefLock(root: string, branch: string, ageMs: number): string {
  const lock = join(root, ".git", "refs", "heads", `${branch}.lock`);
  mkdirSync(dirname(lock), { recursive: true });
  writeFileSync(lock, "0".repeat(40));
  const when = (Date.now() - ageMs) / 1000;
  utimesSync(lock, when, when);
  return lock;
}

describe.skipIf(!IS_ROOT)("git locks of a run_as run's own repository (needs root to hand it to another uid)", () => {
  it("removes a stale lock of the run's branch in the project, and waits for a young one", async () => {
    const { root, dir, branch } = setUp();
    mkdirSync(join(dir, ".git"));
    lchownSync(join(dir, ".git"), OTHER_UID, OTHER_UID);
    lchownSync(dir, OTHER_UID, OTHER_UID);
    const stale = plantRefLock(root, branch, STALE_GIT_LOCK_MS * 4);
    expect(await bounded(clearStaleLocks(root, dir, branch, Date.now()))).toEqual({ removed: 1, waiting: 0 });
    expect(existsSync(stale)).toBe(false);
    const young = plantRefLock(root, branch, 0);
    expect(await bounded(clearStaleLocks(root, dir, branch, Date.now()))).toEqual({ removed: 0, waiting: 1 });
    expect(existsSync(young)).toBe(true);
  });

  it("reads nothing of the run's .git: one made a symlink to a FIFO does not hold the sweep", async () => {
    const { root, dir, branch } = setUp();
    const fifo = join(dirname(dir), "fifo");
    execFileSync("mkfifo", [fifo]);
    symlinkSync(fifo, join(dir, ".git"));
    lchownSync(join(dir, ".git"), OTHER_UID, OTHER_UID);
    lchownSync(dir, OTHER_UID, OTHER_UID);
    expect(await bounded(clearStaleLocks(root, dir, branch, Date.now()))).toEqual({ removed: 0, waiting: 0 });
  });
});
