/**
 * One page of a recorded change (design §16, `get_coding_agent_changes`): the files between the base and the head
 * commit with their status and line counts, and the unified diff from a byte offset, cut to the caller's
 * `max_bytes` (measured as the JSON string it travels as) at a line end when one is near. Read from the project's
 * repository, so it answers after the worktree is gone. Project content: the caller sends it to the Server and
 * nowhere else (never a log line, never the store). `changesOf` answers `run.changes` for a run from its recorded
 * base and head (store/types.ts WorkspaceRow).
 */
import {
  CHANGED_FILES_BUDGET_BYTES,
  type ChangedFile,
  MAX_CHANGE_DIFF_BYTES,
  MAX_CHANGED_FILES,
  MAX_CHANGED_PATH_BYTES,
  type RunChanges,
  truncateUtf8,
  utf8Length,
} from "@webcodex/protocol";
import type { ProjectConfig } from "../config/config.js";
import type { Logger } from "../logger.js";
import type { DispatchStore } from "../store/types.js";
import { git, gitPrefix } from "./git.js";
import { errName } from "./log-fields.js";

export type ChangesOutcome =
  | { ok: true; changes: RunChanges }
  | { ok: false; code: "not_found" | "invalid_request" | "internal"; message: string };

export const NOT_A_WORKTREE_PROJECT =
  'The run\'s project does not use workspaces (workspace = "shared"): it has no recorded change.';
export const CHANGES_UNREADABLE = "The Runner could not read the run's change from the project's repository.";

const DIFF_FLAGS = ["--no-ext-diff", "--no-textconv", "--no-color", "--find-renames", "--no-relative"];

export interface ChangePage {
  files: ChangedFile[];
  files_truncated: boolean;
  diff: string;
  next_offset: number | null;
  diff_truncated: boolean;
}

function jsonBytes(text: string): number {
  return utf8Length(JSON.stringify(text));
}

function listedPath(path: string): { path: string; path_truncated?: true } {
  return utf8Length(path) > MAX_CHANGED_PATH_BYTES
    ? { path: truncateUtf8(path, MAX_CHANGED_PATH_BYTES).text, path_truncated: true }
    : { path };
}

/** `--name-status -z` and `--numstat -z` of base..head, zipped in git's order. */
async function changedFiles(
  root: string,
  base: string,
  head: string,
): Promise<{ files: ChangedFile[]; truncated: boolean }> {
  const range = [base, head];
  const status = (await git(["diff", "--name-status", "-z", ...DIFF_FLAGS, ...range, "--"], { cwd: root })).stdout;
  const numstat = (await git(["diff", "--numstat", "-z", ...DIFF_FLAGS, ...range, "--"], { cwd: root })).stdout;
  const s = status.split("\0");
  const n = numstat.split("\0");
  const files: ChangedFile[] = [];
  let bytes = 2;
  let truncated = false;
  let i = 0;
  let j = 0;
  while (i < s.length && s[i] !== "") {
    const code = s[i++] ?? "";
    const renamed = code.startsWith("R") || code.startsWith("C");
    const oldPath = renamed ? (s[i++] ?? "") : null;
    const path = s[i++] ?? "";
    // numstat: "ins\tdel\tpath" or, for a rename, "ins\tdel\t" then old and new paths as their own fields.
    const counts = (n[j++] ?? "").split("\t");
    if (renamed) j += 2;
    const binary = counts[0] === "-";
    const entry: ChangedFile = {
      ...listedPath(path),
      ...(oldPath !== null ? { old_path: listedPath(oldPath).path } : {}),
      status: code.startsWith("A")
        ? "added"
        : code.startsWith("D")
          ? "deleted"
          : renamed && code.startsWith("R")
            ? "renamed"
            : renamed
              ? "added"
              : "modified",
      insertions: binary ? 0 : Number.parseInt(counts[0] ?? "0", 10) || 0,
      deletions: binary ? 0 : Number.parseInt(counts[1] ?? "0", 10) || 0,
      binary,
    };
    const size = utf8Length(JSON.stringify(entry)) + 1;
    if (files.length >= MAX_CHANGED_FILES || bytes + size > CHANGED_FILES_BUDGET_BYTES) {
      truncated = true;
      break;
    }
    files.push(entry);
    bytes += size;
  }
  return { files, truncated };
}

/** The longest piece of `diff` from `offset` whose JSON string is at most `maxBytes`, ending at a line end if one is in its second half. */
function cutPage(diff: Buffer, offset: number, maxBytes: number): { text: string; end: number } {
  let end = Math.min(diff.length, offset + maxBytes);
  for (;;) {
    let text = diff.subarray(offset, end).toString("utf8");
    // A cut inside a multi-byte character leaves U+FFFD at the end: step back to the character's start.
    while (end < diff.length && text.endsWith("\uFFFD") && end > offset) {
      end -= 1;
      text = diff.subarray(offset, end).toString("utf8");
    }
    if (end < diff.length) {
      const newline = diff.lastIndexOf(0x0a, end - 1);
      if (newline >= offset + Math.floor((end - offset) / 2)) {
        end = newline + 1;
        text = diff.subarray(offset, end).toString("utf8");
      }
    }
    const size = jsonBytes(text);
    if (size <= maxBytes || end <= offset) return { text, end };
    // Escapes made it longer than the budget: shrink by what is over and try again.
    end = Math.max(offset, end - Math.max(1, size - maxBytes));
  }
}

export async function changePage(
  root: string,
  base: string,
  head: string,
  offset: number,
  maxBytes: number,
): Promise<ChangePage> {
  const { files, truncated } = await changedFiles(root, base, head);
  const out = await gitPrefix(["diff", ...DIFF_FLAGS, base, head, "--"], { cwd: root }, MAX_CHANGE_DIFF_BYTES);
  const diff = out.stdout;
  const start = Math.min(offset, diff.length);
  const page = cutPage(diff, start, maxBytes);
  return {
    files,
    files_truncated: truncated,
    diff: page.text,
    next_offset: page.end < diff.length ? page.end : null,
    diff_truncated: out.truncated,
  };
}

/** One page of a run's recorded change; `project` is the run's, undefined when no longer configured. */
export async function changesOf(
  store: DispatchStore,
  log: Logger,
  req: { runId: string; project: ProjectConfig | undefined; offset: number; maxBytes: number },
): Promise<ChangesOutcome> {
  const { runId, project, offset, maxBytes } = req;
  const row = store.workspace(runId);
  if (!row || !project) return { ok: false, code: "invalid_request", message: NOT_A_WORKTREE_PROJECT };
  const known = { run_id: runId, base_commit: row.base_commit, branch: row.branch };
  if (row.head_commit === null) {
    return {
      ok: true,
      changes: { ...known, recorded: false, files: [], files_truncated: false, diff: "", diff_truncated: false },
    };
  }
  try {
    const page = await changePage(project.root, row.base_commit, row.head_commit, offset, maxBytes);
    return {
      ok: true,
      changes: {
        ...known,
        recorded: true,
        head_commit: row.head_commit,
        files: page.files,
        files_truncated: page.files_truncated,
        diff: page.diff,
        ...(page.next_offset !== null ? { next_cursor: String(page.next_offset) } : {}),
        diff_truncated: page.diff_truncated,
      },
    };
  } catch (error) {
    log.error({ run_id: runId, err_name: errName(error) }, "reading the run's change failed");
    return { ok: false, code: "internal", message: CHANGES_UNREADABLE };
  }
}
