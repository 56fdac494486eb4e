/**
 * Workspaces (design §16): the vocabulary a run of a `worktree` project shares between the tools, the link and
 * the Runner — the caller's `base_ref`, the run's workspace as observe shows it, and one page of its recorded
 * change (`get_coding_agent_changes`, link `run.changes`). No I/O; the Runner owns git.
 */
import { z } from "zod";
import { MAX_FRAME_BYTES } from "./bounds.js";
import { RunId } from "./ids.js";

/** Longest `base_ref` a caller may name. */
export const MAX_BASE_REF_LENGTH = 200;
export const BASE_REF_RULE =
  `a branch, tag or commit of the project: 1-${MAX_BASE_REF_LENGTH} characters of [A-Za-z0-9._/-], not starting ` +
  "with '-', '/' or '.', without '..', '//', '/.' or '@{', not ending with '/', '.' or '.lock'";
const BASE_REF_CHARS = /^[A-Za-z0-9._/-]+$/;

/**
 * Whether `ref` is a well-formed branch, tag or commit name (git check-ref-format's rules, narrowed to a plain
 * alphabet): never an option (`-…`), never a revision expression (`~`, `^`, `:`, `@{`), never a path escape.
 */
export function isBaseRef(ref: string): boolean {
  if (ref.length < 1 || ref.length > MAX_BASE_REF_LENGTH || !BASE_REF_CHARS.test(ref)) return false;
  if (ref.startsWith("-") || ref.startsWith("/") || ref.startsWith(".")) return false;
  if (ref.endsWith("/") || ref.endsWith(".") || ref.endsWith(".lock")) return false;
  if (ref.includes("..") || ref.includes("//") || ref.includes("/.") || ref.includes("@{")) return false;
  return !ref.split("/").some((part) => part.endsWith(".lock"));
}

export const BaseRef = z
  .string()
  .refine(isBaseRef, { message: `must be ${BASE_REF_RULE}` })
  .describe(
    "Only for a project in workspace mode `worktree`: the branch, tag or commit the run's own checkout starts from " +
      "(default: the project's HEAD when the run is admitted).",
  );

/** A full commit id (SHA-1 or SHA-256 object format). */
export const CommitId = z.string().regex(/^[0-9a-f]{40}(?:[0-9a-f]{24})?$/, "must be a full hex commit id");

/** The branch a worktree run's change lives on: `webcodex/run/<run_id>`. */
export const WORKSPACE_BRANCH_PREFIX = "webcodex/run/";
export const WorkspaceBranch = z
  .string()
  .regex(/^webcodex\/run\/wc_agent_run_[a-z2-7]{26}$/, "must be webcodex/run/<run_id>");

export const WORKSPACE_MODES = ["shared", "worktree"] as const;
export type WorkspaceMode = (typeof WORKSPACE_MODES)[number];

/**
 * A worktree run's workspace as the Runner reports it with the run (RunSummary.workspace) and observe shows it:
 * the commit it started from, its branch, and — once its change is recorded — the branch's head.
 */
export const RunWorkspace = z
  .object({
    mode: z.literal("worktree"),
    base_commit: CommitId,
    branch: WorkspaceBranch,
    head_commit: CommitId.optional(),
  })
  .strict();
export type RunWorkspace = z.infer<typeof RunWorkspace>;

/** The default and the largest diff page (UTF-8 bytes of the page's JSON string) one call returns. */
export const DEFAULT_CHANGES_PAGE_BYTES = 64 * 1024;
export const MAX_CHANGES_PAGE_BYTES = 256 * 1024;
export const MIN_CHANGES_PAGE_BYTES = 1024;
/** The files list of one answer: at most this many entries and this many bytes of their JSON... */
export const MAX_CHANGED_FILES = 1000;
export const CHANGED_FILES_BUDGET_BYTES = 256 * 1024;
/** ...and each path at most this many UTF-8 bytes (a longer one is listed cut, with `path_truncated`). */
export const MAX_CHANGED_PATH_BYTES = 1024;
/** Largest unified diff the Runner pages through; past it the diff ends with `diff_truncated`. */
export const MAX_CHANGE_DIFF_BYTES = 16 * 1024 * 1024;
/** A diff page cursor: the byte offset in the change's unified diff where the next page starts. */
export const ChangesCursor = z.string().regex(/^[0-9]{1,9}$/, "must be the next_cursor of a previous answer");

// One answer must fit one link frame with room to spare.
if (MAX_CHANGES_PAGE_BYTES + CHANGED_FILES_BUDGET_BYTES + 64 * 1024 > MAX_FRAME_BYTES) {
  throw new Error("a changes page does not fit one link frame");
}

export const CHANGE_STATUSES = ["added", "modified", "deleted", "renamed"] as const;
export const ChangedFile = z
  .object({
    path: z.string().max(MAX_CHANGED_PATH_BYTES * 4),
    /** For `renamed`: where it was. */
    old_path: z
      .string()
      .max(MAX_CHANGED_PATH_BYTES * 4)
      .optional(),
    status: z.enum(CHANGE_STATUSES),
    insertions: z.number().int().min(0),
    deletions: z.number().int().min(0),
    binary: z.boolean(),
    path_truncated: z.boolean().optional(),
  })
  .strict();
export type ChangedFile = z.infer<typeof ChangedFile>;

/**
 * One page of a run's recorded change. `recorded: false`: the run has not ended yet (or its change is still
 * being recorded) — nothing but the base and the branch is known; ask again once it ended.
 */
export const RunChanges = z
  .object({
    run_id: RunId,
    recorded: z.boolean(),
    base_commit: CommitId,
    head_commit: CommitId.optional(),
    branch: WorkspaceBranch,
    files: z.array(ChangedFile).max(MAX_CHANGED_FILES),
    /** More files changed than `files` lists (MAX_CHANGED_FILES / CHANGED_FILES_BUDGET_BYTES). */
    files_truncated: z.boolean(),
    diff: z.string(),
    /** Present when the diff goes on: pass it as `cursor` for the next page. */
    next_cursor: ChangesCursor.optional(),
    /** The unified diff is longer than MAX_CHANGE_DIFF_BYTES: its pages end there. */
    diff_truncated: z.boolean(),
  })
  .strict();
export type RunChanges = z.infer<typeof RunChanges>;
