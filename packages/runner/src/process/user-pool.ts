/**
 * Runs are kept apart (design §4.2, tenancy): the `run_as` pools of all
 * agents, and the sweep that leaves no process of a pool user behind.
 *
 * - Each concurrent run holds a pool user of its own, leased at admission
 *   and never shared with another live run, whichever agent it belongs to
 *   (leases are keyed by uid, so agents may share a pool). No free user:
 *   the start is refused as at capacity — no queue.
 * - When the run's tree cleanup is done, the user's processes are killed in
 *   rounds until two scans in a row find none (bounded by SWEEP_TIMEOUT_MS).
 *   Each round first sends SIGKILL as the user itself (`kill -9 -1` through
 *   setpriv: the kernel signals every process of the uid under one lock, so
 *   a process that keeps forking cannot hop past it), then SIGKILLs every
 *   process whose real, effective or saved uid is the user's found in /proc
 *   (a process whose main thread exited counts while it has threads). Only
 *   then is the user free again. This catches what escaped the process group:
 *   double-forked daemons, `setsid` children, `nohup … &`. Agents start with
 *   no_new_privs and no capabilities (process/run-as.ts), so none of their processes
 *   can leave the user.
 * - A user whose processes survive the sweep is quarantined: it serves no
 *   run until the Runner restarts (logged with the user and counts only).
 * - At construction (Runner start, after a crash too) every pool user is
 *   swept the same way, so a leftover of an earlier Runner's run dies before
 *   the user serves a run here.
 *
 * - A user serves one tenant (the caller's opaque tag from run.start) at a
 *   time: the sweep kills processes but files a run left in the user's home
 *   and temp dirs stay, so the first run binds the user to its tenant
 *   (process/user-bindings.ts, durable before the agent starts) and a start
 *   of another tenant takes an unbound user or is refused. `[acp]
 *   single_tenant` switches binding off.
 * - One tenant cannot take the whole pool: it may be bound to at most
 *   `max_users_per_caller` users of an agent's pool (default half the pool,
 *   at least 1); past that its start is refused `caller_limit` while all of
 *   its users serve its live runs.
 * - A free user whose tenant has not used it for `binding_idle_days` may be
 *   recycled for another tenant that has no user to take: swept, its HOME
 *   wiped and re-created from `home_template` (process/pool-homes.ts), then
 *   bound to the new tenant — logged with the user only. The start waits for
 *   it (RECYCLE_WAIT_MS, runs/admission.ts). A recycle that fails quarantines
 *   the user.
 */
import { execFileSync } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import type { AgentConfig } from "../config/config.js";
import { findSystemTool, type RunAs } from "../config/run-as.js";
import { DEFAULT_BINDING_IDLE_DAYS } from "../config/schema.js";
import { type Logger, silentLogger } from "../logger.js";
import { PoolHomeError, type RecycledHome } from "./pool-homes.js";
import { listUidProcesses } from "./proc-identity.js";
import { BINDING_TOUCH_INTERVAL_MS, NO_TENANT, type PoolBindings, type UserBinding } from "./user-bindings.js";

/** Longest a sweep keeps SIGKILLing and re-scanning for processes of a pool user before it quarantines the user. */
export const SWEEP_TIMEOUT_MS = 5000;
/** Pause between a sweep's SIGKILL round and its next /proc scan. */
export const SWEEP_POLL_MS = 20;
/** Scans in a row that must find no process of the user before it counts as clean. */
export const SWEEP_CLEAN_SCANS = 2;
/** Longest one `kill -9 -1` as the user may take. */
export const KILL_AS_USER_TIMEOUT_MS = 2000;

let shell: string | null | undefined;

/**
 * SIGKILL every process of `user` with the kernel's own walk: `kill -9 -1` run as that user (through setpriv,
 * with no supplementary groups) signals every process the uid may signal — its own — except itself, under the
 * task-list lock, so none can fork past it. Errors are ignored: the /proc rounds that follow decide.
 */
export function killAllAsUser(user: Pick<RunAs, "uid" | "gid" | "setpriv">): void {
  shell ??= findSystemTool("sh");
  if (shell === null) return;
  try {
    execFileSync(
      user.setpriv,
      [`--reuid=${user.uid}`, `--regid=${user.gid}`, "--clear-groups", "--", shell, "-c", "kill -9 -1"],
      { stdio: "ignore", timeout: KILL_AS_USER_TIMEOUT_MS, env: {} },
    );
  } catch {
    // nothing of the user was left to signal (kill's own error), or setpriv could not run: the scan decides
  }
}

export interface SweepResult {
  /** Processes found (and SIGKILLed) over all rounds. */
  readonly killed: number;
  /** Processes still alive when the sweep gave up (0: the user is clean). */
  readonly survivors: number;
}

/** One SIGKILL round: every live process of `uids`; returns how many were signalled per uid. */
function killRound(uids: ReadonlySet<number>): Map<number, number> {
  const found = new Map<number, number>();
  for (const { pid, uid } of listUidProcesses(uids)) {
    found.set(uid, (found.get(uid) ?? 0) + 1);
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/**
 * Kill every process of `uid` in rounds until SWEEP_CLEAN_SCANS scans in a row find none, or `timeoutMs` has
 * passed. `firstRound` is a round already done by the caller (its count), so the first scan is not repeated;
 * `killAsUser`, when given, runs before each /proc round (killAllAsUser).
 */
export async function sweepUser(
  uid: number,
  timeoutMs = SWEEP_TIMEOUT_MS,
  firstRound: number | null = null,
  killAsUser: (() => void) | null = null,
): Promise<SweepResult> {
  const uids = new Set([uid]);
  const deadline = Date.now() + timeoutMs;
  const round = (): number => {
    killAsUser?.();
    return killRound(uids).get(uid) ?? 0;
  };
  let killed = 0;
  let clean = 0;
  let found = firstRound ?? round();
  for (;;) {
    killed += found;
    clean = found === 0 ? clean + 1 : 0;
    if (clean >= SWEEP_CLEAN_SCANS) return { killed, survivors: 0 };
    if (Date.now() >= deadline) return { killed, survivors: listUidProcesses(uids).length };
    await sleep(SWEEP_POLL_MS);
    found = round();
  }
}

type SlotState = "free" | "leased" | "sweeping" | "recycling" | "quarantined";

const DAY_MS = 24 * 60 * 60 * 1000;

/**
 * A start's user: null when the agent runs as the Runner's own user (no run_as). Refused for a capacity
 * reason (`pool_busy`: every user that could serve the tenant serves a live run or is being swept;
 * `pool_bound`: users are free, but each is bound to another tenant and none is idle long enough;
 * `caller_limit`: the tenant holds max_users_per_caller users, none free), or `unrecorded` (the binding
 * could not be written; nothing started), or `recycling`: an idle user is being recycled for this tenant;
 * `ready` resolves when it is done (bound to the tenant and free, or quarantined), then the start may ask again.
 */
export type Lease =
  | { ok: true; user: RunAs | null }
  | { ok: false; reason: "pool_busy" | "pool_bound" | "caller_limit" | "unrecorded" }
  | { ok: false; reason: "recycling"; ready: Promise<void> };

/** How a recycled user's HOME is wiped and re-created (process/pool-homes.ts `recycleHome` with the config's guard). */
export type HomeRecycler = (user: RunAs) => Promise<RecycledHome>;

export class UserPool {
  /** Pool users by uid, over every agent's pool. */
  readonly #state = new Map<number, SlotState>();
  readonly #log: Logger;
  readonly #timeoutMs: number;
  readonly #sweep: typeof sweepUser;
  readonly #bindings: PoolBindings | null;
  /** Each bound user's binding, by uid (empty without bindings). */
  readonly #tenants: Map<number, UserBinding>;
  readonly #now: () => Date;
  readonly #maxPerCaller: number | null;
  readonly #idleMs: number;
  readonly #recycleHome: HomeRecycler | null;
  /** Users being recycled, by uid: the tenant they are being recycled for (counts toward its limit). */
  readonly #reserved = new Map<number, string>();
  /** Resolves once the start-up sweep of every pool user is done. */
  readonly ready: Promise<void>;

  constructor(
    agents: readonly AgentConfig[],
    options: {
      logger?: Logger;
      sweepTimeoutMs?: number;
      /** The sweep at release (default sweepUser; tests hand in one whose processes survive). */
      sweep?: typeof sweepUser;
      /** Where each user's tenant is kept; null: users serve any tenant (`[acp] single_tenant`, `exec`). */
      bindings?: PoolBindings | null;
      now?: () => Date;
      /** `[acp] max_users_per_caller`; null or absent: half of each agent's pool, at least 1. */
      maxUsersPerCaller?: number | null;
      /** `[acp] binding_idle_days`. */
      bindingIdleDays?: number;
      /** Wipes and re-creates a recycled user's HOME; null or absent: bound users are never recycled. */
      recycleHome?: HomeRecycler | null;
    } = {},
  ) {
    this.#now = options.now ?? (() => new Date());
    this.#maxPerCaller = options.maxUsersPerCaller ?? null;
    this.#idleMs = (options.bindingIdleDays ?? DEFAULT_BINDING_IDLE_DAYS) * DAY_MS;
    this.#recycleHome = options.recycleHome ?? null;
    this.#log = options.logger ?? silentLogger();
    this.#timeoutMs = options.sweepTimeoutMs ?? SWEEP_TIMEOUT_MS;
    this.#sweep = options.sweep ?? sweepUser;
    const users = new Map<number, RunAs>();
    for (const agent of agents) for (const user of agent.runAs?.users ?? []) users.set(user.uid, user);
    // Without pool users there is nothing to bind (and a bindings file does not matter).
    this.#bindings = users.size === 0 ? null : (options.bindings ?? null);
    this.#tenants = this.#bindings?.load() ?? new Map();
    // One scan for all users now, synchronously: a user with nothing left is free at once.
    for (const user of users.values()) killAllAsUser(user);
    const found = users.size === 0 ? new Map<number, number>() : killRound(new Set(users.keys()));
    const pending: Promise<void>[] = [];
    for (const [uid, user] of users) {
      const count = found.get(uid) ?? 0;
      if (count === 0) {
        this.#state.set(uid, "free");
        continue;
      }
      this.#state.set(uid, "sweeping");
      this.#log.warn(
        { user: user.user, uid, processes: count },
        "processes of a run_as pool user were left from before this start; killing them",
      );
      pending.push(
        this.#settle(
          user,
          sweepUser(uid, this.#timeoutMs, count, () => killAllAsUser(user)),
          null,
        ),
      );
    }
    this.ready = Promise.all(pending).then(() => {});
  }

  /**
   * Lease a free user of `agent`'s pool for a run of `tenant` (a tag, or undefined for a start that names
   * none): first a free user already bound to the tenant; then, while the tenant holds fewer than its limit
   * of the pool's users, a free unbound one (in configured order), bound to it durably before it is handed
   * out, or else a free user idle past binding_idle_days, recycled for it. Without bindings any free user serves.
   */
  acquire(agent: Pick<AgentConfig, "runAs">, tenant: string | undefined): Lease {
    if (agent.runAs === null) return { ok: true, user: null };
    const users = agent.runAs.users;
    const free = users.filter((u) => this.#state.get(u.uid) === "free");
    if (this.#bindings === null) {
      const user = free[0];
      if (!user) return { ok: false, reason: "pool_busy" };
      this.#state.set(user.uid, "leased");
      return { ok: true, user };
    }
    const tag = tenant ?? NO_TENANT;
    const own = free.find((u) => this.#tenants.get(u.uid)?.tenant === tag);
    if (own) {
      this.#state.set(own.uid, "leased");
      this.#touch(own.uid);
      return { ok: true, user: own };
    }
    const held = users.filter((u) => (this.#reserved.get(u.uid) ?? this.#tenants.get(u.uid)?.tenant) === tag).length;
    if (held >= this.limit(agent)) return { ok: false, reason: "caller_limit" };
    const unbound = free.find((u) => !this.#tenants.has(u.uid));
    if (unbound) return this.#bindAndLease(unbound, tag);
    const idle = this.#recycleHome === null ? undefined : free.find((u) => this.#idle(u.uid));
    if (idle) return { ok: false, reason: "recycling", ready: this.#recycle(idle, tag) };
    return { ok: false, reason: free.length > 0 ? "pool_bound" : "pool_busy" };
  }

  /** How many users of `agent`'s pool one tenant may be bound to. */
  limit(agent: Pick<AgentConfig, "runAs">): number {
    const size = agent.runAs?.users.length ?? 0;
    return Math.min(size, this.#maxPerCaller ?? Math.max(1, Math.floor(size / 2)));
  }

  #bindAndLease(user: RunAs, tag: string): Lease {
    const now = this.#now().toISOString();
    const binding: UserBinding = { uid: user.uid, user: user.user, tenant: tag, bound_at: now, last_used_at: now };
    try {
      this.#bindings?.bind(binding);
    } catch (error) {
      this.#log.error(
        { user: user.user, uid: user.uid, err_name: (error as Error)?.name },
        "could not record which caller a run_as pool user serves; the run is not started",
      );
      return { ok: false, reason: "unrecorded" };
    }
    this.#tenants.set(user.uid, binding);
    this.#state.set(user.uid, "leased");
    this.#log.info({ user: user.user, uid: user.uid }, "a run_as pool user now serves one caller's runs only");
    return { ok: true, user };
  }

  /** Whether `uid`'s tenant has left it unused for binding_idle_days. */
  #idle(uid: number): boolean {
    const b = this.#tenants.get(uid);
    if (b === undefined) return false;
    return this.#now().getTime() - Date.parse(b.last_used_at ?? b.bound_at) >= this.#idleMs;
  }

  /** Record that `uid`'s tenant used it now (at most every BINDING_TOUCH_INTERVAL_MS; a failed write is logged). */
  #touch(uid: number): void {
    const b = this.#tenants.get(uid);
    if (b === undefined || this.#bindings === null) return;
    const now = this.#now();
    if (now.getTime() - Date.parse(b.last_used_at ?? b.bound_at) < BINDING_TOUCH_INTERVAL_MS) return;
    const next = { ...b, last_used_at: now.toISOString() };
    try {
      this.#bindings.bind(next);
      this.#tenants.set(uid, next);
    } catch (error) {
      this.#log.warn(
        { user: b.user, uid, err_name: (error as Error)?.name },
        "could not record when a run_as pool user was last used; its idle time counts from the last record",
      );
    }
  }

  /**
   * Recycle idle `user` for `tag`: sweep it, wipe and re-create its HOME, then bind it to `tag` durably and
   * free it. Any failure quarantines the user (its old binding stays, unless only the new one failed to write).
   */
  async #recycle(user: RunAs, tag: string): Promise<void> {
    const recycleHome = this.#recycleHome;
    if (recycleHome === null) return;
    this.#state.set(user.uid, "recycling");
    this.#reserved.set(user.uid, tag);
    const from = this.#tenants.get(user.uid);
    const idleSince = from?.last_used_at ?? from?.bound_at;
    try {
      const swept = await this.#sweep(user.uid, this.#timeoutMs, null, () => killAllAsUser(user));
      if (swept.survivors > 0) throw new Error(`${swept.survivors} processes survived the sweep`);
      const home = await recycleHome(user);
      const now = this.#now().toISOString();
      const binding: UserBinding = { uid: user.uid, user: user.user, tenant: tag, bound_at: now, last_used_at: now };
      this.#bindings?.bind(binding);
      this.#tenants.set(user.uid, binding);
      this.#state.set(user.uid, "free");
      this.#log.info(
        {
          user: user.user,
          uid: user.uid,
          idle_since: idleSince,
          killed: swept.killed,
          removed: home.removed,
          copied: home.copied,
        },
        "a run_as pool user its caller left unused for binding_idle_days was recycled for another caller: swept, HOME wiped and re-created from home_template",
      );
    } catch (error) {
      this.#state.set(user.uid, "quarantined");
      this.#log.error(
        {
          user: user.user,
          uid: user.uid,
          err_name: (error as Error)?.name,
          // The home rule it broke (names only the configured HOME), never a file name found inside it.
          ...(error instanceof PoolHomeError ? { reason: error.message } : {}),
        },
        "recycling a run_as pool user failed; the user serves no run until the Runner restarts",
      );
    } finally {
      this.#reserved.delete(user.uid);
    }
  }

  /** The run that held `user` is over (its tree cleaned up): sweep the user, then free or quarantine it. */
  async release(user: RunAs, runId: string): Promise<void> {
    if (this.#state.get(user.uid) !== "leased") return;
    this.#state.set(user.uid, "sweeping");
    try {
      await this.#settle(
        user,
        this.#sweep(user.uid, this.#timeoutMs, null, () => killAllAsUser(user)),
        runId,
      );
    } catch (error) {
      // Never leave a run unsettled over a sweep fault; a user not proven clean serves no run.
      this.#state.set(user.uid, "quarantined");
      this.#log.error(
        { run_id: runId, user: user.user, uid: user.uid, err_name: (error as Error)?.name },
        "sweeping a run_as pool user failed; the user serves no run until the Runner restarts",
      );
    }
  }

  /** Where a pool user stands (free, leased, being swept, quarantined); undefined for a uid in no pool. */
  state(uid: number): SlotState | undefined {
    return this.#state.get(uid);
  }

  async #settle(user: RunAs, sweep: Promise<SweepResult>, runId: string | null): Promise<void> {
    const { killed, survivors } = await sweep;
    const fields = { ...(runId === null ? {} : { run_id: runId }), user: user.user, uid: user.uid };
    if (survivors > 0) {
      this.#state.set(user.uid, "quarantined");
      this.#log.error(
        { ...fields, killed, survivors },
        "processes of a run_as pool user survived SIGKILL; the user serves no run until the Runner restarts",
      );
      return;
    }
    if (killed > 0 && runId !== null) {
      this.#log.info({ ...fields, killed }, "processes of the run that left its process group were killed");
    }
    if (runId !== null) this.#touch(user.uid);
    this.#state.set(user.uid, "free");
  }
}
