/**
 * `[[acp.agents]] run_as` / `run_as_group` at config load (design §4.2): the account-name pattern and the pool
 * bound the schema checks, and each pool resolved once into the users its runs are started as
 * (process/run-as.ts starts them through setpriv; process/user-pool.ts hands one to each concurrent run).
 *
 * Users and groups are resolved with `getent` (so NSS sources count); tools are looked up in fixed system
 * directories, never on PATH. Refused: unknown accounts, root (uid or gid 0), the overflow uid, the
 * Runner's own uid, two names of one uid, a missing setpriv, and a Runner that cannot switch users
 * (`switchUserSupport`: its capabilities, read from /proc/self/status).
 */
import { execFileSync } from "node:child_process";
import { accessSync, constants, readFileSync } from "node:fs";

/** Where `setpriv` and `getent` are looked for, in order (never PATH). */
export const SYSTEM_TOOL_DIRS = ["/usr/bin", "/bin", "/usr/sbin", "/sbin"] as const;
/** Longest a `getent` lookup may take at config load. */
export const GETENT_TIMEOUT_MS = 5000;
/** User and group names accepted in `run_as` / `run_as_group` (POSIX portable names, plus a leading digit for ids). */
export const ACCOUNT_NAME_PATTERN = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$/;
/** Most users one `run_as` pool may name (as many as `max_concurrent_runs` allows runs). */
export const MAX_RUN_AS_POOL_USERS = 64;
/**
 * The kernel's overflow uid ("nobody"): shared by unrelated services and by
 * NFS, so never a pool user (every process of a pool user is killed).
 */
export const OVERFLOW_UID = 65534;

/** Linux capability bit numbers (linux/capability.h). */
const CAP_KILL = 5;
const CAP_SETGID = 6;
const CAP_SETUID = 7;
const CAP_SETPCAP = 8;

/** One OS user an agent process is started as. */
export interface RunAs {
  readonly user: string;
  readonly uid: number;
  /** The agent's primary gid: `run_as_group`'s, else the user's. */
  readonly gid: number;
  /** `run_as_group` as configured, or null (the user's primary group). */
  readonly group: string | null;
  /** The user's HOME from the passwd entry (checked and recycled by process/pool-homes.ts). */
  readonly home: string;
  /** Absolute path of the `setpriv` that switches users. */
  readonly setpriv: string;
  /** Whether setpriv clears the capability bounding set (it needs CAP_SETPCAP, which root has). */
  readonly clearBoundingSet: boolean;
  /**
   * The tools that start the agent in a mount and IPC namespace of its own (process/sandbox.ts), or null
   * under `[acp] sandbox = "none"`.
   */
  readonly sandbox: SandboxTools | null;
}

/** The tools that start an agent in a sandbox (process/sandbox.ts), resolved once at load (config/sandbox-tools.ts, never on PATH). */
export interface SandboxTools {
  readonly unshare: string;
  readonly sh: string;
  readonly mount: string;
  /**
   * A non-root Runner's setpriv, which makes the mounting shell uid 0 inside the new namespaces (util-linux
   * `mount` refuses any caller whose uid is not 0, whatever its capabilities); null for a root Runner.
   */
  readonly asRoot: string | null;
}

/** An agent's `run_as`: the users its runs take turns as, one per concurrent run, in configured order. */
export interface RunAsPool {
  readonly users: readonly RunAs[];
}

/** The first executable `name` in SYSTEM_TOOL_DIRS, or null. */
export function findSystemTool(name: string): string | null {
  for (const dir of SYSTEM_TOOL_DIRS) {
    const path = `${dir}/${name}`;
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      // next directory
    }
  }
  return null;
}

type Lookup<T> = { ok: true; value: T } | { ok: false; reason: string };

/** One `getent DATABASE KEY` line split on ':', or a reason. */
function getent(database: "passwd" | "group", key: string): Lookup<string[]> {
  const tool = findSystemTool("getent");
  if (tool === null) return { ok: false, reason: `getent not found in ${SYSTEM_TOOL_DIRS.join(", ")}` };
  try {
    const line = execFileSync(tool, [database, key], {
      encoding: "utf8",
      timeout: GETENT_TIMEOUT_MS,
      stdio: ["ignore", "pipe", "ignore"],
    });
    return { ok: true, value: line.trim().split("\n")[0]?.split(":") ?? [] };
  } catch (error) {
    const status = (error as { status?: number | null }).status;
    return {
      ok: false,
      reason: status === 2 ? `no such ${database === "passwd" ? "user" : "group"}` : "getent failed",
    };
  }
}

export function lookupUser(name: string): Lookup<{ uid: number; gid: number; home: string }> {
  const entry = getent("passwd", name);
  if (!entry.ok) return entry;
  const [, , uid, gid, , home] = entry.value;
  if (!/^\d+$/.test(uid ?? "") || !/^\d+$/.test(gid ?? "")) return { ok: false, reason: "malformed passwd entry" };
  return { ok: true, value: { uid: Number(uid), gid: Number(gid), home: home ?? "" } };
}

export function lookupGroup(name: string): Lookup<{ gid: number }> {
  const entry = getent("group", name);
  if (!entry.ok) return entry;
  const gid = entry.value[2];
  if (!/^\d+$/.test(gid ?? "")) return { ok: false, reason: "malformed group entry" };
  return { ok: true, value: { gid: Number(gid) } };
}

/** A capability set from the `name:` line of a /proc/PID/status text (0 when absent). */
function capabilitySet(status: string, name: string): bigint {
  const hex = new RegExp(`^${name}:\\s*([0-9a-f]+)$`, "m").exec(status)?.[1];
  return hex === undefined ? 0n : BigInt(`0x${hex}`);
}

const has = (set: bigint, bit: number) => (set & (1n << BigInt(bit))) !== 0n;

export type SwitchSupport = { ok: true; clearBoundingSet: boolean } | { ok: false; reason: string };

/**
 * Whether a process with this /proc/PID/status text and effective uid can
 * start agents as other users: root with CAP_SETUID, CAP_SETGID and CAP_KILL
 * effective, or a non-root user holding CAP_SETUID and CAP_SETGID as ambient
 * capabilities (so setpriv inherits them across exec) and CAP_KILL effective
 * (to signal the agent's process group). `clearBoundingSet`: whether setpriv
 * will also hold CAP_SETPCAP, which dropping the bounding set needs.
 */
export function switchUserSupportFrom(status: string, euid: number): SwitchSupport {
  const effective = capabilitySet(status, "CapEff");
  const ambient = capabilitySet(status, "CapAmb");
  const root = euid === 0;
  const missing: string[] = [];
  const switchSet = root ? effective : ambient;
  if (!has(switchSet, CAP_SETUID)) missing.push(root ? "CAP_SETUID" : "ambient CAP_SETUID");
  if (!has(switchSet, CAP_SETGID)) missing.push(root ? "CAP_SETGID" : "ambient CAP_SETGID");
  if (!has(effective, CAP_KILL)) missing.push("CAP_KILL");
  if (missing.length === 0) return { ok: true, clearBoundingSet: has(switchSet, CAP_SETPCAP) };
  return {
    ok: false,
    reason: root
      ? `this Runner runs as root without ${missing.join(", ")}`
      : `this Runner (uid ${euid}) lacks ${missing.join(", ")}; run it as root or with AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL (examples/systemd/webcodex-runner.service)`,
  };
}

/** switchUserSupportFrom for this process. */
export function switchUserSupport(): SwitchSupport {
  if (process.platform !== "linux") return { ok: false, reason: "run_as needs Linux" };
  let status: string;
  try {
    status = readFileSync("/proc/self/status", "utf8");
  } catch {
    return { ok: false, reason: "cannot read /proc/self/status" };
  }
  return switchUserSupportFrom(status, process.geteuid?.() ?? -1);
}

/** `run_as` / `run_as_group` resolved to ids, or the key at fault (`run_as[1]` for a pool member) and the rule it breaks. */
export type RunAsResolution = { ok: true; value: RunAsPool | null } | { ok: false; key: string; reason: string };

/**
 * Resolve an agent's `run_as` (one user, or a pool) and `run_as_group` at config load: unknown accounts,
 * root (uid or gid 0), the overflow uid, the Runner's own uid, two names of one uid, a missing setpriv and a
 * Runner that cannot switch users are refused. No `run_as`: null, the agent runs as the Runner's user.
 * `canSwitch` is asked only when everything else is fine.
 */
export function resolveRunAs(
  users: string | readonly string[] | undefined,
  group: string | undefined,
  canSwitch: () => SwitchSupport,
  runnerUid: number | undefined = process.geteuid?.(),
  sandbox: SandboxTools | null = null,
): RunAsResolution {
  if (users === undefined) {
    if (group !== undefined)
      return { ok: false, key: "run_as_group", reason: "needs run_as (the user the agent runs as)" };
    return { ok: true, value: null };
  }
  const names = typeof users === "string" ? [users] : users;
  const keyOf = (i: number) => (typeof users === "string" ? "run_as" : `run_as[${i}]`);
  const accounts: { user: string; uid: number; gid: number; home: string }[] = [];
  const byUid = new Map<number, string>();
  for (const [i, user] of names.entries()) {
    const account = lookupUser(user);
    const key = keyOf(i);
    if (!account.ok) return { ok: false, key, reason: `${JSON.stringify(user)}: ${account.reason}` };
    const { uid } = account.value;
    if (uid === 0) {
      return { ok: false, key, reason: `${JSON.stringify(user)} is root (uid 0); name an unprivileged user` };
    }
    if (uid === OVERFLOW_UID) {
      return {
        ok: false,
        key,
        reason: `${JSON.stringify(user)} is the overflow user (uid ${OVERFLOW_UID}), shared by other services; every process of a run_as user is killed after each run, so name users of this Runner's own`,
      };
    }
    if (uid === runnerUid) {
      return {
        ok: false,
        key,
        reason: `${JSON.stringify(user)} is this Runner's own user (uid ${uid}); every process of a run_as user is killed after each run, so name another user (or omit run_as)`,
      };
    }
    const twin = byUid.get(uid);
    if (twin !== undefined) {
      return { ok: false, key, reason: `${JSON.stringify(user)} has the same uid (${uid}) as ${JSON.stringify(twin)}` };
    }
    byUid.set(uid, user);
    accounts.push({ user, uid, gid: account.value.gid, home: account.value.home });
  }
  let groupGid: number | null = null;
  if (group !== undefined) {
    const found = lookupGroup(group);
    if (!found.ok) return { ok: false, key: "run_as_group", reason: `${JSON.stringify(group)}: ${found.reason}` };
    if (found.value.gid === 0) {
      return {
        ok: false,
        key: "run_as_group",
        reason: `${JSON.stringify(group)} is gid 0; name an unprivileged group`,
      };
    }
    groupGid = found.value.gid;
  }
  const setpriv = findSystemTool("setpriv");
  if (setpriv === null) {
    return {
      ok: false,
      key: "run_as",
      reason: `needs setpriv (util-linux), not found in ${SYSTEM_TOOL_DIRS.join(", ")}`,
    };
  }
  const support = canSwitch();
  if (!support.ok) return { ok: false, key: "run_as", reason: `the Runner cannot switch users: ${support.reason}` };
  const pool = accounts.map((a) =>
    Object.freeze({
      user: a.user,
      uid: a.uid,
      gid: groupGid ?? a.gid,
      group: group ?? null,
      home: a.home,
      setpriv,
      clearBoundingSet: support.clearBoundingSet,
      sandbox,
    }),
  );
  return { ok: true, value: Object.freeze({ users: Object.freeze(pool) }) };
}
