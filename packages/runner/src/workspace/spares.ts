/**
 * Spare worktrees (design §16): checkouts made ahead of the runs of a `worktree` project, so that a run's start
 * does not wait for a checkout (what a worktree run's start costs over a shared one). Per project, up to `count`
 * spares (`[runner] worktree_spares`) are kept at the project's HEAD, detached, in `<workspaces dir>/.spares/`.
 *
 * A run whose base is a spare's commit takes it: the spare is moved to the run's directory (`git worktree move`)
 * and the run's branch made there at that same commit (`git switch -c`: no file is written). A whole spare is
 * taken first; else one still being checked out at that commit (its checkout began before this start, so it ends
 * no later than one begun now would, and two would only share the machine); with none, the run's worktree is
 * checked out as without spares. A new spare is made in the background once that run is dispatched (or has
 * ended), off its start path; a spare whose commit is no longer HEAD is replaced then, and at every
 * SPARE_REFRESH_INTERVAL_MS. A run_as run never takes one: its workspace is a repository of its pool user's
 * (owned.ts).
 *
 * git's locks. A spare is made in two steps: `git worktree add --no-checkout --detach` (its admin dir and HEAD, a
 * few small files) among the repository's other writes (the caller's per-repository queue), so no `git worktree
 * prune` of the Runner's sees its admin dir half made; then its checkout, `git reset --hard` in the spare,
 * off that queue. The checkout writes only the spare's own files and its admin dir (index, HEAD's log), which no
 * other command of the Runner touches, and reads objects and refs, which git writes atomically; a prune keeps a
 * worktree whose directory and `gitdir` exist. So a start never waits behind a spare's checkout (only for the one
 * it takes): the repository's queue holds a spare's few milliseconds of `worktree add`, never its checkout.
 *
 * A spare is removed at close (one being checked out is killed first) and at start-up (whatever a killed
 * Runner left, registered with a project's git or not, a half-made one included); a run is given one only once
 * whole. Log lines name the project, never a path.
 */
import { randomBytes } from "node:crypto";
import { mkdir, realpath, rm } from "node:fs/promises";
import { dirname, join, sep } from "node:path";
import type { ProjectConfig } from "../config/config.js";
import type { Logger } from "../logger.js";
import { GitError, git } from "./git.js";
import { failure } from "./log-fields.js";
import { pruneWorktrees, resolveBase } from "./worktree.js";

/** The spares' directory in the workspaces dir (not a run id: start-up's sweep of run directories skips it). */
export const SPARES_DIR_NAME = ".spares";
/** How often every worktree project's spares are checked against its HEAD (one `rev-parse` a project). */
export const SPARE_REFRESH_INTERVAL_MS = 30_000;

export function sparesDir(workspacesDir: string): string {
  return join(workspacesDir, SPARES_DIR_NAME);
}

/** One spare: its directory, the commit it is checked out at, and whether it is whole. */
export interface Spare {
  readonly dir: string;
  readonly commit: string;
  whole: boolean;
  /** Whether it was made whole (false: it failed and is removed). */
  readonly made: Promise<boolean>;
  /** Kills its checkout (close). */
  readonly abort: AbortController;
}

/** Runs `work` after every earlier write to the repository at `root` (Workspaces' per-repository queue). */
export type Serial = <T>(root: string, work: () => Promise<T>) => Promise<T>;

export interface SparesOptions {
  /** The workspaces dir (the spares live in its SPARES_DIR_NAME). */
  dir: string;
  /** Spares kept per project (`worktree_spares`); 0: none. */
  count: number;
  logger: Logger;
  serial: Serial;
}

/** Remove a spare: git's record of it too, even one a killed `worktree add` left locked ("initializing"). */
async function removeSpare(root: string, dir: string): Promise<void> {
  try {
    await git(["worktree", "remove", "--force", "--force", "--", dir], { cwd: root });
  } catch (error) {
    if (!(error instanceof GitError)) throw error;
    await rm(dir, { recursive: true, force: true });
    // Not a worktree (any more), or one whose `.git` was never written: its lock, if any, goes, so prune may.
    await git(["worktree", "unlock", "--", dir], { cwd: root, okCodes: [128] });
  }
  await pruneWorktrees(root);
}

/** The paths of the repository's worktrees, as git records them (real paths). */
async function worktreePaths(root: string): Promise<string[]> {
  const out = await git(["worktree", "list", "--porcelain", "-z"], { cwd: root });
  const paths: string[] = [];
  for (const line of out.stdout.split("\0")) if (line.startsWith("worktree ")) paths.push(line.slice(9));
  return paths;
}

export class Spares {
  readonly #dir: string;
  readonly #count: number;
  readonly #log: Logger;
  readonly #serial: Serial;
  /** Each project's spares, whole or being made, by root. */
  readonly #pools = new Map<string, Spare[]>();
  /** The refill under way per root, and the roots asked for again meanwhile. */
  readonly #refilling = new Map<string, Promise<void>>();
  readonly #again = new Set<string>();
  #projects: readonly ProjectConfig[] = [];
  #timer: NodeJS.Timeout | null = null;
  #ticking = false;
  #started = false;
  #closed = false;

  constructor(options: SparesOptions) {
    this.#dir = sparesDir(options.dir);
    this.#count = options.count;
    this.#log = options.logger;
    this.#serial = options.serial;
  }

  /**
   * Start-up, before any spare is made: remove every spare a previous process left (registered with a project's
   * git — a half-made one too — and then whatever is left in the directory). The number git knew of.
   */
  async recover(projects: readonly ProjectConfig[]): Promise<number> {
    const prefixes = new Set([this.#dir + sep]);
    for (const named of [this.#dir, dirname(this.#dir)]) {
      try {
        const real = await realpath(named);
        prefixes.add((named === this.#dir ? real : join(real, SPARES_DIR_NAME)) + sep);
      } catch {
        // Not there: nothing of it is either.
      }
    }
    let removed = 0;
    for (const project of projects) {
      if (project.workspace !== "worktree") continue;
      try {
        const paths = await this.#serial(project.root, () => worktreePaths(project.root));
        for (const path of paths) {
          if (![...prefixes].some((prefix) => path.startsWith(prefix))) continue;
          await this.#serial(project.root, () => removeSpare(project.root, path));
          removed += 1;
        }
      } catch (error) {
        this.#log.warn({ project_id: project.id, ...failure(error) }, "removing leftover spare worktrees failed");
      }
    }
    await rm(this.#dir, { recursive: true, force: true });
    return removed;
  }

  /** After start-up's recovery: make the `worktree` projects' spares, and check them against HEAD from now on. */
  start(projects: readonly ProjectConfig[]): void {
    if (this.#count === 0 || this.#closed || this.#started) return;
    this.#started = true;
    this.#projects = projects.filter((p) => p.workspace === "worktree");
    if (this.#projects.length === 0) return;
    void this.#tick();
    this.#timer = setInterval(() => void this.#tick(), SPARE_REFRESH_INTERVAL_MS);
    this.#timer.unref();
  }

  /** Each project's refill in turn (one git process at a time); a tick still under way skips the next. */
  async #tick(): Promise<void> {
    if (this.#ticking) return;
    this.#ticking = true;
    try {
      for (const project of this.#projects) {
        if (this.#closed) break;
        await this.refill(project);
      }
    } finally {
      this.#ticking = false;
    }
  }

  /**
   * A spare of the project at `root` at `commit`, now the caller's: a whole one first, else one being checked out;
   * null when there is none.
   */
  claim(root: string, commit: string): Spare | null {
    if (!this.#started || this.#closed) return null;
    const pool = this.#pools.get(root);
    if (!pool) return null;
    let at = pool.findIndex((s) => s.whole && s.commit === commit);
    if (at < 0) at = pool.findIndex((s) => s.commit === commit && !s.abort.signal.aborted);
    return at < 0 ? null : (pool.splice(at, 1)[0] ?? null);
  }

  /**
   * Make the claimed `spare` the run's worktree once whole: moved to `dir`, on a new branch `branch` at its
   * commit, among the repository's writes. False when that failed, or its checkout did: the spare (wherever it got
   * to) is removed, and the caller makes the run's worktree afresh.
   */
  async take(root: string, spare: Spare, dir: string, branch: string): Promise<boolean> {
    if (!(await spare.made)) return false;
    try {
      await this.#serial(root, async () => {
        await git(["worktree", "move", "--", spare.dir, dir], { cwd: root });
        // From its detached HEAD, on the same commit: only a ref and HEAD are written.
        await git(["switch", "--quiet", "-c", branch], { cwd: dir });
      });
      return true;
    } catch (error) {
      this.#log.warn({ ...failure(error) }, "taking a spare worktree failed; the run's worktree is made afresh");
      await this.#remove(root, spare.dir);
      await this.#remove(root, dir);
      return false;
    }
  }

  /**
   * Bring the project's spares to `count` at its HEAD, a stale one (another commit) removed first; in the
   * background (one refill per project at a time: one asked for meanwhile runs after it). Resolves when done.
   */
  refill(project: ProjectConfig): Promise<void> {
    if (!this.#started || this.#closed) return Promise.resolve();
    const root = project.root;
    const under = this.#refilling.get(root);
    if (under) {
      this.#again.add(root);
      return under;
    }
    const done = this.#refillOnce(project)
      .catch((error: unknown) => {
        this.#log.warn({ project_id: project.id, ...failure(error) }, "refilling spare worktrees failed");
      })
      .finally(() => {
        this.#refilling.delete(root);
        if (this.#again.delete(root)) void this.refill(project);
      });
    this.#refilling.set(root, done);
    return done;
  }

  async #refillOnce(project: ProjectConfig): Promise<void> {
    const root = project.root;
    const head = await resolveBase(root, "HEAD");
    if (head === null) return;
    let pool = this.#pools.get(root);
    if (!pool) {
      pool = [];
      this.#pools.set(root, pool);
    }
    for (const spare of [...pool]) {
      if (!spare.whole || spare.commit === head) continue;
      pool.splice(pool.indexOf(spare), 1);
      await this.#remove(root, spare.dir);
      this.#log.info({ project_id: project.id }, "a spare worktree of an older HEAD removed");
    }
    while (!this.#closed && pool.length < this.#count) {
      if (!(await this.#make(project, head, pool))) break;
    }
  }

  /** One spare at `commit`, in `pool` while it is made; whether it was made whole (else it is removed). */
  async #make(project: ProjectConfig, commit: string, pool: Spare[]): Promise<boolean> {
    const root = project.root;
    let settle: (whole: boolean) => void = () => {};
    const spare: Spare = {
      dir: join(this.#dir, `spare-${randomBytes(8).toString("hex")}`),
      commit,
      whole: false,
      made: new Promise((resolve) => {
        settle = resolve;
      }),
      abort: new AbortController(),
    };
    pool.push(spare);
    try {
      await mkdir(this.#dir, { recursive: true, mode: 0o700 });
      await this.#serial(root, () =>
        git(["worktree", "add", "--quiet", "--no-checkout", "--detach", "--", spare.dir, commit], { cwd: root }),
      );
      // Off the queue: the checkout writes nothing any other command of the Runner writes (see the header).
      await git(["reset", "--hard", "--quiet", "--no-recurse-submodules"], {
        cwd: spare.dir,
        signal: spare.abort.signal,
      });
      spare.whole = true;
      this.#log.info({ project_id: project.id, commit }, "spare worktree made");
      settle(true);
      return true;
    } catch (error) {
      if (!spare.abort.signal.aborted) {
        this.#log.warn({ project_id: project.id, ...failure(error) }, "making a spare worktree failed");
      }
      const at = pool.indexOf(spare);
      if (at >= 0) pool.splice(at, 1);
      await this.#remove(root, spare.dir);
      // A run that took it while it was made makes its worktree afresh.
      settle(false);
      return false;
    }
  }

  async #remove(root: string, dir: string): Promise<void> {
    try {
      await this.#serial(root, () => removeSpare(root, dir));
    } catch (error) {
      this.#log.warn({ ...failure(error) }, "removing a spare worktree failed");
    }
  }

  /** Shutdown: a spare being checked out is killed, then every spare removed. */
  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    for (const pool of this.#pools.values()) for (const spare of pool) spare.abort.abort();
    await Promise.all([...this.#refilling.values()]);
    for (const [root, pool] of this.#pools) for (const spare of pool.splice(0)) await this.#remove(root, spare.dir);
  }
}
