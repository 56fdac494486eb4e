/**
 * A run's workspace (design §16–17), as the run lifecycle sees it: a `worktree` project's run gets its own worktree
 * (or continues its parent's) before its turn, and its change is recorded after its turn, before its terminal is
 * reported; the change pages, the apply and the keep-time sweep are answered here for the RunService seam. The git
 * work itself is workspace/workspaces.ts.
 */
import type { RunWorkspace } from "@webcodex/protocol";
import { notStarted, type Terminal } from "../acp/terminal.js";
import type { ProjectConfig } from "../config/config.js";
import type { Logger } from "../logger.js";
import type { DispatchStore } from "../store/types.js";
import type { ApplyOutcome } from "../workspace/applies.js";
import type { ChangesOutcome } from "../workspace/changes.js";
import { BRANCH_PRUNE_INTERVAL_MS } from "../workspace/prune.js";
import { Workspaces } from "../workspace/workspaces.js";
import type { Run } from "./record.js";

/** Why a run's workspace was refused (its terminal message, with the fixed summary of `workspace_failed`). */
export const BASE_REF_NOT_WORKTREE =
  'base_ref is only for a project with workspace = "worktree"; this project\'s runs work in its shared tree.';
export const UNKNOWN_BASE_REF = "base_ref names no branch, tag or commit of the project.";
/** A continuation in a `worktree` project (design §17) works on its parent's branch, from its parent's head. */
export const BASE_REF_WITH_CONTINUATION =
  "base_ref cannot be given with continue_run_id: a follow-up turn continues on its parent's branch, from its parent's recorded head.";
export const PARENT_CHANGE_UNRECORDED =
  "The parent run's change is not recorded yet, so its workspace cannot be continued; the Runner records it at its next start.";
export const PARENT_BRANCH_MOVED =
  "The parent run's branch moved since its change was recorded (a commit or reset outside WebCodex); the Runner never forces a branch. Continue from a fresh run instead.";

export interface RunWorkspacesOptions {
  /** Where worktree runs get their worktrees. */
  dir: string;
  store: DispatchStore;
  logger: Logger;
  /** How long a terminal run's worktree is kept. */
  keepMs: number;
  /** Spare worktrees kept per `worktree` project for runs without run_as (workspace/spares.ts). */
  spares: number;
  /** The runs this process holds (a run held and not terminal may still write to its worktree). */
  runs: ReadonlyMap<string, Run>;
  /** The configured projects by id. */
  projects: ReadonlyMap<string, ProjectConfig>;
  /** Grace of each step ending the agent's tree before its change is recorded. */
  graceMs: number;
  now: () => Date;
}

/** The worktrees of `worktree` projects' runs and their recorded changes (design §16), per run. */
export class RunWorkspaces {
  readonly #workspaces: Workspaces;
  readonly #store: DispatchStore;
  readonly #runs: ReadonlyMap<string, Run>;
  readonly #projects: ReadonlyMap<string, ProjectConfig>;
  readonly #graceMs: number;
  readonly #pruneTimer: NodeJS.Timeout;

  constructor(options: RunWorkspacesOptions) {
    this.#store = options.store;
    this.#runs = options.runs;
    this.#projects = options.projects;
    this.#graceMs = options.graceMs;
    this.#workspaces = new Workspaces({
      dir: options.dir,
      store: options.store,
      logger: options.logger,
      keepMs: options.keepMs,
      spares: options.spares,
      // A run this process still holds and has not finished may still write to its worktree.
      mayRun: (runId) => this.#runs.get(runId)?.terminal === false,
      now: () => options.now().getTime(),
    });
    this.#pruneTimer = setInterval(() => void this.pruneBranches(), BRANCH_PRUNE_INTERVAL_MS);
    this.#pruneTimer.unref();
  }

  /** Delete the branches of runs past retention (workspace/prune.ts); runs hourly and after start-up's recovery. */
  pruneBranches(): Promise<number> {
    return this.#workspaces.pruneBranches([...this.#projects.values()]);
  }

  /**
   * A `worktree` project's run gets its own worktree, and works there (design §16); null: go on with the turn.
   * A `base_ref` on a shared project, or one that names no commit of the project, ends the run before spawning.
   */
  async prepare(run: Run, baseRef: string | undefined): Promise<Terminal | null> {
    if (run.project.workspace !== "worktree") {
      if (baseRef === undefined) return null;
      return notStarted("workspace_failed", "spawn", BASE_REF_NOT_WORKTREE, "fix_input");
    }
    // A continuation works in its parent's workspace, on its branch (design §17).
    if (run.continueRunId !== null && baseRef !== undefined) {
      return notStarted("workspace_failed", "spawn", BASE_REF_WITH_CONTINUATION, "fix_input");
    }
    // Under run_as the workspace is the run's pool user's (workspace/owned.ts).
    const owner = run.runAs ? { uid: run.runAs.uid, gid: run.runAs.gid } : undefined;
    const made =
      run.continueRunId === null
        ? await this.#workspaces.create(run.run_id, run.project, baseRef, owner)
        : await this.#workspaces.continueFrom(run.run_id, run.continueRunId, run.project, owner);
    if (!made.ok) {
      if (made.reason !== "unrecorded") run.workspace = this.#workspaces.summary(run.run_id) ?? null;
      switch (made.reason) {
        case "unknown_base_ref":
          return notStarted("workspace_failed", "spawn", UNKNOWN_BASE_REF, "fix_input");
        case "parent_unrecorded":
          return notStarted("workspace_failed", "spawn", PARENT_CHANGE_UNRECORDED);
        case "branch_moved":
          return notStarted("workspace_failed", "spawn", PARENT_BRANCH_MOVED);
        default:
          return notStarted("workspace_failed", "spawn");
      }
    }
    run.cwd = made.dir;
    run.workspace = made.workspace;
    return null;
  }

  /**
   * The run's change, recorded before its terminal is reported (workspace/workspaces.ts): the agent's tree is
   * ended first, so nothing writes to the worktree while it is committed. A change that cannot be recorded now is
   * recorded at the next start-up; the terminal is reported either way.
   */
  async recordChange(run: Run): Promise<void> {
    run.settling = true;
    run.conn?.close();
    await run.child?.terminateTree(this.#graceMs);
    const head = await this.#workspaces.record(run.run_id, run.project);
    if (head !== null && run.workspace) run.workspace = { ...run.workspace, head_commit: head };
    // A run that never reached its dispatch (the spare it took is replaced now).
    this.#workspaces.refillSpares(run.project);
  }

  /** The run's prompt is written: its project's spare worktrees are made again now, off its start path. */
  dispatched(run: Run): void {
    if (run.workspace) this.#workspaces.refillSpares(run.project);
  }

  /** The run's workspace as its summary reports it; undefined for a run without one. */
  summary(runId: string): RunWorkspace | undefined {
    return this.#workspaces.summary(runId);
  }

  async changes(runId: string, offset: number, maxBytes: number): Promise<ChangesOutcome | null> {
    const row = this.#store.get(runId);
    if (!row) return null;
    return this.#workspaces.changes(runId, this.#projects.get(row.project_id), offset, maxBytes);
  }

  async apply(runId: string, target: string, keyHash: string): Promise<ApplyOutcome | null> {
    const row = this.#store.get(runId);
    if (!row) return null;
    // A run still in memory may still be running (or recording its change), whatever its row says.
    const terminal = row.phase === "terminal" && this.#runs.get(runId)?.terminal !== false;
    return this.#workspaces.apply(runId, this.#projects.get(row.project_id), terminal, target, keyHash);
  }

  /** Remove the kept worktrees whose keep time has passed. */
  sweep(): Promise<number> {
    return this.#workspaces.sweep();
  }

  /** Start-up, before the link: record every change a previous process left unrecorded, remove leftover worktrees. */
  async recover(projects: readonly ProjectConfig[]): Promise<{ recorded: number; removed: number; pending: number }> {
    const recovered = await this.#workspaces.recover((runId) => {
      const row = this.#store.get(runId);
      return row ? this.#projects.get(row.project_id) : undefined;
    }, projects);
    await this.#workspaces.pruneBranches(projects);
    return recovered;
  }

  close(): Promise<void> {
    clearInterval(this.#pruneTimer);
    return this.#workspaces.close();
  }
}
