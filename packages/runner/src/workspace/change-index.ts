/**
 * What a recorded change is, computed once per (base, head) pair (design §16, `get_coding_agent_changes`): the
 * file listing with line counts, the whole diff's length, and where each file's piece of the diff lies in it
 * (with a digest of its bytes), so that a page needs only the diff of that page's files. Two commits never change,
 * so neither does this: indexes are kept in a small cache, least recently used first out, bounded by count
 * (CHANGE_INDEX_CACHE_ENTRIES) and by bytes (CHANGE_INDEX_CACHE_BYTES); one bigger than the byte bound is not kept.
 * Project content (paths): held in memory only, never logged or stored.
 */
import { createHash } from "node:crypto";
import {
  CHANGED_FILES_BUDGET_BYTES,
  type ChangedFile,
  MAX_CHANGE_DIFF_BYTES,
  MAX_CHANGED_FILES,
  MAX_CHANGED_PATH_BYTES,
  truncateUtf8,
  utf8Length,
} from "@webcodex/protocol";
import { type GitOptions, git, gitPrefix } from "./git.js";

/** Most (base, head) indexes kept. */
export const CHANGE_INDEX_CACHE_ENTRIES = 32;
/** Most bytes (estimated: paths, listing, offsets) all kept indexes hold together. */
export const CHANGE_INDEX_CACHE_BYTES = 8 * 1024 * 1024;
/** What an index's piece costs besides its paths (offsets, digest, array slots), for the byte bound. */
const PIECE_OVERHEAD_BYTES = 96;

export const DIFF_FLAGS = ["--no-ext-diff", "--no-textconv", "--no-color", "--find-renames", "--no-relative"];

/** How the change code runs git (git.ts); tests count the calls. */
export interface GitRunner {
  git(args: readonly string[], options: GitOptions): Promise<{ stdout: string; code: number }>;
  gitPrefix: typeof gitPrefix;
}
export const GIT: GitRunner = { git: (args, options) => git(args, options), gitPrefix };

/** One file's piece of the whole diff: bytes [start, end), the paths that select it, a digest of its bytes. */
export interface DiffPiece {
  start: number;
  end: number;
  pathspec: string[];
  digest: string;
}

export interface ChangeIndex {
  files: ChangedFile[];
  files_truncated: boolean;
  /** Length of the whole diff, at most MAX_CHANGE_DIFF_BYTES; `diff_truncated` when it was cut there. */
  diff_bytes: number;
  diff_truncated: boolean;
  /** The pieces in the diff's order; null when they could not be matched to the files (pages read it whole). */
  pieces: DiffPiece[] | null;
  /** Estimated memory, for the cache's byte bound. */
  bytes: number;
}

function listedPath(path: string): { path: string; path_truncated?: true } {
  return utf8Length(path) > MAX_CHANGED_PATH_BYTES
    ? { path: truncateUtf8(path, MAX_CHANGED_PATH_BYTES).text, path_truncated: true }
    : { path };
}

/** A file of the change as git lists it: what selects it and how many `diff --git` sections it makes. */
interface Entry {
  pathspec: string[];
  sections: number;
}

/** `--name-status -z` and `--numstat -z` of base..head, zipped in git's order; every entry for the pieces. */
async function listFiles(
  run: GitRunner,
  root: string,
  base: string,
  head: string,
): Promise<{ files: ChangedFile[]; truncated: boolean; entries: Entry[]; bytes: number }> {
  const range = [base, head];
  const status = (await run.git(["diff", "--name-status", "-z", ...DIFF_FLAGS, ...range, "--"], { cwd: root })).stdout;
  const numstat = (await run.git(["diff", "--numstat", "-z", ...DIFF_FLAGS, ...range, "--"], { cwd: root })).stdout;
  const s = status.split("\0");
  const n = numstat.split("\0");
  const files: ChangedFile[] = [];
  const entries: Entry[] = [];
  let bytes = 2;
  let truncated = false;
  let i = 0;
  let j = 0;
  while (i < s.length && s[i] !== "") {
    const code = s[i++] ?? "";
    const renamed = code.startsWith("R") || code.startsWith("C");
    const oldPath = renamed ? (s[i++] ?? "") : null;
    const path = s[i++] ?? "";
    // A type change (file ↔ symlink) is a deletion and an addition in the patch: two sections.
    entries.push({ pathspec: oldPath !== null ? [oldPath, path] : [path], sections: code.startsWith("T") ? 2 : 1 });
    // numstat: "ins\tdel\tpath" or, for a rename, "ins\tdel\t" then old and new paths as their own fields.
    const counts = (n[j++] ?? "").split("\t");
    if (renamed) j += 2;
    if (truncated) continue;
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
      continue;
    }
    files.push(entry);
    bytes += size;
  }
  return { files, truncated, entries, bytes };
}

export function digestOf(bytes: Buffer): string {
  return createHash("sha256").update(bytes).digest("base64");
}

/** Where each `diff --git` section of `diff` starts (a content line never does: it starts with ' ', '+', '-' or '\'). */
function sectionStarts(diff: Buffer): number[] {
  const marker = Buffer.from("diff --git ");
  const starts = diff.subarray(0, marker.length).equals(marker) ? [0] : [];
  const needle = Buffer.from("\ndiff --git ");
  for (let at = diff.indexOf(needle); at >= 0; at = diff.indexOf(needle, at + 1)) starts.push(at + 1);
  return starts;
}

/** The entries' pieces of `diff` (the whole diff's first bytes when `cut`), or null when its sections do not match them. */
function piecesOf(diff: Buffer, cut: boolean, entries: readonly Entry[]): DiffPiece[] | null {
  const starts = sectionStarts(diff);
  const wanted = entries.reduce((sum, e) => sum + e.sections, 0);
  if (cut ? starts.length > wanted : starts.length !== wanted) return null;
  if (starts.length > 0 && starts[0] !== 0) return null;
  const pieces: DiffPiece[] = [];
  let k = 0;
  for (const entry of entries) {
    if (k >= starts.length) break;
    const start = starts[k] ?? 0;
    k += entry.sections;
    const end = k < starts.length ? (starts[k] ?? diff.length) : diff.length;
    pieces.push({ start, end, pathspec: entry.pathspec, digest: digestOf(diff.subarray(start, end)) });
  }
  return pieces;
}

/**
 * The index of base..head in the repository at `root`, and the whole diff it was made from (at most
 * MAX_CHANGE_DIFF_BYTES) so the page that asked for it needs no other git call: three git commands.
 */
export async function buildIndex(
  run: GitRunner,
  root: string,
  base: string,
  head: string,
): Promise<{ index: ChangeIndex; diff: Buffer }> {
  const listed = await listFiles(run, root, base, head);
  const out = await run.gitPrefix(["diff", ...DIFF_FLAGS, base, head, "--"], { cwd: root }, MAX_CHANGE_DIFF_BYTES);
  const pieces = piecesOf(out.stdout, out.truncated, listed.entries);
  let bytes = listed.bytes;
  for (const piece of pieces ?? []) {
    bytes += PIECE_OVERHEAD_BYTES + piece.pathspec.reduce((sum, p) => sum + utf8Length(p), 0);
  }
  const index: ChangeIndex = {
    files: listed.files,
    files_truncated: listed.truncated,
    diff_bytes: out.stdout.length,
    diff_truncated: out.truncated,
    pieces,
    bytes,
  };
  return { index, diff: out.stdout };
}

/** Indexes by repository and commit pair, least recently used first out (bounds above). */
export class ChangeIndexCache {
  readonly #entries = new Map<string, ChangeIndex>();
  #bytes = 0;

  constructor(
    readonly maxEntries = CHANGE_INDEX_CACHE_ENTRIES,
    readonly maxBytes = CHANGE_INDEX_CACHE_BYTES,
  ) {}

  static key(root: string, base: string, head: string): string {
    return `${root}\0${base}\0${head}`;
  }

  get(key: string): ChangeIndex | undefined {
    const index = this.#entries.get(key);
    if (index) {
      this.#entries.delete(key);
      this.#entries.set(key, index);
    }
    return index;
  }

  set(key: string, index: ChangeIndex): void {
    this.delete(key);
    if (index.bytes > this.maxBytes) return;
    this.#entries.set(key, index);
    this.#bytes += index.bytes;
    for (const [old, kept] of this.#entries) {
      if (this.#entries.size <= this.maxEntries && this.#bytes <= this.maxBytes) break;
      this.#entries.delete(old);
      this.#bytes -= kept.bytes;
    }
  }

  delete(key: string): void {
    const index = this.#entries.get(key);
    if (!index) return;
    this.#entries.delete(key);
    this.#bytes -= index.bytes;
  }

  get size(): number {
    return this.#entries.size;
  }

  get bytes(): number {
    return this.#bytes;
  }
}
