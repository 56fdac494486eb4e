/**
 * Orphan reaping (design §4.4, Linux only). A Runner killed by SIGKILL leaves
 * its ACP children running, and an unobserved agent may keep editing the
 * project. At start-up, before anything else runs, every stored child
 * process group is terminated — but only after proving it is ours:
 *
 * - leader alive and its /proc start time equals the recorded one → the
 *   group is ours: SIGTERM the group, wait a bounded grace, SIGKILL the group;
 * - leader alive with another start time → the pid was reused: not ours, untouched;
 * - leader gone but members of the group remain (e.g. a SIGTERM-ignoring
 *   grandchild whose parent exited) → a process group id cannot be reused
 *   while any member lives, so members that started no earlier than the
 *   recorded leader and before this Runner started are ours and are killed.
 *
 * Logs carry the run id, pgid and counts only — never argv or paths.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { compareStartTimes, listGroupMembers, type ProcStat, readProcStat } from "./proc-identity.js";

export interface ReapTarget {
  run_id: string;
  pgid: number;
  startTime: string;
}

export type ReapOutcome =
  | "not_running" // nothing of the group is alive
  | "reaped" // the group was ours and is gone now
  | "identity_mismatch" // pid reused by someone else: left alone
  | "survived"; // ours, but still alive after SIGKILL and the grace (logged loudly)

export interface ReapResult extends ReapTarget {
  outcome: ReapOutcome;
  /** How many processes were signalled. */
  signalled: number;
  /** Whether SIGKILL was needed after the grace. */
  killed: boolean;
}

export interface ReapLogger {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

export interface ReapOptions {
  /** Wait this long after SIGTERM before SIGKILL. */
  graceMs?: number;
  /** Wait this long after SIGKILL for the group to vanish. */
  killWaitMs?: number;
  logger?: ReapLogger;
  /** Start time of the current (restarted) Runner; members started later are not from the crashed run. */
  selfStartTime?: string | null;
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: the group is already gone.
  }
}

function signalPids(pids: readonly number[], signal: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

/** Members of `target`'s group that are provably ours, plus whether signalling the whole group is safe. */
function ourMembers(target: ReapTarget, selfStart: string | null): { members: ProcStat[]; wholeGroup: boolean } | null {
  const leader = readProcStat(target.pgid);
  const members = listGroupMembers(target.pgid);
  if (leader && leader.state !== "Z") {
    if (leader.startTime !== target.startTime || leader.pgrp !== target.pgid) return null;
    return { members, wholeGroup: true };
  }
  const ours = members.filter(
    (m) =>
      compareStartTimes(m.startTime, target.startTime) >= 0 &&
      (selfStart === null || compareStartTimes(m.startTime, selfStart) <= 0),
  );
  return { members: ours, wholeGroup: ours.length === members.length };
}

async function waitGone(target: ReapTarget, pids: readonly number[], wholeGroup: boolean, ms: number) {
  const deadline = Date.now() + ms;
  for (;;) {
    const alive = wholeGroup
      ? listGroupMembers(target.pgid)
      : pids.map((p) => readProcStat(p)).filter((s): s is ProcStat => s !== null && s.state !== "Z");
    if (alive.length === 0) return true;
    if (Date.now() >= deadline) return false;
    await sleep(50);
  }
}

/** Terminate one recorded process group if it is still alive and provably ours. */
export async function reapGroup(target: ReapTarget, options: ReapOptions = {}): Promise<ReapResult> {
  const graceMs = options.graceMs ?? 2_000;
  const killWaitMs = options.killWaitMs ?? 2_000;
  const selfStart =
    options.selfStartTime !== undefined ? options.selfStartTime : (readProcStat(process.pid)?.startTime ?? null);
  const found = ourMembers(target, selfStart);
  if (found === null) {
    options.logger?.warn(
      { run_id: target.run_id, pgid: target.pgid },
      "recorded process group leader has a different start time; pid reused, not signalled",
    );
    return { ...target, outcome: "identity_mismatch", signalled: 0, killed: false };
  }
  const { members, wholeGroup } = found;
  if (members.length === 0) return { ...target, outcome: "not_running", signalled: 0, killed: false };
  const pids = members.map((m) => m.pid);
  const send = (signal: NodeJS.Signals) => (wholeGroup ? signalGroup(target.pgid, signal) : signalPids(pids, signal));

  send("SIGTERM");
  let killed = false;
  if (!(await waitGone(target, pids, wholeGroup, graceMs))) {
    killed = true;
    send("SIGKILL");
  }
  const gone = killed ? await waitGone(target, pids, wholeGroup, killWaitMs) : true;
  const result: ReapResult = {
    ...target,
    outcome: gone ? "reaped" : "survived",
    signalled: members.length,
    killed,
  };
  const log = { run_id: target.run_id, pgid: target.pgid, processes: members.length, sigkill: killed };
  if (gone) options.logger?.info(log, "reaped orphaned agent process group of a recovered run");
  else options.logger?.warn(log, "orphaned agent process group survived SIGKILL");
  return result;
}

/** Reap every target, one after another (there are at most max_concurrent_runs of them). */
export async function reapAll(targets: readonly ReapTarget[], options: ReapOptions = {}): Promise<ReapResult[]> {
  const results: ReapResult[] = [];
  for (const target of targets) results.push(await reapGroup(target, options));
  return results;
}
