import { type ChildProcess, spawn } from "node:child_process";
import { afterEach, describe, expect, it } from "vitest";
import { poll } from "../../../../scripts/test-support/index.js";
import {
  listGroupMembers,
  parseProcStat,
  parseStatusIds,
  readStartTime,
  readStatusIds,
} from "../../src/process/proc-identity.js";
import { reapGroup } from "../../src/process/reaper.js";

const IGNORE_TERM = "process.on('SIGTERM', () => {}); setInterval(() => {}, 1000); console.log('ready');";
const spawned: ChildProcess[] = [];

function spawnGroup(script: string): ChildProcess {
  const child = spawn("/bin/sh", ["-c", script], { detached: true, stdio: ["ignore", "pipe", "ignore"] });
  spawned.push(child);
  return child;
}

/** Bound on a spawned group reaching the state a test waits for. */
const GROUP_WAIT_MS = 10_000;

afterEach(() => {
  for (const child of spawned.splice(0)) {
    try {
      if (child.pid) process.kill(-child.pid, "SIGKILL");
    } catch {
      // gone
    }
  }
});

const node = JSON.stringify(process.execPath);

/** Resolves once `count` "ready" lines (written after the SIGTERM handler is installed) arrived. */
function readyLines(child: ChildProcess, count: number): Promise<void> {
  return new Promise((resolve) => {
    let seen = 0;
    child.stdout?.on("data", (chunk: Buffer) => {
      seen += chunk.toString().split("ready").length - 1;
      if (seen >= count) resolve();
    });
  });
}

describe("proc identity", () => {
  it("parses /proc/PID/stat with spaces and parentheses in comm", () => {
    const fields = Array.from({ length: 50 }, (_, i) => String(i + 3));
    fields[0] = "S";
    const stat = parseProcStat(`123 (a (b) c) ${fields.join(" ")}`);
    expect(stat).toEqual({ pid: 123, state: "S", ppid: 4, pgrp: 5, startTime: "22" });
  });

  it("parses State and the real, effective and saved uid of /proc/PID/status", () => {
    const status = (state: string) => `Name:\tnode\nState:\t${state}\nTgid:\t1\nUid:\t1001\t1002\t1003\t1004\n`;
    expect(parseStatusIds(status("S (sleeping)"))).toEqual({ zombie: false, uids: [1001, 1002, 1003] });
    expect(parseStatusIds(status("Z (zombie)"))?.zombie).toBe(true);
    expect(parseStatusIds(status("X (dead)"))?.zombie).toBe(true);
    // The state is the main thread's: a Z process whose other threads still run is alive, and must be killed.
    const threads = (state: string, n: number) => `${status(state)}Threads:\t${n}\n`;
    expect(parseStatusIds(threads("Z (zombie)", 3))?.zombie).toBe(false);
    expect(parseStatusIds(threads("Z (zombie)", 1))?.zombie).toBe(true);
    expect(parseStatusIds("Name:\tnode\nState:\tS (sleeping)\n")).toBeNull();
    expect(readStatusIds(process.pid)?.uids[0]).toBe(process.getuid?.());
    expect(readStatusIds(2 ** 22 + 7)).toBeNull();
  });

  it("reads this process's start time", () => {
    expect(readStartTime(process.pid)).toMatch(/^\d+$/);
    expect(readStartTime(2 ** 22 + 7)).toBeNull();
  });
});

describe("orphan reaper", () => {
  it("kills a verified process group, including a member that ignores SIGTERM", async () => {
    const child = spawnGroup(`${node} -e "${IGNORE_TERM}" & ${node} -e "${IGNORE_TERM}"`);
    const pgid = child.pid!;
    const startTime = await poll(() => readStartTime(pgid), { timeoutMs: GROUP_WAIT_MS });
    await readyLines(child, 2);
    const result = await reapGroup({ run_id: "r1", pgid, startTime }, { graceMs: 300 });
    expect(result.outcome).toBe("reaped");
    expect(result.killed).toBe(true);
    expect(listGroupMembers(pgid)).toEqual([]);
  });

  it("kills the surviving members of a group whose leader already exited", async () => {
    const child = spawnGroup(`${node} -e "${IGNORE_TERM}" & sleep 0.3; exit 0`);
    const pgid = child.pid!;
    const startTime = await poll(() => readStartTime(pgid), { timeoutMs: GROUP_WAIT_MS });
    await readyLines(child, 1);
    await poll(() => readStartTime(pgid) === null, { timeoutMs: GROUP_WAIT_MS });
    // selfStartTime null: here the "orphan" was started after this test process, unlike after a real restart.
    const result = await reapGroup({ run_id: "r2", pgid, startTime }, { graceMs: 200, selfStartTime: null });
    expect(result.outcome).toBe("reaped");
    expect(listGroupMembers(pgid)).toEqual([]);
  });

  it("does not signal a pid whose start time differs from the recorded one", async () => {
    const child = spawnGroup("sleep 30");
    const pgid = child.pid!;
    const actual = await poll(() => readStartTime(pgid), { timeoutMs: GROUP_WAIT_MS });
    const wrong = (BigInt(actual) - 1n).toString();
    const result = await reapGroup({ run_id: "r3", pgid, startTime: wrong }, { graceMs: 100 });
    expect(result.outcome).toBe("identity_mismatch");
    expect(readStartTime(pgid)).toBe(actual);
    expect(listGroupMembers(pgid).length).toBeGreaterThan(0);
  });

  it("reports a group that no longer exists as not running", async () => {
    const child = spawnGroup("exit 0");
    const pgid = child.pid!;
    await new Promise((r) => child.once("exit", r));
    const result = await reapGroup({ run_id: "r4", pgid, startTime: "1" });
    expect(result.outcome).toBe("not_running");
  });
});
