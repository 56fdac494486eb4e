/**
 * The workspaces of a Runner's worktree runs (design §16), for the run manager: made at the start of a run's
 * setup, their change recorded when the run ends (before its terminal is reported), answered page by page to
 * `run.changes`, and found again at start-up — a change a previous process did not record is recorded then and
 * every leftover worktree is removed. The store holds each one's branch, base and head (store/types.ts
 * WorkspaceRow); git is run only through git.ts, serialized per project repository for what writes to it.
 *
 * A continuation (design §17) works in its parent's workspace: on the parent's branch, from the parent's recorded
 * head, in the directory the branch names (`<dir>/<first run of the conversation>`), made again there since a
 * run's worktree is removed once its change is recorded. Its own change is its turn's: parent head → its head.
 *
 * Nothing of a change's content (paths, diff) is logged or stored: log lines carry run ids and error names.
 */
import { readdir, rm } from "node:fs/promises";
import { RUN_ID_PATTERN, type RunChanges, type RunWorkspace } from "@webcodex/protocol";
import type { ProjectConfig } from "../config/config.js";
import type { Logger } from "../logger.js";
import type { DispatchStore, WorkspaceRow } from "../store/types.js";
import { changePage } from "./changes.js";
import {
  addWorktree,
  branchRunId,
  pruneWorktrees,
  recordChange,
  removeWorktree,
  reopenWorktree,
  resolveBase,
  runBranch,
  worktreeDir,
} from "./worktree.js";

/** Why a workspace could not be made; `parent_unrecorded` and `branch_moved` are a continuation's only. */
export type WorkspaceFailure = "git_failed" | "unknown_base_ref" | "unrecorded" | "parent_unrecorded" | "branch_moved";

export type CreateOutcome =
  | { ok: true; dir: string; workspace: RunWorkspace }
  | { ok: false; reason: WorkspaceFailure };

export type ChangesOutcome =
  | { ok: true; changes: RunChanges }
  | { ok: false; code: "not_found" | "invalid_request" | "internal"; message: string };

export const NOT_A_WORKTREE_PROJECT =
  'The run\'s project does not use workspaces (workspace = "shared"): it has no recorded change.';
export const CHANGES_UNREADABLE = "The Runner could not read the run's change from the project's repository.";

function errName(error: unknown): string {
  return error instanceof Error ? error.name : typeof error;
}

export function workspaceOf(row: WorkspaceRow): RunWorkspace {
  return {
    mode: "worktree",
    base_commit: row.base_commit,
    branch: row.branch,
    ...(row.head_commit !== null ? { head_commit: row.head_commit } : {}),
  };
}

export class Workspaces {
  /** The directory of this Runner's worktrees (worktree.ts worktreesDir). */
  readonly #dir: string;
  readonly #store: DispatchStore;
  readonly #log: Logger;
  /** The tail of each repository's queue of writing git commands (worktree add/remove, commits, refs). */
  readonly #queues = new Map<string, Promise<unknown>>();

  constructor(options: { dir: string; store: DispatchStore; logger: Logger }) {
    this.#dir = options.dir;
    this.#store = options.store;
    this.#log = options.logger;
  }

  /** A workspace's directory: the one its branch names (a conversation shares its first run's), else its run's. */
  #dirOf(row: { run_id: string; branch: string }): string {
    return worktreeDir(this.#dir, branchRunId(row.branch) ?? row.run_id);
  }

  /** Run `work` after every earlier write to the repository at `root`. */
  #serial<T>(root: string, work: () => Promise<T>): Promise<T> {
    const prev = this.#queues.get(root) ?? Promise.resolve();
    const next = prev.then(work, work);
    const tail = next.catch(() => undefined);
    this.#queues.set(root, tail);
    void tail.then(() => {
      if (this.#queues.get(root) === tail) this.#queues.delete(root);
    });
    return next;
  }

  /**
   * The run's worktree: `baseRef` (default HEAD) resolved in the project, the branch and base recorded durably,
   * then the worktree made on that branch. A failure leaves no worktree (the row, if written, is recorded at the
   * run's end like any other, with no change).
   */
  async create(runId: string, project: ProjectConfig, baseRef: string | undefined): Promise<CreateOutcome> {
    const dir = worktreeDir(this.#dir, runId);
    const branch = runBranch(runId);
    return this.#serial(project.root, async () => {
      let base: string | null;
      try {
        base = await resolveBase(project.root, baseRef ?? "HEAD");
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "resolving the run's base failed");
        return { ok: false, reason: "git_failed" };
      }
      if (base === null) {
        this.#log.warn({ run_id: runId, project_id: project.id }, "base_ref names no commit of the project");
        return { ok: false, reason: "unknown_base_ref" };
      }
      try {
        this.#store.recordWorkspace(runId, { branch, base_commit: base });
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "recording the workspace failed");
        return { ok: false, reason: "unrecorded" };
      }
      try {
        await addWorktree(project.root, dir, branch, base);
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "making the run's worktree failed");
        return { ok: false, reason: "git_failed" };
      }
      this.#log.info({ run_id: runId, project_id: project.id, base_commit: base }, "worktree made");
      return { ok: true, dir, workspace: { mode: "worktree", base_commit: base, branch } };
    });
  }

  /**
   * A continuation's worktree (design §17): the parent's change recorded first if it is not yet (its agent is
   * gone: the parent is terminal), then the child's row — the parent's branch, based on the parent's head —
   * durably, then the worktree made again in the parent's directory on that branch at that head. A parent
   * without a workspace (it ran in the shared tree) gives the child a fresh worktree from HEAD.
   */
  async continueFrom(runId: string, parentId: string, project: ProjectConfig): Promise<CreateOutcome> {
    const parent = this.#store.workspace(parentId);
    if (!parent) return this.create(runId, project, undefined);
    const head = parent.head_commit ?? (await this.record(parentId, project));
    if (head === null) return { ok: false, reason: "parent_unrecorded" };
    const dir = this.#dirOf(parent);
    return this.#serial(project.root, async () => {
      try {
        this.#store.recordWorkspace(runId, { branch: parent.branch, base_commit: head });
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "recording the workspace failed");
        return { ok: false, reason: "unrecorded" };
      }
      try {
        // Anything still there is the parent's, whose change is recorded: made again from that head.
        await removeWorktree(project.root, dir);
        if (!(await reopenWorktree(project.root, dir, parent.branch, head))) {
          this.#log.warn({ run_id: runId, parent_run_id: parentId }, "the parent's branch moved since its change");
          return { ok: false, reason: "branch_moved" };
        }
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "making the continuation's worktree failed");
        return { ok: false, reason: "git_failed" };
      }
      this.#log.info({ run_id: runId, parent_run_id: parentId, base_commit: head }, "worktree made again");
      return { ok: true, dir, workspace: { mode: "worktree", base_commit: head, branch: parent.branch } };
    });
  }

  /**
   * Record the run's change (the agent's tree must be gone) durably and remove its worktree: the head commit, or
   * null when it could not be recorded now (start-up records it then).
   */
  async record(runId: string, project: ProjectConfig): Promise<string | null> {
    const row = this.#store.workspace(runId);
    if (!row) return null;
    if (row.head_commit !== null) return row.head_commit;
    const dir = this.#dirOf(row);
    return this.#serial(project.root, async () => {
      let head: string;
      try {
        head = await recordChange(project.root, dir, runId, row.branch, row.base_commit, project.workspaceAuthor);
        this.#store.recordChange(runId, head);
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "recording the run's change failed");
        return null;
      }
      this.#log.info({ run_id: runId, head_commit: head }, "run change recorded");
      try {
        await removeWorktree(project.root, dir);
      } catch (error) {
        this.#log.warn({ run_id: runId, err_name: errName(error) }, "removing the run's worktree failed");
      }
      return head;
    });
  }

  /** The workspace the store holds for a run, as the run's summary carries it. */
  summary(runId: string): RunWorkspace | undefined {
    const row = this.#store.workspace(runId);
    return row ? workspaceOf(row) : undefined;
  }

  async changes(
    runId: string,
    project: ProjectConfig | undefined,
    offset: number,
    maxBytes: number,
  ): Promise<ChangesOutcome> {
    const row = this.#store.workspace(runId);
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
      this.#log.error({ run_id: runId, err_name: errName(error) }, "reading the run's change failed");
      return { ok: false, code: "internal", message: CHANGES_UNREADABLE };
    }
  }

  /**
   * Start-up, before any run is admitted: record the change of every run a previous process left unrecorded
   * (its agent is gone: recovery and the reaper ran), then remove every worktree left in the Runner's directory.
   */
  async recover(
    projectOf: (runId: string) => ProjectConfig | undefined,
    projects: readonly ProjectConfig[],
  ): Promise<{ recorded: number; removed: number }> {
    let recorded = 0;
    for (const row of this.#store.unrecordedWorkspaces()) {
      const project = projectOf(row.run_id);
      if (!project) {
        this.#log.warn(
          { run_id: row.run_id },
          "an unrecorded workspace's project is no longer configured; left as it is",
        );
        continue;
      }
      if ((await this.record(row.run_id, project)) !== null) recorded += 1;
    }
    // Directories of changes still unrecorded (their project is gone): kept for the operator.
    const kept = new Set(this.#store.unrecordedWorkspaces().map((row) => this.#dirOf(row)));
    let removed = 0;
    let names: string[] = [];
    try {
      names = await readdir(this.#dir);
    } catch {
      names = [];
    }
    for (const name of names) {
      if (!RUN_ID_PATTERN.test(name)) continue;
      const dir = worktreeDir(this.#dir, name);
      if (kept.has(dir)) continue;
      const project = projectOf(name);
      try {
        if (project) await this.#serial(project.root, () => removeWorktree(project.root, dir));
        else await rm(dir, { recursive: true, force: true });
        removed += 1;
      } catch (error) {
        this.#log.warn({ run_id: name, err_name: errName(error) }, "removing a leftover worktree failed");
      }
    }
    // A directory removed without its project (no record of it) leaves git's note of it in some repository.
    for (const project of projects) {
      if (project.workspace !== "worktree") continue;
      try {
        await this.#serial(project.root, () => pruneWorktrees(project.root));
      } catch (error) {
        this.#log.warn({ project_id: project.id, err_name: errName(error) }, "pruning worktree records failed");
      }
    }
    if (recorded + removed > 0) this.#log.info({ recorded, removed }, "workspaces recovered");
    return { recorded, removed };
  }
}
