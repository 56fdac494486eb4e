import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, test } from "vitest";
import { alive, DAEMON_WAIT_MS, poll, readLedger } from "../../scripts/test-support/index.js";
import { cleanup, killLater, settledWithin, startAgent, startRawAgent, tempDir } from "./harness.js";

/** Time between two looks at a process's CPU time: it has stalled when none was used in between. */
const STALL_SAMPLE_MS = 500;

/** CPU time a process has used so far, in clock ticks (utime + stime of /proc/PID/stat). */
function cpuTicks(pid: number): number {
  // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  return Number(fields[11]) + Number(fields[12]);
}

afterEach(cleanup);

function ledgerFile(): string {
  return join(tempDir(), "ledger.jsonl");
}

describe("crashes", () => {
  test("crash_before_response records the prompt, then exits 1 without answering", async () => {
    const ledger = ledgerFile();
    const agent = startAgent(["--ledger", ledger]);
    const sessionId = await agent.start();
    await expect(agent.prompt(sessionId, "scenario: crash_before_response")).rejects.toThrow();
    expect(await agent.exited).toEqual({ code: 1, signal: null });
    expect(readLedger(ledger).map((l) => l.event)).toEqual(["prompt"]);
  });

  test("crash_after_response answers end_turn, then exits 1", async () => {
    const agent = startAgent();
    const sessionId = await agent.start();
    expect(await agent.prompt(sessionId, "scenario: crash_after_response")).toEqual({ stopReason: "end_turn" });
    expect(await agent.exited).toEqual({ code: 1, signal: null });
  });
});

describe("raw stdout", () => {
  test("malformed writes a line that is not JSON, then keeps waiting", async () => {
    const agent = startRawAgent();
    await agent.prompt("scenario: malformed");
    const line = await agent.line((l) => !l.startsWith("{"));
    expect(line).toBe("this is not json {");
    expect(() => JSON.parse(line)).toThrow();
    expect(await settledWithin(agent.exited, 100)).toBe("pending");
    expect(agent.lines.some((l) => l.includes('"id":3'))).toBe(false);
    expect(await agent.stop()).toEqual({ code: 0, signal: null });
  });

  test.each([
    ["scenario: oversized", 2_000_000],
    ["scenario: oversized bytes=50000", 50_000],
  ])("%s writes one valid JSON-RPC notification line longer than %i bytes", async (prompt, bytes) => {
    const agent = startRawAgent();
    await agent.prompt(prompt);
    const line = await agent.line((l) => l.length > bytes);
    expect(Buffer.byteLength(line)).toBeGreaterThan(bytes);
    expect(JSON.parse(line)).toMatchObject({
      jsonrpc: "2.0",
      method: "session/update",
      params: { sessionId: "fake-session-1", update: { sessionUpdate: "agent_message_chunk" } },
    });
    expect(await settledWithin(agent.exited, 100)).toBe("pending");
    expect(await agent.stop()).toEqual({ code: 0, signal: null });
  });

  test("stdout carries nothing but JSON-RPC lines", async () => {
    const agent = startRawAgent();
    await agent.prompt("scenario: tools");
    await agent.line((l) => l.startsWith('{"jsonrpc":"2.0","id":3,'));
    for (const line of agent.lines) expect(JSON.parse(line)).toMatchObject({ jsonrpc: "2.0" });
    await agent.stop();
  });

  test.skipIf(!existsSync("/proc/self/status"))(
    "a burst into a client that stops reading stalls instead of buffering",
    async () => {
      const agent = startRawAgent();
      await agent.prompt("scenario: burst count=100000 chunk=100000");
      await agent.line((l) => l.includes('"agent_message_chunk"'));
      agent.child.stdout!.pause();
      // Wait until the agent stalls (no CPU used between two looks): one that buffered would keep producing.
      const pid = agent.child.pid as number;
      let last = -1;
      await poll(
        () => {
          const now = cpuTicks(pid);
          const stalled = now === last;
          last = now;
          return stalled;
        },
        { timeoutMs: DAEMON_WAIT_MS, intervalMs: STALL_SAMPLE_MS, what: "the agent to stall on its full stdout" },
      );
      // 100 000 updates of 100 kB would be 10 GB if the agent buffered them.
      const rss = Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${agent.child.pid}/status`, "utf8"))?.[1]);
      expect(rss).toBeLessThan(300 * 1024);
      await agent.stop(0);
    },
  );

  test("burst count=100000 delivers every update and the answer", async () => {
    const agent = startRawAgent();
    await agent.prompt("scenario: burst count=100000 chunk=32");
    const answer = await agent.line((l) => l.startsWith('{"jsonrpc":"2.0","id":3,'));
    expect(JSON.parse(answer)).toEqual({ jsonrpc: "2.0", id: 3, result: { stopReason: "end_turn" } });
    expect(agent.lines.filter((l) => l.includes('"agent_message_chunk"'))).toHaveLength(100_000);
    await agent.stop();
  });
});

test("hang never answers, ignores session/cancel, and survives stdin EOF until killed", async () => {
  const agent = startAgent();
  const sessionId = await agent.start();
  const response = agent.prompt(sessionId, "scenario: hang");
  response.catch(() => {});
  await agent.stderr.until("holding open (scenario hang)");
  await agent.cancel(sessionId);
  expect(await settledWithin(response, 200)).toBe("pending");
  expect(await agent.stop(300)).toEqual({ code: null, signal: "SIGKILL" });
});

test("grandchild spawns a SIGTERM-ignoring process in the agent's process group and records its pid", async () => {
  const ledger = ledgerFile();
  const agent = startAgent(["--ledger", ledger]);
  const sessionId = await agent.start();
  expect(await agent.prompt(sessionId, "scenario: grandchild")).toEqual({ stopReason: "end_turn" });
  const line = readLedger(ledger).find((l) => l.event === "grandchild");
  expect(line).toEqual({ event: "grandchild", pid: expect.any(Number) });
  const pid = line!.pid as number;
  killLater(pid);
  expect(alive(pid)).toBe(true);
  const processGroup = (p: number) => readFileSync(`/proc/${p}/stat`, "utf8").split(") ")[1]!.split(" ")[2];
  expect(processGroup(pid)).toBe(processGroup(agent.child.pid!));
  process.kill(pid, "SIGTERM");
  // The agent itself exits on stdin EOF; the grandchild, which ignored SIGTERM, outlives it.
  expect(await agent.stop()).toEqual({ code: 0, signal: null });
  expect(alive(pid)).toBe(true);
  process.kill(pid, "SIGKILL");
});
