/**
 * Child processes the bench starts, and /proc sampling of their memory and CPU.
 * Every child gets its own process group and is killed by id on every exit path.
 */
import { execFileSync, spawn } from "node:child_process";
import { openSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { killProcesses, processesMentioning } from "../../processes.mjs";

const tracked = new Set();
let handlersInstalled = false;

function clockTicks() {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
}
export const CLK_TCK = clockTicks();

function killGroup(pid, signal) {
  try {
    process.kill(-pid, signal);
  } catch {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

function installHandlers() {
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on("exit", () => {
    for (const entry of tracked) killGroup(entry.pid, "SIGKILL");
  });
  for (const signal of ["SIGINT", "SIGTERM"]) {
    process.once(signal, () => {
      for (const entry of tracked) killGroup(entry.pid, "SIGKILL");
      process.exit(130);
    });
  }
}

/**
 * Spawn `command` in its own process group. stdout/stderr go to `logFile`
 * (append) unless `stdio` is given. Returns { child, pid, exited }.
 */
export function spawnTracked(command, args, { logFile, stdio, env, cwd } = {}) {
  installHandlers();
  let io = stdio;
  if (!io) {
    const fd = logFile ? openSync(logFile, "a") : "ignore";
    io = ["ignore", fd, fd];
  }
  const child = spawn(command, args, { detached: true, stdio: io, env: env ?? process.env, cwd });
  const entry = { pid: child.pid, child };
  tracked.add(entry);
  const exited = new Promise((resolve) => {
    child.once("exit", (code, signal) => {
      tracked.delete(entry);
      resolve({ code, signal });
    });
    child.once("error", (error) => {
      tracked.delete(entry);
      resolve({ code: null, signal: null, error });
    });
  });
  return { child, pid: child.pid, exited };
}

/** SIGTERM the child's group, wait up to `graceMs`, then SIGKILL. Resolves when it has exited. */
export async function stopTracked(handle, graceMs = 3000) {
  if (!handle || handle.child.exitCode !== null || handle.child.signalCode !== null) return;
  killGroup(handle.pid, "SIGTERM");
  const timer = setTimeout(() => killGroup(handle.pid, "SIGKILL"), graceMs);
  await handle.exited;
  clearTimeout(timer);
  // The group may still hold grandchildren (e.g. an agent whose parent died).
  killGroup(handle.pid, "SIGKILL");
}

/** Kill every process whose command line contains `marker` (a unique temp path of this bench). */
export function killByMarker(marker) {
  const pids = processesMentioning(marker);
  killProcesses(pids);
  return pids.length;
}

/** { rssKb, hwmKb, cpuMs } of one live pid, or null. */
export function readProc(pid) {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const rss = /VmRSS:\s+(\d+)/.exec(status);
    const hwm = /VmHWM:\s+(\d+)/.exec(status);
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the parenthesised comm: state is field 3, utime 14, stime 15.
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const utime = Number(rest[11]);
    const stime = Number(rest[12]);
    return {
      rssKb: rss ? Number(rss[1]) : 0,
      hwmKb: hwm ? Number(hwm[1]) : 0,
      cpuMs: ((utime + stime) * 1000) / CLK_TCK,
    };
  } catch {
    return null;
  }
}

/** How many file descriptors `pid` has open (its /proc/PID/fd entries), or null once it is gone. */
export function openFds(pid) {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return null;
  }
}

/** Direct children of `pid` (needs /proc/PID/task/TID/children). */
export function childrenOf(pid) {
  const out = [];
  try {
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      const text = readFileSync(join(`/proc/${pid}/task`, tid, "children"), "utf8").trim();
      if (text) for (const c of text.split(/\s+/)) out.push(Number(c));
    }
  } catch {
    // gone
  }
  return out;
}

/**
 * Samples named pids every `intervalMs` between start() and stop():
 * peak VmRSS seen, VmHWM at the end, CPU time spent inside the window.
 */
export class ProcSampler {
  constructor(pids, intervalMs = 50) {
    this.pids = pids; // { name: pid }
    this.intervalMs = intervalMs;
    this.state = {};
    this.timer = null;
  }

  sample() {
    for (const [name, pid] of Object.entries(this.pids)) {
      const now = readProc(pid);
      if (!now) continue;
      const s = this.state[name];
      if (!s) {
        this.state[name] = { firstCpuMs: now.cpuMs, lastCpuMs: now.cpuMs, peakRssKb: now.rssKb, hwmKb: now.hwmKb };
      } else {
        s.lastCpuMs = now.cpuMs;
        s.peakRssKb = Math.max(s.peakRssKb, now.rssKb);
        s.hwmKb = now.hwmKb;
      }
    }
  }

  start() {
    this.sample();
    this.timer = setInterval(() => this.sample(), this.intervalMs);
    this.timer.unref();
    return this;
  }

  /** { name: { peak_rss_mb, hwm_mb, cpu_ms } } */
  stop() {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.sample();
    const out = {};
    for (const [name, s] of Object.entries(this.state)) {
      out[name] = {
        peak_rss_mb: s.peakRssKb / 1024,
        hwm_mb: s.hwmKb / 1024,
        cpu_ms: s.lastCpuMs - s.firstCpuMs,
      };
    }
    return out;
  }
}
