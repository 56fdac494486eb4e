/**
 * The workspaces of a Runner's worktree runs (design §16), for the run manager: made at the start of a run's
 * setup, their change recorded when the run ends (before its terminal is reported), answered page by page to
 * `run.changes`, and found again at start-up — a change a previous process did not record is recorded then and
 * every leftover worktree is removed. The store holds each one's branch, base and head (store/types.ts
 * WorkspaceRow); git is run only through git.ts, serialized per project repository for what writes to it.
 *
 * A continuation (design §17) works in its parent's workspace: on the parent's branch, from the parent's recorded
 * head, in the directory the branch names (`<dir>/<first run of the conversation>`): the parent's kept worktree
 * as it is when it is exactly that head plus ignored files (warm.ts), else made again there. Its own change is its
 * turn's: parent head → its head.
 *
 * A run (not run_as) whose base is the commit of a spare worktree (checked out ahead at the project's HEAD,
 * spares.ts) takes it: its start moves a directory and makes a branch instead of checking out every file.
 *
 * Nothing of a change's content (paths, diff) is logged or stored: log lines carry run ids and error names.
 */
import { readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { RUN_ID_PATTERN, type RunWorkspace } from "@webcodex/protocol";
import type { ProjectConfig } from "../config/config.js";
import { failpoint } from "../failpoints.js";
import type { Logger } from "../logger.js";
import type { DispatchStore, WorkspaceRow } from "../store/types.js";
import { type ApplyOutcome, applyOnce } from "./applies.js";
import { type ChangesOutcome, changesOf } from "./changes.js";
import { clearStaleLocks, STALE_GIT_LOCK_MS } from "./locks.js";
import { errName, failure } from "./log-fields.js";
import { MAKING_PREFIX, RECORDING_PREFIX, type WorkspaceOwner } from "./owned.js";
import { pruneRunBranches } from "./prune.js";
import { Spares } from "./spares.js";
import { warmWorktree } from "./warm.js";
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

/** Most kept worktrees one sweep removes, and four times that it looks at (the rest wait for the next one). */
export const WORKSPACE_SWEEP_BATCH = 16;
/** Sweeps run every half keep time, at least this often and at most this often. */
export const WORKSPACE_SWEEP_MIN_INTERVAL_MS = 1_000;
export const WORKSPACE_SWEEP_MAX_INTERVAL_MS = 30_000;
/**
 * How often a previous process's change that start-up could not record (a git lock that may still be held, or
 * a git failure) is tried again, until it is recorded. A lock turns stale STALE_GIT_LOCK_MS after it was last
 * written (workspace/locks.ts), so a change waiting for one is recorded at most this much later than that.
 */
export const WORKSPACE_RECORD_RETRY_MS = 15_000;

export interface WorkspacesOptions {
  /** The directory of this Runner's worktrees (worktree.ts worktreesDir). */
  dir: string;
  store: DispatchStore;
  logger: Logger;
  /** How long a worktree stays once its run's change is recorded (`workspace_keep_secs`); 0: removed at once. */
  keepMs?: number;
  /** Whether the run may still be running (then its worktree is never removed); default: never. */
  mayRun?: (runId: string) => boolean;
  /** The clock of the keep time (tests move it). */
  now?: () => number;
  /** Spare worktrees kept per `worktree` project for runs without run_as (`worktree_spares`); default 0. */
  spares?: number;
}

/** What recording a previous process's change came to: `waiting` on a git lock that may be held; `failed`. */
type LeftoverOutcome = { outcome: "recorded"; head: string } | { outcome: "waiting" } | { outcome: "failed" };

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
  readonly #keepMs: number;
  readonly #mayRun: (runId: string) => boolean;
  readonly #now: () => number;
  /** Worktrees whose change is recorded, kept until `until` (insertion order: ascending `until`). */
  readonly #kept = new Map<string, { root: string; dir: string; until: number }>();
  readonly #timer: NodeJS.Timeout | null;
  #sweeping: Promise<number> | null = null;
  /**
   * Runs of a previous process whose change start-up could not record yet (not a project gone: that stays for
   * the operator), with their project: tried again every WORKSPACE_RECORD_RETRY_MS and at the next start.
   */
  readonly #pending = new Map<string, ProjectConfig>();
  #retryTimer: NodeJS.Timeout | null = null;
  #retrying: Promise<number> | null = null;
  /** Per repository, the shard of run branches the next branch prune starts at (workspace/prune.ts). */
  readonly #pruneShards = new Map<string, number>();
  /** Checkouts made ahead of runs (spares.ts); kept from the end of start-up's recovery. */
  readonly #spares: Spares;
  #closed = false;

  constructor(options: WorkspacesOptions) {
    this.#dir = options.dir;
    this.#store = options.store;
    this.#log = options.logger;
    this.#keepMs = options.keepMs ?? 0;
    this.#mayRun = options.mayRun ?? (() => false);
    this.#now = options.now ?? Date.now;
    this.#spares = new Spares({
      dir: this.#dir,
      count: options.spares ?? 0,
      logger: this.#log,
      serial: (root, work) => this.#serial(root, work),
    });
    const every = Math.min(
      WORKSPACE_SWEEP_MAX_INTERVAL_MS,
      Math.max(WORKSPACE_SWEEP_MIN_INTERVAL_MS, Math.floor(this.#keepMs / 2)),
    );
    this.#timer = this.#keepMs > 0 ? setInterval(() => void this.sweep(), every) : null;
    this.#timer?.unref();
  }

  /**
   * Remove the kept worktrees whose keep time has passed (at most WORKSPACE_SWEEP_BATCH, looking at most at four
   * times that many), never one whose run may still be running; their branches stay. One sweep at a time; the
   * number removed.
   */
  sweep(): Promise<number> {
    if (this.#closed) return Promise.resolve(0);
    this.#sweeping ??= this.#sweepOnce().finally(() => {
      this.#sweeping = null;
    });
    return this.#sweeping;
  }

  async #sweepOnce(): Promise<number> {
    const now = this.#now();
    const due: [string, { root: string; dir: string }][] = [];
    let looked = 0;
    for (const [runId, kept] of this.#kept) {
      if (kept.until > now || due.length >= WORKSPACE_SWEEP_BATCH || looked >= WORKSPACE_SWEEP_BATCH * 4) break;
      looked += 1;
      if (!this.#mayRun(runId)) due.push([runId, kept]);
    }
    let removed = 0;
    for (const [runId, { root, dir }] of due) {
      if (this.#closed) break;
      this.#kept.delete(runId);
      try {
        await this.#serial(root, () => removeWorktree(root, dir));
        removed += 1;
      } catch (error) {
        this.#log.warn({ run_id: runId, err_name: errName(error) }, "removing a kept worktree failed");
      }
    }
    if (removed > 0) this.#log.info({ removed }, "kept worktrees removed");
    return removed;
  }

  /**
   * Stop sweeping and retrying (one under way finishes first) and remove the spare worktrees. Kept worktrees
   * stay: start-up removes them.
   */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    if (this.#retryTimer) clearInterval(this.#retryTimer);
    await this.#sweeping;
    await this.#retrying;
    await this.#spares.close();
  }

  /**
   * Try again to record the changes start-up could not (`#pending`), one at a time; each recorded has its
   * worktree removed. One retry at a time; the number recorded. Runs on a timer while any is pending.
   */
  retryUnrecorded(): Promise<number> {
    if (this.#closed) return Promise.resolve(0);
    this.#retrying ??= this.#retryOnce().finally(() => {
      this.#retrying = null;
    });
    return this.#retrying;
  }

  async #retryOnce(): Promise<number> {
    let recorded = 0;
    for (const [runId, project] of [...this.#pending]) {
      if (this.#closed) break;
      if ((await this.#recordLeftover(runId, project)).outcome !== "recorded") continue;
      this.#pending.delete(runId);
      recorded += 1;
    }
    if (this.#pending.size === 0 && this.#retryTimer) {
      clearInterval(this.#retryTimer);
      this.#retryTimer = null;
    }
    if (recorded > 0) this.#log.info({ recorded, pending: this.#pending.size }, "unrecorded changes recorded on retry");
    return recorded;
  }

  /**
   * Delete the branches of runs past the Runner's retention in each worktree project (workspace/prune.ts), each
   * repository's sweep among its other writes; the number deleted.
   */
  async pruneBranches(projects: readonly ProjectConfig[]): Promise<number> {
    let deleted = 0;
    for (const project of projects) {
      if (project.workspace !== "worktree" || this.#closed) continue;
      const deps = { store: this.#store, mayRun: this.#mayRun };
      try {
        const start = this.#pruneShards.get(project.root) ?? 0;
        const done = await this.#serial(project.root, () => pruneRunBranches(project.root, deps, start));
        this.#pruneShards.set(project.root, done.nextShard);
        deleted += done.deleted;
      } catch (error) {
        this.#log.warn({ project_id: project.id, ...failure(error) }, "pruning run branches failed");
      }
    }
    if (deleted > 0) this.#log.info({ deleted }, "branches of runs past retention pruned");
    return deleted;
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
   * then the worktree made on that branch: a spare at the base taken when there is one (spares.ts; never for a
   * run_as run), else checked out. A failure leaves no worktree (the row, if written, is recorded at the
   * run's end like any other, with no change).
   */
  async create(
    runId: string,
    project: ProjectConfig,
    baseRef: string | undefined,
    owner?: WorkspaceOwner,
  ): Promise<CreateOutcome> {
    const dir = worktreeDir(this.#dir, runId);
    const branch = runBranch(runId);
    const begun = await this.#serial(project.root, async () => {
      let base: string | null;
      try {
        base = await resolveBase(project.root, baseRef ?? "HEAD");
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "resolving the run's base failed");
        return { ok: false, reason: "git_failed" } as const;
      }
      if (base === null) {
        this.#log.warn({ run_id: runId, project_id: project.id }, "base_ref names no commit of the project");
        return { ok: false, reason: "unknown_base_ref" } as const;
      }
      try {
        this.#store.recordWorkspace(runId, { branch, base_commit: base });
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "recording the workspace failed");
        return { ok: false, reason: "unrecorded" } as const;
      }
      return { ok: true, base, spare: owner ? null : this.#spares.claim(project.root, base) } as const;
    });
    if (!begun.ok) return begun;
    const { base, spare } = begun;
    // A spare still being checked out is waited for (spares.ts: it is further along than a checkout begun now).
    const waited = spare !== null && !spare.whole;
    const fromSpare = spare !== null && (await this.#spares.take(project.root, spare, dir, branch));
    try {
      if (!fromSpare) await this.#serial(project.root, () => addWorktree(project.root, dir, branch, base, owner));
    } catch (error) {
      this.#log.error({ run_id: runId, err_name: errName(error) }, "making the run's worktree failed");
      return { ok: false, reason: "git_failed" };
    }
    this.#log.info(
      { run_id: runId, project_id: project.id, base_commit: base, from_spare: fromSpare, waited_for_spare: waited },
      "worktree made",
    );
    return { ok: true, dir, workspace: { mode: "worktree", base_commit: base, branch } };
  }

  /**
   * A continuation's worktree (design §17): the parent's change recorded first if it is not yet (its agent is
   * gone: the parent is terminal), then the child's row — the parent's branch, based on the parent's head —
   * durably, then the parent's worktree kept there taken as it is when it is clean at that head apart from
   * ignored files (warm.ts: no checkout, the agent's dependencies and build output stay), else the worktree made
   * again in the parent's directory on that branch at that head (a run_as workspace always is). A parent without
   * a workspace (it ran in the shared tree) gives the child a fresh worktree from HEAD.
   */
  async continueFrom(
    runId: string,
    parentId: string,
    project: ProjectConfig,
    owner?: WorkspaceOwner,
  ): Promise<CreateOutcome> {
    const parent = this.#store.workspace(parentId);
    if (!parent) return this.create(runId, project, undefined, owner);
    const head = parent.head_commit ?? (await this.#recordParent(parentId, project));
    if (head === null) return { ok: false, reason: "parent_unrecorded" };
    const dir = this.#dirOf(parent);
    // The directory is the child's now: no kept entry of an earlier turn may sweep it away under the child.
    for (const [id, kept] of this.#kept) if (kept.dir === dir) this.#kept.delete(id);
    return this.#serial(project.root, async () => {
      try {
        this.#store.recordWorkspace(runId, { branch: parent.branch, base_commit: head });
      } catch (error) {
        this.#log.error({ run_id: runId, err_name: errName(error) }, "recording the workspace failed");
        return { ok: false, reason: "unrecorded" };
      }
      // The parent's kept worktree, exactly its head plus ignored files: the child's as it is (no checkout).
      if (!owner && (await this.#warm(runId, project.root, dir, parent.branch, head))) {
        this.#log.info({ run_id: runId, parent_run_id: parentId, base_commit: head }, "kept worktree reused warm");
        return { ok: true, dir, workspace: { mode: "worktree", base_commit: head, branch: parent.branch } };
      }
      try {
        // Anything still there is the parent's, whose change is recorded: made again from that head.
        await removeWorktree(project.root, dir);
        if (!(await reopenWorktree(project.root, dir, parent.branch, head, owner))) {
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

  /** Whether the kept worktree at `dir` may be the continuation's as it is (workspace/warm.ts); no on a failure. */
  async #warm(runId: string, root: string, dir: string, branch: string, head: string): Promise<boolean> {
    try {
      return await warmWorktree(root, dir, branch, head);
    } catch (error) {
      this.#log.warn({ run_id: runId, ...failure(error) }, "inspecting the kept worktree failed; made again");
      return false;
    }
  }

  /**
   * Bring the project's spares back to their count at its HEAD (the one a run took replaced, or one of an older
   * HEAD), in the background (spares.ts). Called once a run is dispatched or has ended, so the new spare's
   * checkout does not share the machine with that run's start.
   */
  refillSpares(project: ProjectConfig): void {
    if (project.workspace === "worktree") void this.#spares.refill(project);
  }

  /** A continuation's parent's change: a previous process's goes the way start-up records it (stale locks). */
  async #recordParent(parentId: string, project: ProjectConfig): Promise<string | null> {
    if (!this.#pending.has(parentId)) return this.record(parentId, project);
    const done = await this.#recordLeftover(parentId, project);
    if (done.outcome !== "recorded") return null;
    this.#pending.delete(parentId);
    return done.head;
  }

  /**
   * Record the run's change (the agent's tree must be gone) durably: the head commit, or null when it could not be
   * recorded now (start-up records it then). The worktree is kept `keepMs` (so a follow-up turn could start warm),
   * then swept; with no keep time it is removed at once.
   */
  async record(runId: string, project: ProjectConfig): Promise<string | null> {
    const row = this.#store.workspace(runId);
    if (!row) return null;
    if (row.head_commit !== null) return row.head_commit;
    const dir = this.#dirOf(row);
    return this.#serial(project.root, () => this.#recordIn(runId, row, project, dir, this.#keepMs));
  }

  /**
   * A previous process's change (its run is over, its agent gone): the stale git locks of its worktree removed
   * (locks.ts), then recorded; its worktree removed, or kept `keepMs` (start-up removes it right after anyway).
   * `waiting` while a lock may still be held by a live git; `failed` on any other error. Logs say which, with the
   * run id and the error's name (for git: its subcommand and exit code), never a path.
   */
  async #recordLeftover(runId: string, project: ProjectConfig, keepMs = 0): Promise<LeftoverOutcome> {
    const row = this.#store.workspace(runId);
    if (!row) return { outcome: "failed" };
    if (row.head_commit !== null) return { outcome: "recorded", head: row.head_commit };
    const dir = this.#dirOf(row);
    return this.#serial(project.root, async (): Promise<LeftoverOutcome> => {
      try {
        // Lock files carry the file system's clock, not the Runner's (which tests may move).
        const locks = await clearStaleLocks(project.root, dir, row.branch, Date.now());
        if (locks.removed > 0) {
          this.#log.warn({ run_id: runId, locks_removed: locks.removed }, "stale git locks of a killed git removed");
        }
        if (locks.waiting > 0) {
          this.#log.warn(
            { run_id: runId, locks_waiting: locks.waiting, stale_after_ms: STALE_GIT_LOCK_MS },
            "recording the run's change waits for git locks that may still be held; tried again later",
          );
          return { outcome: "waiting" };
        }
      } catch (error) {
        this.#log.error({ run_id: runId, ...failure(error) }, "checking the worktree's git locks failed");
        return { outcome: "failed" };
      }
      const head = await this.#recordIn(runId, row, project, dir, keepMs);
      return head === null ? { outcome: "failed" } : { outcome: "recorded", head };
    });
  }

  /** Record the change now (on the repository's queue); keep the worktree `keepMs`, or remove it with none. */
  async #recordIn(
    runId: string,
    row: WorkspaceRow,
    project: ProjectConfig,
    dir: string,
    keepMs: number,
  ): Promise<string | null> {
    let head: string;
    try {
      head = await recordChange(project.root, dir, runId, row.branch, row.base_commit, project.workspaceAuthor);
      failpoint("change_after_branch");
      this.#store.recordChange(runId, head);
      failpoint("change_after_store");
    } catch (error) {
      this.#log.error({ run_id: runId, ...failure(error) }, "recording the run's change failed");
      return null;
    }
    this.#log.info({ run_id: runId, head_commit: head }, "run change recorded");
    if (keepMs > 0 && !this.#closed) {
      this.#kept.delete(runId);
      this.#kept.set(runId, { root: project.root, dir, until: this.#now() + keepMs });
      return head;
    }
    try {
      await removeWorktree(project.root, dir);
    } catch (error) {
      this.#log.warn({ run_id: runId, ...failure(error) }, "removing the run's worktree failed");
    }
    return head;
  }

  /** The workspace the store holds for a run, as the run's summary carries it. */
  summary(runId: string): RunWorkspace | undefined {
    const row = this.#store.workspace(runId);
    return row ? workspaceOf(row) : undefined;
  }

  /** One page of the run's recorded change (workspace/changes.ts), for `run.changes`. */
  changes(
    runId: string,
    project: ProjectConfig | undefined,
    offset: number,
    maxBytes: number,
  ): Promise<ChangesOutcome> {
    return changesOf(this.#store, this.#log, { runId, project, offset, maxBytes });
  }

  /**
   * Bring the run's recorded change into `target`, once per idempotency key (workspace/applies.ts), after every
   * earlier write to the project's repository.
   */
  async apply(
    runId: string,
    project: ProjectConfig | undefined,
    terminal: boolean,
    target: string,
    keyHash: string,
  ): Promise<ApplyOutcome> {
    if (project?.workspace !== "worktree") return { ok: false, refusal: { reason: "shared_project" } };
    return this.#serial(project.root, () =>
      applyOnce(this.#store, this.#log, { runId, project, terminal, target, keyHash }),
    );
  }

  /**
   * Start-up, before any run is admitted: record the change of every run a previous process left unrecorded
   * (its agent is gone: recovery and the reaper ran) — its worktree's stale git locks removed first — then remove
   * every worktree left in the Runner's directory but those whose change is still unrecorded. One whose project
   * is no longer configured stays for the operator; one whose recording waits for a git lock that may still be
   * held, or failed, is tried again every WORKSPACE_RECORD_RETRY_MS (and at the next start).
   */
  async recover(
    projectOf: (runId: string) => ProjectConfig | undefined,
    projects: readonly ProjectConfig[],
  ): Promise<{ recorded: number; removed: number; pending: number }> {
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
      // Kept like any other (start-up then removes every leftover directory, this one counted among them).
      const done = await this.#recordLeftover(row.run_id, project, this.#keepMs);
      if (done.outcome === "recorded") recorded += 1;
      else this.#pending.set(row.run_id, project);
    }
    // Directories of changes still unrecorded — their project gone, or their recording pending — are kept.
    const kept = new Set(this.#store.unrecordedWorkspaces().map((row) => this.#dirOf(row)));
    let removed = 0;
    let names: string[] = [];
    try {
      names = await readdir(this.#dir);
    } catch {
      names = [];
    }
    for (const name of names) {
      // A run_as workspace a killed Runner was making, or its scratch repository for recording (owned.ts).
      if (name.startsWith(MAKING_PREFIX) || name.startsWith(RECORDING_PREFIX)) {
        await rm(join(this.#dir, name), { recursive: true, force: true });
        continue;
      }
      if (!RUN_ID_PATTERN.test(name)) continue;
      const dir = worktreeDir(this.#dir, name);
      if (kept.has(dir)) continue;
      for (const [id, k] of this.#kept) if (k.dir === dir) this.#kept.delete(id);
      const project = projectOf(name);
      try {
        if (project) await this.#serial(project.root, () => removeWorktree(project.root, dir));
        else await rm(dir, { recursive: true, force: true });
        removed += 1;
      } catch (error) {
        this.#log.warn({ run_id: name, err_name: errName(error) }, "removing a leftover worktree failed");
      }
    }
    // Spares a previous process left (spares.ts), before the prune below forgets what git knew of them.
    const spares = await this.#spares.recover(projects);
    // A directory removed without its project (no record of it) leaves git's note of it in some repository.
    for (const project of projects) {
      if (project.workspace !== "worktree") continue;
      try {
        await this.#serial(project.root, () => pruneWorktrees(project.root));
      } catch (error) {
        this.#log.warn({ project_id: project.id, err_name: errName(error) }, "pruning worktree records failed");
      }
    }
    const pending = this.#pending.size;
    if (recorded + removed + pending + spares > 0) {
      this.#log.info({ recorded, removed, pending, spares_removed: spares }, "workspaces recovered");
    }
    if (!this.#closed) this.#spares.start(projects);
    if (pending > 0 && !this.#closed && this.#retryTimer === null) {
      this.#retryTimer = setInterval(() => void this.retryUnrecorded(), WORKSPACE_RECORD_RETRY_MS);
      this.#retryTimer.unref();
    }
    return { recorded, removed, pending };
  }
}
