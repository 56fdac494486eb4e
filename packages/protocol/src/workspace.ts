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

// ---- Applying a change (apply_coding_agent_changes, link run.apply) --------------------------------------------

export const TARGET_BRANCH_RULE = `a branch of the project (${BASE_REF_RULE}; not HEAD)`;
/** The branch a run's change is brought into: a branch name (never a commit, an option or an expression). */
export const TargetBranch = z
  .string()
  .refine((ref) => isBaseRef(ref) && ref !== "HEAD", { message: `must be ${TARGET_BRANCH_RULE}` })
  .describe("The project's branch to bring the run's change into (it must exist).");

/**
 * How an apply ended. `fast_forward`: the target moved to the run's head; `merged`: a merge commit of the target
 * and the run's head (it merged cleanly); `up_to_date`: the target already contains the run's head; `conflict`:
 * it does not merge cleanly — nothing was changed, `conflicts` names the paths.
 */
export const APPLY_RESULTS = ["fast_forward", "merged", "up_to_date", "conflict"] as const;
export type ApplyResultKind = (typeof APPLY_RESULTS)[number];

/**
 * Why an apply was refused (nothing was changed, and nothing is remembered under the idempotency key: fix the cause
 * and retry with the same key). The Server words each one (runs/apply.ts).
 */
export const APPLY_REFUSALS = [
  /** The run's project uses workspace = "shared": a run there has no branch of its own. */
  "shared_project",
  /** The run has not ended yet. */
  "not_terminal",
  /** The run ended but its change is not recorded yet (the Runner records it at its next start-up). */
  "change_not_recorded",
  /** The run's head is its base: it changed nothing. */
  "no_change",
  /** `target_branch` names no branch of the project. */
  "unknown_branch",
  /** The target is checked out in a worktree other than the project's root: its files would not follow. */
  "checked_out_elsewhere",
  /** The target is checked out in the project's root and the tree has uncommitted work (`paths`). */
  "dirty_tree",
  /** A merge, rebase, cherry-pick or revert is in progress on the target in the project's root. */
  "operation_in_progress",
  /** The target moved while the change was being applied: nothing was changed; retry. */
  "target_moved",
  /** This run has been applied under MAX_APPLIES_PER_RUN idempotency keys already. */
  "apply_limit",
] as const;
export type ApplyRefusalReason = (typeof APPLY_REFUSALS)[number];

/** At most this many paths are named in one answer (conflicts, uncommitted work)... */
export const MAX_APPLY_PATHS = 100;
/** ...each at most MAX_CHANGED_PATH_BYTES UTF-8 bytes (cut at a character boundary), so at most that many characters. */
const ApplyPath = z.string().max(MAX_CHANGED_PATH_BYTES);
/** An apply's idempotency key as the link carries it: the SHA-256 of the caller's key, in hex. */
export const ApplyKeyHash = z.string().regex(/^[0-9a-f]{64}$/, "must be the SHA-256 of the idempotency key, in hex");
/** Idempotency keys one run's applies are remembered under (the Runner refuses `apply_limit` past it). */
export const MAX_APPLIES_PER_RUN = 64;
/** Longest the Server lets the Runner take to apply (several bounded git commands on the project's repository). */
export const APPLY_TIMEOUT_MS = 120_000;

/** What an apply did (or, for `conflict`, would not do). Paths are project content: to the caller only. */
export const RunApply = z
  .object({
    run_id: RunId,
    target_branch: TargetBranch,
    result: z.enum(APPLY_RESULTS),
    /** Whether the target branch moved (fast_forward, merged). */
    applied: z.boolean(),
    /** The run's recorded head (the change applied). */
    head_commit: CommitId,
    /** The target's commit before; `target_after` is where it is now (the same unless applied). */
    target_before: CommitId,
    target_after: CommitId,
    /** Only for `conflict`: the conflicting paths (at most MAX_APPLY_PATHS), and whether there were more. */
    conflicts: z.array(ApplyPath).max(MAX_APPLY_PATHS).optional(),
    conflicts_truncated: z.boolean().optional(),
  })
  .strict();
export type RunApply = z.infer<typeof RunApply>;

/** A refused apply: why, and for `dirty_tree` the uncommitted paths (at most MAX_APPLY_PATHS). */
export const ApplyRefusal = z
  .object({
    reason: z.enum(APPLY_REFUSALS),
    paths: z.array(ApplyPath).max(MAX_APPLY_PATHS).optional(),
    paths_truncated: z.boolean().optional(),
  })
  .strict();
export type ApplyRefusal = z.infer<typeof ApplyRefusal>;

// One answer (its paths at their longest) must fit one link frame.
if (MAX_APPLY_PATHS * (MAX_CHANGED_PATH_BYTES * 6 + 8) + 64 * 1024 > MAX_FRAME_BYTES) {
  throw new Error("an apply answer does not fit one link frame");
}
