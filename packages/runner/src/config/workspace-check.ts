/**
 * What `workspace = "worktree"` needs of a project root (design §16), checked when the config is loaded (so
 * `check` and start-up say it): the root is the top of a git repository with at least one commit. git runs
 * with an argument array (never a shell), bounded in time and output, with the project's hooks and fsmonitor off.
 */
import { execFileSync } from "node:child_process";
import { realpathSync } from "node:fs";

/** Longest one check's git command may take. */
export const WORKTREE_CHECK_TIMEOUT_MS = 10_000;
/** Most output one check's git command may write. */
const CHECK_MAX_OUTPUT_BYTES = 64 * 1024;

function git(root: string, args: readonly string[]): { ok: true; out: string } | { ok: false; why: string } {
  try {
    const out = execFileSync(
      "git",
      ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-C", root, ...args],
      {
        encoding: "utf8",
        timeout: WORKTREE_CHECK_TIMEOUT_MS,
        maxBuffer: CHECK_MAX_OUTPUT_BYTES,
        stdio: ["ignore", "pipe", "pipe"],
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", GIT_CONFIG_NOSYSTEM: "1", LC_ALL: "C" },
      },
    );
    return { ok: true, out: out.trim() };
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return { ok: false, why: "git is not installed (not found on PATH)" };
    if (code === "ETIMEDOUT") return { ok: false, why: "git did not answer in time" };
    return { ok: false, why: "" };
  }
}

/** Null when `root` can serve worktree runs, else why not and what to do (one sentence for the config error). */
export function worktreeRootProblem(root: string): string | null {
  const top = git(root, ["rev-parse", "--show-toplevel"]);
  if (!top.ok) {
    return top.why !== ""
      ? `workspace = "worktree" needs git: ${top.why}`
      : `workspace = "worktree" needs the root ${root} to be a git repository; run \`git init\` there and commit, or use workspace = "shared"`;
  }
  let topReal = top.out;
  try {
    topReal = realpathSync(top.out);
  } catch {
    // compared as git printed it
  }
  if (topReal !== root) {
    return `workspace = "worktree" needs the root to be the top of its git repository, but ${root} is inside the repository at ${topReal}; set root to ${topReal}, or use workspace = "shared"`;
  }
  const head = git(root, ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]);
  if (!head.ok) {
    return head.why !== ""
      ? `workspace = "worktree" needs git: ${head.why}`
      : `workspace = "worktree" needs at least one commit in ${root} (its HEAD names none); commit something there first, or use workspace = "shared"`;
  }
  return null;
}
