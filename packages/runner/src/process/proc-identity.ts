/**
 * Process identity from /proc (Linux only). A pid alone is not an identity:
 * pids are reused. The pair (pid, start time) is, because the kernel's
 * start time (field 22 of /proc/PID/stat, clock ticks since boot) never
 * repeats for a live pid within one boot. Used to record a child's process
 * group at spawn and to prove, after a crash, that a surviving group is ours
 * before signalling it. On non-Linux hosts every read returns null, so the
 * reaper does nothing rather than guess.
 */
import { closeSync, openSync, readdirSync, readFileSync, readSync } from "node:fs";

export interface ProcStat {
  pid: number;
  /** One-letter state: R, S, D, Z (zombie), T, … */
  state: string;
  ppid: number;
  pgrp: number;
  /** Field 22, clock ticks since boot, kept as a decimal string (it can exceed 2^53 in theory). */
  startTime: string;
}

/** Parse the text of /proc/PID/stat. The comm field may contain spaces and parentheses. */
export function parseProcStat(text: string): ProcStat | null {
  const open = text.indexOf("(");
  const close = text.lastIndexOf(")");
  if (open < 0 || close < open) return null;
  const pid = Number.parseInt(text.slice(0, open).trim(), 10);
  // Fields from 3 (state) onwards; field N is rest[N - 3].
  const rest = text
    .slice(close + 1)
    .trim()
    .split(/\s+/);
  const state = rest[0];
  const ppid = rest[1];
  const pgrp = rest[2];
  const startTime = rest[19];
  if (!Number.isInteger(pid) || state === undefined || ppid === undefined || pgrp === undefined) return null;
  if (startTime === undefined || !/^\d+$/.test(startTime)) return null;
  return { pid, state, ppid: Number(ppid), pgrp: Number(pgrp), startTime };
}

/** /proc/PID/stat of a live (or zombie) process, or null if it does not exist or /proc is unavailable. */
export function readProcStat(pid: number): ProcStat | null {
  if (!Number.isInteger(pid) || pid <= 0) return null;
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  return parseProcStat(text);
}

/** The start time of `pid` (field 22 of /proc/PID/stat), or null if the process does not exist. */
export function readStartTime(pid: number): string | null {
  return readProcStat(pid)?.startTime ?? null;
}

/** Whether start-time identity can be read on this host. */
export function procIdentitySupported(): boolean {
  return process.platform === "linux" && readStartTime(process.pid) !== null;
}

/** The pid of every process in /proc (empty where /proc is unavailable). */
function listPids(): number[] {
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return [];
  }
  return entries.filter((name) => /^\d+$/.test(name)).map(Number);
}

/**
 * Every live process whose process group is `pgid`, by scanning /proc. A Z state whose process still has
 * threads running (its main thread exited) counts as live.
 */
export function listGroupMembers(pgid: number): ProcStat[] {
  const out: ProcStat[] = [];
  for (const pid of listPids()) {
    const stat = readProcStat(pid);
    if (!stat || stat.pgrp !== pgid) continue;
    if (stat.state === "Z" && readStatusIds(pid)?.zombie !== false) continue;
    out.push(stat);
  }
  return out;
}

/** Compare two start-time tick strings numerically. */
export function compareStartTimes(a: string, b: string): number {
  const x = BigInt(a);
  const y = BigInt(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

/** A process found by `listUidProcesses`: its pid and the pool uid it runs as. */
export interface UidProcess {
  pid: number;
  uid: number;
}

/** What the start of /proc/PID/status says of a process: whether it is a zombie (or dead) and its uids. */
export interface StatusIds {
  /** State Z or X. */
  zombie: boolean;
  /** Real, effective and saved uid (the `Uid:` line's first three fields). */
  uids: readonly [number, number, number];
}

/** Parse the `State:` and `Uid:` lines of a /proc/PID/status text; null without a `Uid:` line. */
export function parseStatusIds(text: string): StatusIds | null {
  const ids = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(text);
  if (!ids) return null;
  // /proc/PID/status shows the state of the main thread: a process whose main thread exited while others run
  // reads Z but is alive, so it counts as a zombie only with one thread left.
  const threads = /^Threads:\s+(\d+)/m.exec(text);
  const zombie = /^State:\s+[ZX]/m.test(text) && (threads === null || Number(threads[1]) <= 1);
  return { zombie, uids: [Number(ids[1]), Number(ids[2]), Number(ids[3])] };
}

/** State and uids of `pid` from /proc/PID/status, or null if it does not exist or /proc is unavailable. */
export function readStatusIds(pid: number): StatusIds | null {
  if (!Number.isInteger(pid) || pid <= 0) return null;
  const status = readStatusHead(pid);
  return status === null ? null : parseStatusIds(status);
}

/** Bytes read of each /proc/PID/status (State and Uid are in its first few hundred). */
export const STATUS_READ_BYTES = 4096;
const statusBuffer = Buffer.alloc(STATUS_READ_BYTES);

/** The start of /proc/PID/status (one read into a shared buffer: a sweep reads one per process), or null. */
function readStatusHead(pid: number): string | null {
  let fd: number;
  try {
    fd = openSync(`/proc/${pid}/status`, "r");
  } catch {
    return null; // gone meanwhile
  }
  try {
    const n = readSync(fd, statusBuffer, 0, STATUS_READ_BYTES, 0);
    return statusBuffer.toString("latin1", 0, n);
  } catch {
    return null;
  } finally {
    closeSync(fd);
  }
}

/**
 * Every live (non-zombie) process whose real, effective or saved uid is in
 * `uids`, by scanning /proc/PID/status (readable for every process, whatever
 * it did to its dumpable flag, process group or session). This process
 * itself is never listed.
 */
export function listUidProcesses(uids: ReadonlySet<number>): UidProcess[] {
  const out: UidProcess[] = [];
  for (const pid of listPids()) {
    if (pid === process.pid) continue;
    const status = readStatusIds(pid);
    if (status === null || status.zombie) continue;
    const match = status.uids.find((uid) => uids.has(uid));
    if (match !== undefined) out.push({ pid, uid: match });
  }
  return out;
}
