/**
 * The contracts of the shared test support that every other test leans on:
 * poll's result, timeout and error, readLedger's complete-lines-only read,
 * process lookup, and DaemonProcess's output and stop.
 */
import { spawn } from "node:child_process";
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  alive,
  DaemonProcess,
  killProcesses,
  ledgerPrompts,
  poll,
  processesMentioning,
  readLedger,
} from "../test-support/index.js";
import { canary } from "../vitest/canary.js";

/** A short bound for conditions that are decided at once, so a timeout test stays quick. */
const SHORT_WAIT_MS = 200;
/** Bound on a child process starting or exiting. */
const CHILD_WAIT_MS = 10_000;

const dirs: string[] = [];
const pids: number[] = [];
afterEach(() => {
  killProcesses(pids.splice(0));
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "wc-test-support-"));
  dirs.push(dir);
  return dir;
}

describe("poll", () => {
  it("resolves with the first truthy value of the condition", async () => {
    let calls = 0;
    const value = await poll(() => (++calls >= 3 ? { calls } : undefined), { timeoutMs: CHILD_WAIT_MS, intervalMs: 1 });
    expect(value).toEqual({ calls: 3 });
  });

  it("awaits an async condition", async () => {
    expect(await poll(async () => "ready", { timeoutMs: SHORT_WAIT_MS })).toBe("ready");
  });

  it("rejects after the timeout with an error naming what it waited for and how long", async () => {
    const started = Date.now();
    await expect(poll(() => false, { timeoutMs: SHORT_WAIT_MS, what: "the impossible" })).rejects.toThrow(
      `timed out after ${SHORT_WAIT_MS} ms waiting for the impossible`,
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(SHORT_WAIT_MS);
  });

  it("names the condition's source when no `what` is given, and calls a `what` function only on failure", async () => {
    await expect(poll(() => 1 > 2, { timeoutMs: SHORT_WAIT_MS })).rejects.toThrow("() => 1 > 2");
    let described = 0;
    const what = () => `call ${++described}`;
    await poll(() => true, { timeoutMs: SHORT_WAIT_MS, what });
    expect(described).toBe(0);
    await expect(poll(() => false, { timeoutMs: SHORT_WAIT_MS, what })).rejects.toThrow("waiting for call 1");
  });

  it("rejects at once with the condition's own error", async () => {
    const started = Date.now();
    await expect(
      poll(
        () => {
          throw new Error("the daemon exited");
        },
        { timeoutMs: CHILD_WAIT_MS },
      ),
    ).rejects.toThrow("the daemon exited");
    expect(Date.now() - started).toBeLessThan(CHILD_WAIT_MS);
  });
});

describe("readLedger", () => {
  it("reads every complete line, leaves out a line still being written, and is empty without a file", () => {
    const file = join(tempDir(), "ledger.jsonl");
    expect(readLedger(file)).toEqual([]);
    writeFileSync(file, `${JSON.stringify({ event: "prompt", n: 1 })}\n${JSON.stringify({ event: "cancel" })}\n`);
    appendFileSync(file, '{"event":"prompt","n"');
    expect(readLedger(file)).toEqual([{ event: "prompt", n: 1 }, { event: "cancel" }]);
    appendFileSync(file, ":2}\n");
    expect(ledgerPrompts(file)).toEqual([
      { event: "prompt", n: 1 },
      { event: "prompt", n: 2 },
    ]);
  });
});

describe("process lookup", () => {
  it("finds a live process by a unique string in its argv and no longer once it is killed", async () => {
    const needle = canary("argv");
    const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)", needle], { stdio: "ignore" });
    const pid = child.pid!;
    pids.push(pid);
    const exited = new Promise((r) => child.once("exit", r));
    expect(await poll(() => processesMentioning(needle).length > 0, { timeoutMs: CHILD_WAIT_MS })).toBe(true);
    expect(processesMentioning(needle)).toEqual([pid]);
    expect(alive(pid)).toBe(true);
    killProcesses([pid]);
    await exited;
    expect(processesMentioning(needle)).toEqual([]);
    expect(alive(pid)).toBe(false);
  });
});

describe("DaemonProcess", () => {
  /** A stand-in daemon: prints to both streams, ignores SIGTERM, exits on SIGINT. */
  const script = [
    "process.on('SIGTERM', () => {});",
    "process.on('SIGINT', () => process.exit(3));",
    "process.stdout.write('out-line\\n');",
    "process.stderr.write('err-line\\n');",
    "setInterval(() => {}, 1000);",
  ].join(" ");

  function start(dir: string, capture: "both" | "stderr", stopGraceMs: number): DaemonProcess {
    const bin = join(dir, "daemon.js");
    writeFileSync(bin, script);
    const daemon = new DaemonProcess(bin, join(dir, "unused.toml"), {
      env: { PATH: process.env.PATH ?? "" },
      capture,
      stopGraceMs,
    });
    pids.push(daemon.pid!);
    return daemon;
  }

  it("holds both streams (or stderr alone) and answers a signal it handles", async () => {
    const dir = tempDir();
    const both = start(dir, "both", CHILD_WAIT_MS);
    await poll(() => both.output().includes("out-line") && both.output().includes("err-line"), {
      timeoutMs: CHILD_WAIT_MS,
    });
    const errOnly = start(dir, "stderr", CHILD_WAIT_MS);
    await poll(() => errOnly.output().includes("err-line"), { timeoutMs: CHILD_WAIT_MS });
    expect(errOnly.output()).not.toContain("out-line");
    expect(await both.signal("SIGINT")).toEqual({ code: 3, signal: null });
    expect(both.running).toBe(false);
    expect(await errOnly.stop("SIGINT")).toEqual({ code: 3, signal: null });
  });

  it("stop() sends SIGKILL after the grace when the signal is ignored", async () => {
    const daemon = start(tempDir(), "both", SHORT_WAIT_MS);
    await poll(() => daemon.output().includes("err-line"), { timeoutMs: CHILD_WAIT_MS });
    expect(await daemon.stop("SIGTERM")).toEqual({ code: null, signal: "SIGKILL" });
  });
});
