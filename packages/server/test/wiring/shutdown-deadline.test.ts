/**
 * `webcodex-server run` ends after SIGTERM within its shutdown deadline (wiring/teardown.ts SHUTDOWN_DEADLINE_MS)
 * even when a step left a handle open that would keep the event loop alive for ever: it then exits 1 and its log
 * names the kinds of handles still open. Without a leak it exits 0 on its own. A real Server child process.
 */
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { SHUTDOWN_DEADLINE_TEST_ENV, SHUTDOWN_LEAK_TEST_ENV } from "../../src/wiring/teardown.js";
import { ProcStack } from "../support/proc-stack.js";

/** The deadline the test gives the child (the real one is 30 s). */
const TEST_DEADLINE_MS = 2_000;

let stack: ProcStack | null = null;
afterEach(async () => {
  await stack?.stop();
  stack = null;
});

async function stopped(env: Record<string, string>) {
  stack = await new ProcStack({ runners: [], server: "child", serverEnv: env }).init();
  const child = stack.serverChild;
  if (child === null) throw new Error("no server child");
  child.child.kill("SIGTERM");
  // However slow the machine: the exit must come, bounded by the wait, not by the test's own timeout.
  await poll(() => !child.running, { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the exit" });
  return { exit: await child.exited, output: child.output() };
}

describe("the Server's shutdown deadline", () => {
  it("exits 1 by the deadline when a handle is left open, naming its kind", async () => {
    const { exit, output } = await stopped({
      [SHUTDOWN_DEADLINE_TEST_ENV]: String(TEST_DEADLINE_MS),
      [SHUTDOWN_LEAK_TEST_ENV]: "1",
    });
    expect(exit.code).toBe(1);
    const line = output
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { msg?: string; open?: string[]; deadline_ms?: number })
      .find((l) => l.msg?.startsWith("shutdown did not end in time"));
    expect(line?.deadline_ms).toBe(TEST_DEADLINE_MS);
    expect(line?.open).toContain("Timeout");
  }, 120_000);

  it("exits 0 on its own when nothing is left open", async () => {
    const { exit, output } = await stopped({ [SHUTDOWN_DEADLINE_TEST_ENV]: String(DAEMON_WAIT_MS) });
    expect(exit.code).toBe(0);
    expect(output).not.toContain("shutdown did not end in time");
  }, 120_000);
});
