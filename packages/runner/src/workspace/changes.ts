/**
 * One page of a recorded change (design §16, `get_coding_agent_changes`): the files between the base and the head
 * commit with their status and line counts, and the unified diff from a byte offset, cut to the caller's
 * `max_bytes` (measured as the JSON string it travels as) at a line end when one is near. Read from the project's
 * repository, so it answers after the worktree is gone. Project content: the caller sends it to the Server and
 * nowhere else (never a log line, never the store).
 */
import {
  CHANGED_FILES_BUDGET_BYTES,
  type ChangedFile,
  MAX_CHANGE_DIFF_BYTES,
  MAX_CHANGED_FILES,
  MAX_CHANGED_PATH_BYTES,
  truncateUtf8,
  utf8Length,
} from "@webcodex/protocol";
import { git, gitPrefix } from "./git.js";

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
