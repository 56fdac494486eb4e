/**
 * The HOMEs of run_as pool users (design §4.2, tenancy): what `check` and start-up refuse, and how a
 * recycled user's HOME is wiped and re-created (process/user-pool.ts recycles a user whose caller left it
 * unused for `binding_idle_days`).
 *
 * Refused, naming the user and the fix (operator output only; nothing here reaches the Server):
 * - a HOME that group or others may read, write or enter (`useradd -m` makes 0755 homes, so another pool
 *   user, serving another caller, could read what a run left there): `chmod 700 HOME`;
 * - an odd HOME: not absolute, `/`, a symlink or not a directory, in a system tree, the Runner's state dir
 *   or a project root (or inside or holding one), the home template, or another pool user's HOME;
 * - a project root that group members may write, where that group is held by two or more pool users,
 *   unless the recipe of docs/security.md ("Giving agents a project through a group") is followed: the
 *   group is the `run_as_group` of every agent whose pool users hold it, and no pool user's primary group.
 * A missing HOME is no refusal (nothing to read; a recycle creates it unless it is odd, e.g. /nonexistent).
 *
 * Wiping never follows a symlink, never empties a HOME the user does not own (entries are lstat'ed, symlinks unlinked), never crosses into another
 * filesystem (a mount point inside the HOME stops the wipe), never goes deeper than MAX_HOME_DEPTH, and
 * only ever starts at the user's HOME as resolved from the passwd entry, after `oddHome` found it sound.
 */
import { execFileSync } from "node:child_process";
import { lstatSync, realpathSync, type Stats, statSync } from "node:fs";
import {
  chmod,
  chown,
  copyFile,
  lchown,
  lstat,
  mkdir,
  readdir,
  readlink,
  rmdir,
  symlink,
  unlink,
} from "node:fs/promises";
import { dirname, isAbsolute, join, normalize, sep } from "node:path";
import type { RunnerConfig } from "../config/config.js";
import { findSystemTool, GETENT_TIMEOUT_MS, lookupUser, type RunAs } from "../config/run-as.js";

/** Deepest directory nesting a wipe or a template copy walks; deeper is refused (the user is quarantined). */
export const MAX_HOME_DEPTH = 64;
/** Most entries a home template may hold. */
export const MAX_TEMPLATE_ENTRIES = 10_000;
/** Trees no pool user's HOME may be or lie in. */
const SYSTEM_TREES = ["/etc", "/proc", "/sys", "/dev", "/boot", "/root", "/usr", "/bin", "/sbin", "/lib"];

/** Directories two levels deep that hold other users' or services' files: never a pool user's HOME. */
const SHARED_DIRS = [
  "/var/tmp",
  "/var/lib",
  "/var/log",
  "/var/cache",
  "/var/spool",
  "/var/mail",
  "/run/user",
  "/usr/local",
];

/** A HOME that cannot be wiped safely, or a template that cannot be copied: the user is quarantined. */
export class PoolHomeError extends Error {
  override readonly name = "PoolHomeError";
}

/** What a HOME is measured against. */
export interface HomeGuard {
  readonly stateDir: string;
  readonly projectRoots: readonly string[];
  readonly homeTemplate: string | null;
  /** Every pool user's HOME, by uid. */
  readonly homes: ReadonlyMap<number, string>;
}

function within(inner: string, outer: string): boolean {
  return inner === outer || inner.startsWith(outer.endsWith(sep) ? outer : outer + sep);
}

/** `p` with symlinks resolved where it exists (else as written). */
function real(p: string): string {
  try {
    return realpathSync(p);
  } catch {
    return p;
  }
}

/** Why `user`'s HOME is no place to wipe or to keep a caller's files, or null when it is sound. */
export function oddHome(user: Pick<RunAs, "uid" | "home">, guard: HomeGuard): string | null {
  const home = user.home;
  if (!isAbsolute(home) || normalize(home) !== home.replace(/\/+$/, "") || home.includes("/../")) {
    return `its HOME ${JSON.stringify(home)} is not a plain absolute path`;
  }
  if (home.replace(/\/+$/, "") === "") return "its HOME is /";
  // A top-level directory (/home, /srv, /tmp) or a shared system directory holds others' files.
  if (home.split("/").filter(Boolean).length < 2 || SHARED_DIRS.includes(home.replace(/\/+$/, ""))) {
    return `its HOME ${home} is a shared directory, not a home of its own`;
  }
  let st: Stats;
  try {
    st = lstatSync(home);
  } catch {
    st = undefined as unknown as Stats;
  }
  if (st?.isSymbolicLink()) return `its HOME ${home} is a symlink`;
  if (st !== undefined && !st.isDirectory()) return `its HOME ${home} is not a directory`;
  const at = real(home);
  const tree = SYSTEM_TREES.find((t) => within(at, t));
  if (tree !== undefined) return `its HOME ${home} is in the system tree ${tree}`;
  const named: [string, string][] = [
    ["the Runner's state dir", real(guard.stateDir)],
    ...guard.projectRoots.map((r): [string, string] => ["a project root", real(r)]),
    ...(guard.homeTemplate === null ? [] : [["acp.home_template", real(guard.homeTemplate)] as [string, string]]),
  ];
  for (const [what, path] of named) {
    if (within(at, path) || within(path, at)) return `its HOME ${home} is, holds or lies in ${what} (${path})`;
  }
  for (const [uid, other] of guard.homes) {
    if (uid === user.uid) continue;
    const o = real(other);
    if (within(at, o) || within(o, at)) return `its HOME ${home} is, holds or lies in another pool user's HOME`;
  }
  return null;
}

function exists(path: string): boolean {
  try {
    lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Every pool user of the config, once, by uid. */
export function poolUsers(config: RunnerConfig): Map<number, RunAs> {
  const users = new Map<number, RunAs>();
  for (const agent of config.acp.agents) for (const u of agent.runAs?.users ?? []) users.set(u.uid, u);
  return users;
}

export function homeGuard(config: RunnerConfig): HomeGuard {
  const homes = new Map<number, string>();
  for (const [uid, u] of poolUsers(config)) homes.set(uid, u.home);
  return {
    stateDir: config.runner.stateDir,
    projectRoots: config.projects.map((p) => p.root),
    homeTemplate: config.acp.homeTemplate,
    homes,
  };
}

/** The gids `user` holds from the group database (primary and supplementary), via `id -G`; empty when unknown. */
function groupsOf(user: string): number[] {
  const id = findSystemTool("id");
  if (id === null) return [];
  try {
    const out = execFileSync(id, ["-G", "--", user], {
      encoding: "utf8",
      timeout: GETENT_TIMEOUT_MS,
      stdio: ["ignore", "pipe", "ignore"],
    });
    return out
      .trim()
      .split(/\s+/)
      .filter((g) => /^\d+$/.test(g))
      .map(Number);
  } catch {
    return [];
  }
}

/**
 * What `check` and start-up refuse about pool users' HOMEs and the projects' group write access, one line
 * each (names users and paths: for the operator's own output only). `groups` is injectable for tests.
 */
export function poolHomeRefusals(config: RunnerConfig, groups: (user: string) => number[] = groupsOf): string[] {
  const out: string[] = [];
  const users = poolUsers(config);
  if (users.size === 0) return out;
  const guard = homeGuard(config);
  for (const u of users.values()) {
    if (!exists(u.home)) continue; // no HOME: nothing to read (`adduser --system` gives /nonexistent)
    const odd = oddHome(u, guard);
    if (odd !== null) {
      out.push(
        `run_as user ${u.user}: ${odd}; give each pool user a HOME of its own (usermod -d /home/${u.user} -m ${u.user})`,
      );
      continue;
    }
    const mode = lstatSync(u.home).mode & 0o777;
    if ((mode & 0o077) !== 0) {
      out.push(
        `run_as user ${u.user}: its HOME ${u.home} has mode ${mode.toString(8).padStart(4, "0")}: other users, among them ` +
          `pool users serving other callers, can ${mode & 0o022 ? "write or " : ""}read what a run leaves there; run: chmod 700 ${u.home}`,
      );
    }
  }
  // Who holds which group: the user's primary and supplementary groups, and the agent's run_as_group.
  const primary = new Map<number, number>(); // uid -> passwd primary gid
  const holders = new Map<number, Set<number>>(); // gid -> uids
  const hold = (gid: number, uid: number) => {
    const set = holders.get(gid) ?? new Set<number>();
    set.add(uid);
    holders.set(gid, set);
  };
  for (const u of users.values()) {
    const account = lookupUser(u.user);
    if (account.ok) {
      primary.set(u.uid, account.value.gid);
      hold(account.value.gid, u.uid);
    }
    for (const gid of groups(u.user)) hold(gid, u.uid);
    hold(u.gid, u.uid);
  }
  for (const project of config.projects) {
    let st: Stats;
    try {
      st = statSync(project.root);
    } catch {
      continue;
    }
    if ((st.mode & 0o020) === 0) continue;
    const sharing = holders.get(st.gid);
    if (sharing === undefined || sharing.size < 2) continue;
    const names = [...sharing].map((uid) => users.get(uid)?.user ?? String(uid)).sort();
    const agentsOf = config.acp.agents.filter((a) => a.runAs?.users.some((u) => sharing.has(u.uid)));
    const viaRunAsGroup = agentsOf.every((a) => a.runAs?.users.every((u) => u.group !== null && u.gid === st.gid));
    const someonesPrimary = [...primary.values()].includes(st.gid);
    if (viaRunAsGroup && !someonesPrimary) continue;
    const why = someonesPrimary
      ? "it is a pool user's primary group"
      : `it is not the run_as_group of ${agentsOf
          .filter((a) => !a.runAs?.users.every((u) => u.group !== null && u.gid === st.gid))
          .map((a) => a.id)
          .join(", ")}`;
    out.push(
      `project ${project.id}: its root ${project.root} is writable by its group (gid ${st.gid}), which pool users ` +
        `${names.join(", ")} share, and ${why}; follow docs/security.md "Giving agents a project through a group": a ` +
        "dedicated group that is no pool user's primary group, named as run_as_group on every agent whose users hold it",
    );
  }
  return out;
}

export interface RecycledHome {
  /** Entries removed from the old HOME. */
  readonly removed: number;
  /** Entries copied from the template. */
  readonly copied: number;
}

/** Remove everything below `dir` (not `dir` itself) without following symlinks or leaving `dev`. */
async function emptyTree(dir: string, dev: number, depth: number): Promise<number> {
  if (depth > MAX_HOME_DEPTH) throw new PoolHomeError(`nested deeper than ${MAX_HOME_DEPTH} directories`);
  let removed = 0;
  for (const name of await readdir(dir)) {
    const path = join(dir, name);
    const st = await lstat(path);
    if (st.dev !== dev) throw new PoolHomeError("holds a mount point");
    if (st.isDirectory()) {
      removed += await emptyTree(path, dev, depth + 1);
      await rmdir(path);
    } else {
      await unlink(path);
    }
    removed += 1;
  }
  return removed;
}

/** Copy `from` into `to` (which exists), owner-only modes, everything owned by `uid:gid`. */
async function copyTemplate(from: string, to: string, uid: number, gid: number, depth: number, count: { n: number }) {
  if (depth > MAX_HOME_DEPTH) throw new PoolHomeError(`home_template nests deeper than ${MAX_HOME_DEPTH} directories`);
  for (const name of await readdir(from)) {
    if (++count.n > MAX_TEMPLATE_ENTRIES)
      throw new PoolHomeError(`home_template holds more than ${MAX_TEMPLATE_ENTRIES} entries`);
    const src = join(from, name);
    const dst = join(to, name);
    const st = await lstat(src);
    if (st.isDirectory()) {
      await mkdir(dst, { mode: 0o700 });
      await chown(dst, uid, gid);
      await copyTemplate(src, dst, uid, gid, depth + 1, count);
    } else if (st.isFile()) {
      await copyFile(src, dst);
      await chmod(dst, st.mode & 0o700);
      await chown(dst, uid, gid);
    } else if (st.isSymbolicLink()) {
      await symlink(await readlink(src), dst);
      await lchown(dst, uid, gid);
    } else {
      throw new PoolHomeError("home_template holds an entry that is neither a file, a directory nor a symlink");
    }
  }
}

/**
 * Wipe `user`'s HOME and re-create it from `template` (or empty): owned by the user, mode 0700. The user
 * must have no process left (the pool sweeps it first). Throws PoolHomeError (or a file system error) when
 * the HOME is odd or cannot be wiped; the pool then quarantines the user.
 */
export async function recycleHome(user: RunAs, guard: HomeGuard): Promise<RecycledHome> {
  const home = user.home;
  let removed = 0;
  let st: Stats | null = null;
  try {
    st = await lstat(home);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
  }
  const odd = oddHome(user, guard);
  // A missing odd HOME (`/nonexistent`) holds nothing to wipe, and is no place to create one.
  if (odd !== null && st === null) return { removed: 0, copied: 0 };
  if (odd !== null) throw new PoolHomeError(odd);
  if (st === null) {
    await mkdir(dirname(home), { recursive: true, mode: 0o755 });
    await mkdir(home, { mode: 0o700 });
  } else {
    // Only a directory the pool user owns is its own to lose.
    if (st.uid !== user.uid) throw new PoolHomeError(`its HOME ${home} is not owned by the user (uid ${st.uid})`);
    removed = await emptyTree(home, st.dev, 0);
  }
  await chown(home, user.uid, user.gid);
  await chmod(home, 0o700);
  const count = { n: 0 };
  if (guard.homeTemplate !== null) await copyTemplate(guard.homeTemplate, home, user.uid, user.gid, 0, count);
  return { removed, copied: count.n };
}
