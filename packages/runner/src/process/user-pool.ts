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
 * - A user serves one tenant (the caller's opaque tag from run.start) for
 *   good: the sweep kills processes but files a run left in the user's home
 *   and temp dirs stay, so the first run binds the user to its tenant
 *   (process/user-bindings.ts, durable before the agent starts) and a start
 *   of another tenant takes an unbound user or is refused. `[acp]
 *   single_tenant` switches binding off.
 */
import { execFileSync } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import type { AgentConfig } from "../config/config.js";
import { type Logger, silentLogger } from "../logger.js";
import { listUidProcesses } from "./proc-identity.js";
import { findSystemTool, type RunAs } from "./run-as.js";
import { NO_TENANT, type PoolBindings, type UserBinding } from "./user-bindings.js";

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

type SlotState = "free" | "leased" | "sweeping" | "quarantined";

/**
 * A start's user: null when the agent runs as the Runner's own user (no run_as). Refused: `busy` (every user
 * that could serve the tenant serves a live run or is being swept), `bound` (a user is free, but each free one
 * is bound to another tenant), `unrecorded` (the binding could not be written; nothing started).
 */
export type Lease = { ok: true; user: RunAs | null } | { ok: false; reason: "busy" | "bound" | "unrecorded" };

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
    } = {},
  ) {
    this.#now = options.now ?? (() => new Date());
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
   * none): first a free user already bound to the tenant, then a free unbound one (in configured order),
   * which is bound to it durably before it is handed out. Without bindings any free user serves.
   */
  acquire(agent: Pick<AgentConfig, "runAs">, tenant: string | undefined): Lease {
    if (agent.runAs === null) return { ok: true, user: null };
    const free = agent.runAs.users.filter((u) => this.#state.get(u.uid) === "free");
    if (this.#bindings === null) {
      const user = free[0];
      if (!user) return { ok: false, reason: "busy" };
      this.#state.set(user.uid, "leased");
      return { ok: true, user };
    }
    const tag = tenant ?? NO_TENANT;
    const own = free.find((u) => this.#tenants.get(u.uid)?.tenant === tag);
    if (own) {
      this.#state.set(own.uid, "leased");
      return { ok: true, user: own };
    }
    const unbound = free.find((u) => !this.#tenants.has(u.uid));
    if (!unbound) return { ok: false, reason: free.length > 0 ? "bound" : "busy" };
    const binding: UserBinding = {
      uid: unbound.uid,
      user: unbound.user,
      tenant: tag,
      bound_at: this.#now().toISOString(),
    };
    try {
      this.#bindings.bind(binding);
    } catch (error) {
      this.#log.error(
        { user: unbound.user, uid: unbound.uid, err_name: (error as Error)?.name },
        "could not record which caller a run_as pool user serves; the run is not started",
      );
      return { ok: false, reason: "unrecorded" };
    }
    this.#tenants.set(unbound.uid, binding);
    this.#state.set(unbound.uid, "leased");
    this.#log.info({ user: unbound.user, uid: unbound.uid }, "a run_as pool user now serves one caller's runs only");
    return { ok: true, user: unbound };
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
    this.#state.set(user.uid, "free");
  }
}
