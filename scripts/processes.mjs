/**
 * Process lookup from /proc (Linux): what a test needs to prove that no
 * process of its own outlived what it stopped. A zombie (state Z) or a dying
 * task (X) counts as gone: it runs no code and only waits to be reaped.
 */
import { readdirSync, readFileSync } from "node:fs";

/** The state letter of /proc/<pid>/stat (R, S, D, Z, …), or null once the pid is gone. */
function procState(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name in parentheses may itself hold spaces and parentheses; the state follows the last ")".
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? null;
  } catch {
    return null;
  }
}
/** Whether `pid` is a live process (neither gone nor a zombie). */
export function alive(pid) {
  const state = procState(pid);
  return state !== null && state !== "Z" && state !== "X";
}
/**
 * Pids of live processes other than this one whose command line contains
 * `needle`. Tests pass a path unique to them (their temp dir or ledger file),
 * which every daemon and agent they started carries in its argv.
 */
export function processesMentioning(needle) {
  const out = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    if (pid === process.pid) continue;
    let cmdline;
    try {
      cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8");
    } catch {
      continue; // exited while we looked
    }
    if (cmdline.includes(needle) && alive(pid)) out.push(pid);
  }
  return out;
}
/** SIGKILL each pid; one that is already gone is skipped. */
export function killProcesses(pids) {
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}
