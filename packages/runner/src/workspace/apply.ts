/**
 * Bringing a run's recorded change into a branch of its project (design §16, apply_coding_agent_changes), as git
 * steps on the project's repository. The contract:
 *
 * - Never forced: the target moves only to a descendant of where it was — the run's head (fast-forward) or a new
 *   merge commit of the target and the head (made with `git merge-tree --write-tree`, so no index and no tree is
 *   touched to find out whether it merges) — and only from the commit read at the start (`update-ref <new> <old>`,
 *   or `merge --ff-only` in the root).
 * - Never over uncommitted work: a target checked out in the project's root is updated with its working tree
 *   (`merge --ff-only`, hooks and autostash off) only when `git status` shows nothing; otherwise refused with the
 *   paths. A target checked out in another worktree is refused (its files would not follow). A target not checked
 *   out anywhere is updated by ref only.
 * - A conflict changes nothing and names the conflicting paths.
 *
 * Paths are project content: they go back to the caller only, never to a log line or the store.
 */
import { readFile } from "node:fs/promises";
import { isAbsolute, join } from "node:path";
import {
  type ApplyRefusal,
  type ApplyResultKind,
  MAX_APPLY_PATHS,
  MAX_CHANGED_PATH_BYTES,
  truncateUtf8,
  utf8Length,
} from "@webcodex/protocol";
import type { WorkspaceAuthor } from "../config/config.js";
import { GitError, git, gitPrefix } from "./git.js";

/** Most bytes of `git status` / `git merge-tree` output read to name paths (the first MAX_APPLY_PATHS of them). */
export const APPLY_LISTING_BYTES = 512 * 1024;

export interface NamedPaths {
  paths: string[];
  truncated: boolean;
}

export type ApplyStep =
  | {
      kind: "done";
      result: ApplyResultKind;
      target_before: string;
      target_after: string;
      conflicts?: NamedPaths;
    }
  | { kind: "refused"; refusal: ApplyRefusal };

function refused(reason: ApplyRefusal["reason"], named?: NamedPaths): ApplyStep {
  return {
    kind: "refused",
    refusal: { reason, ...(named ? { paths: named.paths, paths_truncated: named.truncated } : {}) },
  };
}

function identity(author: WorkspaceAuthor): Record<string, string> {
  return {
    GIT_AUTHOR_NAME: author.name,
    GIT_AUTHOR_EMAIL: author.email,
    GIT_COMMITTER_NAME: author.name,
    GIT_COMMITTER_EMAIL: author.email,
  };
}

/** NUL-separated fields into at most MAX_APPLY_PATHS paths, each cut to MAX_CHANGED_PATH_BYTES. */
function namePaths(fields: readonly string[], more: boolean): NamedPaths {
  const paths: string[] = [];
  for (const field of fields) {
    if (paths.length >= MAX_APPLY_PATHS) return { paths, truncated: true };
    paths.push(utf8Length(field) > MAX_CHANGED_PATH_BYTES ? truncateUtf8(field, MAX_CHANGED_PATH_BYTES).text : field);
  }
  return { paths, truncated: more };
}

/** NUL-terminated fields of a bounded output; a field cut by the bound is dropped (and reported as `more`). */
function fields(out: { stdout: Buffer; truncated: boolean }): { list: string[]; more: boolean } {
  const parts = out.stdout.toString("utf8").split("\0");
  parts.pop(); // after the last NUL: empty, or a field the bound cut
  return { list: parts.filter((p) => p !== ""), more: out.truncated };
}

async function commitOf(root: string, ref: string): Promise<string | null> {
  const out = await git(["rev-parse", "--verify", "--quiet", `${ref}^{commit}`], { cwd: root, okCodes: [1, 128] });
  return out.code === 0 ? out.stdout.trim() : null;
}

async function isAncestor(root: string, older: string, newer: string): Promise<boolean> {
  const out = await git(["merge-base", "--is-ancestor", older, newer], { cwd: root, okCodes: [1] });
  return out.code === 0;
}

/** Where `ref` is checked out: in the project's root, in another worktree, or nowhere. */
async function checkedOut(root: string, ref: string): Promise<"root" | "elsewhere" | "none"> {
  const out = await git(["worktree", "list", "--porcelain", "-z"], { cwd: root });
  // Records of NUL-terminated lines, separated by an empty line; the first record is the main worktree.
  let where: "root" | "elsewhere" | "none" = "none";
  let path = "";
  for (const line of out.stdout.split("\0")) {
    if (line.startsWith("worktree ")) path = line.slice("worktree ".length);
    else if (line === `branch ${ref}`) where = path === root ? "root" : "elsewhere";
    if (where !== "none") return where;
  }
  return where;
}

/** Whether a merge, cherry-pick or revert is in progress in the root, or a rebase of `ref` anywhere in it. */
async function operationInProgress(root: string, ref: string): Promise<boolean> {
  for (const head of ["MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD"]) {
    if ((await commitOf(root, head)) !== null) return true;
  }
  for (const dir of ["rebase-merge", "rebase-apply"]) {
    const at = (await git(["rev-parse", "--git-path", `${dir}/head-name`], { cwd: root })).stdout.trim();
    try {
      const name = await readFile(isAbsolute(at) ? at : join(root, at), "utf8");
      if (name.trim() === ref) return true;
    } catch {
      // no such rebase
    }
  }
  return false;
}

/** The root's uncommitted work (tracked changes and untracked files; ignored files are not work). */
async function uncommitted(root: string): Promise<NamedPaths> {
  const out = await gitPrefix(
    ["status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all", "--ignore-submodules=none"],
    { cwd: root },
    APPLY_LISTING_BYTES,
  );
  const { list, more } = fields(out);
  // Each entry is "XY path".
  return namePaths(
    list.map((entry) => entry.slice(3)),
    more,
  );
}

/**
 * The tree of `ours` merged with `theirs`, or the conflicting paths. No index, no working tree: an object (the
 * tree) is all it writes. Called again on a replayed conflict: the same two commits give the same paths.
 */
export async function mergeTree(
  root: string,
  ours: string,
  theirs: string,
): Promise<{ clean: true; tree: string } | { clean: false; conflicts: NamedPaths }> {
  const args = ["merge-tree", "--write-tree", "--name-only", "--no-messages", "-z", ours, theirs];
  const out = await gitPrefix(args, { cwd: root, okCodes: [1] }, APPLY_LISTING_BYTES);
  const { list, more } = fields(out);
  const [tree = "", ...conflicted] = list;
  if (out.code === 0) return { clean: true, tree };
  return { clean: false, conflicts: namePaths(conflicted, more) };
}

export interface ApplyRequest {
  runId: string;
  /** The run's recorded head. */
  head: string;
  target: string;
  author: WorkspaceAuthor;
}

/** Apply `req.head` to `req.target` in the repository at `root` (see the header); the caller serializes per root. */
export async function applyChange(root: string, req: ApplyRequest): Promise<ApplyStep> {
  const ref = `refs/heads/${req.target}`;
  const before = await commitOf(root, ref);
  if (before === null) return refused("unknown_branch");
  const where = await checkedOut(root, ref);
  if (where === "elsewhere") return refused("checked_out_elsewhere");
  if (await operationInProgress(root, ref)) return refused("operation_in_progress");
  if (where === "root") {
    const dirty = await uncommitted(root);
    if (dirty.paths.length > 0) return refused("dirty_tree", dirty);
  }
  if (await isAncestor(root, req.head, before)) {
    return { kind: "done", result: "up_to_date", target_before: before, target_after: before };
  }
  let after: string;
  let result: ApplyResultKind;
  if (await isAncestor(root, before, req.head)) {
    after = req.head;
    result = "fast_forward";
  } else {
    const merged = await mergeTree(root, before, req.head);
    if (!merged.clean) {
      return {
        kind: "done",
        result: "conflict",
        target_before: before,
        target_after: before,
        conflicts: merged.conflicts,
      };
    }
    const message = `Merge ${req.runId} into ${req.target}\n\nApplied by the WebCodex Runner (branch webcodex/run/${req.runId}).\n`;
    const commit = await git(["commit-tree", merged.tree, "-p", before, "-p", req.head, "-m", message], {
      cwd: root,
      env: identity(req.author),
    });
    after = commit.stdout.trim();
    result = "merged";
  }
  const moved = await moveTarget(root, ref, where, before, after, req);
  if (moved !== null) return moved;
  return { kind: "done", result, target_before: before, target_after: after };
}

/** Move the target from `before` to `after` (a descendant); null when it moved, else the refusal. */
async function moveTarget(
  root: string,
  ref: string,
  where: "root" | "none",
  before: string,
  after: string,
  req: ApplyRequest,
): Promise<ApplyStep | null> {
  const env = identity(req.author);
  try {
    if (where === "root") {
      // Still checked out here and still at `before` (or the ff-only below fails): update files, index and ref.
      if ((await commitOf(root, "HEAD")) !== before) return refused("target_moved");
      await git(["merge", "--ff-only", "--no-autostash", "--no-stat", "--quiet", after], { cwd: root, env });
    } else {
      await git(["update-ref", "-m", `webcodex: apply ${req.runId}`, ref, after, before], { cwd: root, env });
    }
    return null;
  } catch (error) {
    if (!(error instanceof GitError)) throw error;
    if ((await commitOf(root, ref)) !== before) return refused("target_moved");
    if (where === "root") {
      const dirty = await uncommitted(root);
      if (dirty.paths.length > 0) return refused("dirty_tree", dirty);
    }
    throw error;
  }
}
