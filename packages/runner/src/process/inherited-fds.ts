/**
 * File descriptors beyond the three pipes never reach an agent (design §4.2).
 *
 * Node and libuv open every descriptor close-on-exec, but a descriptor this
 * process *inherited* without FD_CLOEXEC (a shell's `3<secret`, a supervisor's
 * pipe or socket) stays open across every exec — libuv does not close it, and
 * an agent would get it too. Two layers:
 *
 * - `closeInheritedFds()` — the Runner's command line (main.ts) closes every
 *   such descriptor before anything else runs (it never uses them); only
 *   Node's own IPC channel (NODE_CHANNEL_FD) and V8's own files (perf map, isolate log) are kept.
 * - `inheritedFdStdio()` — for a RunManager embedded in another process: the
 *   descriptors found without FD_CLOEXEC at its first spawn are covered in
 *   every child by /dev/null (stdio entries 3…n), up to MAX_MASKED_FD.
 *
 * Linux only (/proc/self/fdinfo); elsewhere both do nothing.
 */
import { closeSync, openSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { basename } from "node:path";

/** O_CLOEXEC as shown in the octal `flags:` line of /proc/self/fdinfo/N. */
const O_CLOEXEC = 0o2000000;
/** Highest descriptor number masked at spawn (the stdio array grows to it). */
export const MAX_MASKED_FD = 1024;

/** Descriptors ≥ 3 of this process that are not close-on-exec, ascending. */
export function scanInheritableFds(): number[] {
  let names: string[];
  try {
    names = readdirSync("/proc/self/fd");
  } catch {
    return [];
  }
  const out: number[] = [];
  for (const name of names) {
    const fd = Number(name);
    if (!Number.isInteger(fd) || fd < 3) continue;
    let info: string;
    try {
      info = readFileSync(`/proc/self/fdinfo/${fd}`, "utf8");
    } catch {
      continue; // the directory handle itself, closed by now
    }
    const flags = /^flags:\s*([0-7]+)$/m.exec(info)?.[1];
    if (flags !== undefined && (Number.parseInt(flags, 8) & O_CLOEXEC) === 0) out.push(fd);
  }
  return out.sort((a, b) => a - b);
}

/**
 * Whether `fd` is a file V8 writes for this process: the map for `perf` (node --perf-basic-prof) or its isolate log
 * (`isolate-0x…-PID-v8.log`, which --perf-basic-prof and the --log flags open). V8 opens them without close-on-exec
 * before any JS runs, and writes to that number for the life of the process, so closing one would send V8's lines
 * into whatever file reuses the number (the dispatch store, which SQLite then finds corrupt).
 */
function isV8Own(fd: number): boolean {
  let target: string;
  try {
    target = readlinkSync(`/proc/self/fd/${fd}`);
  } catch {
    return false;
  }
  return target === `/tmp/perf-${process.pid}.map` || v8IsolateLog(process.pid).test(basename(target));
}

/** The name V8 gives the isolate log of process `pid` (one per isolate). */
function v8IsolateLog(pid: number): RegExp {
  return new RegExp(`^isolate-0x[0-9a-f]+-${pid}-(\\d+-)?v8\\.log$`);
}

/** Close every inherited descriptor but Node's IPC channel (and V8's own files). Returns how many were closed. */
export function closeInheritedFds(env: NodeJS.ProcessEnv = process.env): number {
  const channel = Number(env.NODE_CHANNEL_FD);
  let closed = 0;
  for (const fd of scanInheritableFds()) {
    if (fd === channel || isV8Own(fd)) continue;
    try {
      closeSync(fd);
      closed++;
    } catch {
      // already closed
    }
  }
  return closed;
}

let inherited: number[] | undefined;

/**
 * Extra stdio entries (index 3 onwards) that put /dev/null over every
 * descriptor this process inherited, and a `close` for the /dev/null handle
 * (call it once the spawn returned). Empty when nothing was inherited.
 */
export function inheritedFdStdio(): { extra: (number | "ignore")[]; close(): void } {
  inherited ??= scanInheritableFds().filter((fd) => fd <= MAX_MASKED_FD);
  const fds = inherited;
  const last = fds[fds.length - 1];
  if (last === undefined) return { extra: [], close: () => {} };
  const devNull = openSync("/dev/null", "r+");
  const extra: (number | "ignore")[] = [];
  for (let fd = 3; fd <= last; fd++) extra.push(fds.includes(fd) ? devNull : "ignore");
  return { extra, close: () => closeSync(devNull) };
}
