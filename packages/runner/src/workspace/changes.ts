/**
 * One page of a recorded change (design §16, `get_coding_agent_changes`): the files between the base and the head
 * commit with their status and line counts, and the unified diff from a byte offset, cut to the caller's
 * `max_bytes` (measured as the JSON string it travels as) at a line end when one is near. Read from the project's
 * repository, so it answers after the worktree is gone. Project content: the caller sends it to the Server and
 * nowhere else (never a log line, never the store). `changesOf` answers `run.changes` for a run from its recorded
 * base and head (store/types.ts WorkspaceRow).
 */
import { type ChangedFile, MAX_CHANGE_DIFF_BYTES, type RunChanges, utf8Length } from "@webcodex/protocol";
import type { ProjectConfig } from "../config/config.js";
import type { Logger } from "../logger.js";
import type { DispatchStore } from "../store/types.js";
import {
  buildIndex,
  ChangeIndexCache,
  DIFF_FLAGS,
  type DiffPiece,
  digestOf,
  GIT,
  type GitRunner,
} from "./change-index.js";
import { errName } from "./log-fields.js";

export type ChangesOutcome =
  | { ok: true; changes: RunChanges }
  | { ok: false; code: "not_found" | "invalid_request" | "internal"; message: string };

export const NOT_A_WORKTREE_PROJECT =
  'The run\'s project does not use workspaces (workspace = "shared"): it has no recorded change.';
export const CHANGES_UNREADABLE = "The Runner could not read the run's change from the project's repository.";

/** Most bytes of paths one page's `git diff -- <paths>` names; a page of more small files reads the whole diff. */
export const PAGE_PATHSPEC_BYTES = 64 * 1024;

export interface ChangePage {
  files: ChangedFile[];
  files_truncated: boolean;
  diff: string;
  next_offset: number | null;
  diff_truncated: boolean;
}

/** The index cache and the git runner a page uses; one of each per Runner process by default. */
export interface ChangeDeps {
  cache: ChangeIndexCache;
  run: GitRunner;
}
const DEFAULT_DEPS: ChangeDeps = { cache: new ChangeIndexCache(), run: GIT };

function jsonBytes(text: string): number {
  return utf8Length(JSON.stringify(text));
}

/**
 * The longest start of `window` (the whole diff's bytes from the page's offset, at most `maxBytes` of them) whose
 * JSON string is at most `maxBytes`, ending at a line end if one is in its second half; `more`: the whole diff
 * goes on past `window`.
 */
function cutPage(window: Buffer, more: boolean, maxBytes: number): { text: string; length: number } {
  let end = window.length;
  const follows = () => more || end < window.length;
  for (;;) {
    let text = window.subarray(0, end).toString("utf8");
    // A cut inside a multi-byte character leaves U+FFFD at the end: step back to the character's start.
    while (follows() && text.endsWith("\uFFFD") && end > 0) {
      end -= 1;
      text = window.subarray(0, end).toString("utf8");
    }
    if (follows() && end > 0) {
      const newline = window.lastIndexOf(0x0a, end - 1);
      if (newline >= Math.floor(end / 2)) {
        end = newline + 1;
        text = window.subarray(0, end).toString("utf8");
      }
    }
    const size = jsonBytes(text);
    if (size <= maxBytes || end <= 0) return { text, length: end };
    // Escapes made it longer than the budget: shrink by what is over and try again.
    end = Math.max(0, end - Math.max(1, size - maxBytes));
  }
}

/** The first piece whose bytes reach past `offset` (pieces are in order and adjacent). */
function firstPiece(pieces: readonly DiffPiece[], offset: number): number {
  let lo = 0;
  let hi = pieces.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if ((pieces[mid]?.end ?? 0) <= offset) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * The whole diff's bytes [from, to) read with only the diff of the files whose pieces cover them, checked against
 * the pieces' digests; null when it cannot be (too many paths for one command, or git answered other bytes: a
 * path git cannot be given as an argument, renames paired otherwise within fewer files) — then the page reads
 * the whole diff.
 */
async function readPieces(
  run: GitRunner,
  root: string,
  range: [string, string],
  pieces: readonly DiffPiece[],
  from: number,
  to: number,
): Promise<Buffer | null> {
  const chosen: DiffPiece[] = [];
  let pathBytes = 0;
  for (let k = firstPiece(pieces, from); k < pieces.length; k++) {
    const piece = pieces[k];
    if (!piece || piece.start >= to) break;
    chosen.push(piece);
    for (const path of piece.pathspec) pathBytes += utf8Length(path) + 1;
    if (pathBytes > PAGE_PATHSPEC_BYTES) return null;
  }
  const first = chosen[0];
  const last = chosen[chosen.length - 1];
  if (!first || !last || first.start > from || last.end < to) return null;
  const out = await run.gitPrefix(
    ["diff", ...DIFF_FLAGS, ...range, "--", ...chosen.flatMap((p) => p.pathspec)],
    { cwd: root, env: { GIT_LITERAL_PATHSPECS: "1" } },
    last.end - first.start,
  );
  if (out.stdout.length !== last.end - first.start) return null;
  for (const piece of chosen) {
    const bytes = out.stdout.subarray(piece.start - first.start, piece.end - first.start);
    if (digestOf(bytes) !== piece.digest) return null;
  }
  return out.stdout.subarray(from - first.start, to - first.start);
}

/**
 * One page of base..head: the files and, from the byte `offset` of the whole diff, at most `maxBytes` of it.
 * The listing and where each file's diff lies are computed once per pair (change-index.ts, three git commands);
 * a later page runs one: the diff of its own files.
 */
export async function changePage(
  root: string,
  base: string,
  head: string,
  offset: number,
  maxBytes: number,
  deps: ChangeDeps = DEFAULT_DEPS,
): Promise<ChangePage> {
  const key = ChangeIndexCache.key(root, base, head);
  let index = deps.cache.get(key);
  let whole: Buffer | null = null;
  if (!index) {
    const built = await buildIndex(deps.run, root, base, head);
    index = built.index;
    whole = built.diff;
    deps.cache.set(key, index);
  }
  const start = Math.min(offset, index.diff_bytes);
  const to = Math.min(index.diff_bytes, start + maxBytes);
  let window: Buffer | null = null;
  if (whole) window = whole.subarray(start, to);
  else if (to === start) window = Buffer.alloc(0);
  else if (index.pieces) window = await readPieces(deps.run, root, [base, head], index.pieces, start, to);
  if (window === null) {
    const out = await deps.run.gitPrefix(
      ["diff", ...DIFF_FLAGS, base, head, "--"],
      { cwd: root },
      MAX_CHANGE_DIFF_BYTES,
    );
    window = out.stdout.subarray(start, to);
  }
  const page = cutPage(window, to < index.diff_bytes, maxBytes);
  const end = start + page.length;
  return {
    files: index.files,
    files_truncated: index.files_truncated,
    diff: page.text,
    next_offset: end < index.diff_bytes ? end : null,
    diff_truncated: index.diff_truncated,
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
