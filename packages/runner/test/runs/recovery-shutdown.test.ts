import { existsSync, readFileSync } from "node:fs";
import type { RunSummary } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import {
  DAEMON_WAIT_MS,
  killProcesses,
  ledgerPrompts,
  poll,
  processesMentioning,
} from "../../../../scripts/test-support/index.js";
import {
  killAllRunners,
  makeSandbox,
  runStartFrame,
  type Sandbox,
  startRunner,
  startTestServer,
  type TestServer,
} from "../support/crash-matrix-harness.js";
import { newRunId } from "../support/harness.js";

const servers: TestServer[] = [];
const sandboxes: Sandbox[] = [];
afterEach(async () => {
  await killAllRunners();
  for (const s of sandboxes.splice(0)) {
    killProcesses(processesMentioning(s.ledger));
    s.cleanup();
  }
  for (const s of servers.splice(0)) await s.close();
});

function ledgerCancels(ledger: string): number {
  if (!existsSync(ledger)) return 0;
  return readFileSync(ledger, "utf8")
    .split("\n")
    .filter((l) => l.includes('"event":"cancel"')).length;
}

const CASES: {
  name: string;
  agentArgs: string[];
  prompt: string;
  prompts: number;
  /** session/cancel notifications the agent received. */
  cancels: number;
  expected: Pick<RunSummary, "state" | "execution_state">;
}[] = [
  {
    name: "during setup (agent never answers session/new)",
    agentArgs: ["--hang-on", "session_new"],
    prompt: "scenario: hello",
    prompts: 0,
    cancels: 0,
    expected: { state: "failed", execution_state: "not_started" },
  },
  {
    name: "after dispatch (agent never answers the prompt nor the cancel)",
    agentArgs: [],
    prompt: "scenario: hang",
    prompts: 1,
    cancels: 1,
    expected: { state: "lost", execution_state: "outcome_unknown" },
  },
  {
    name: "after dispatch (agent confirms the cancel)",
    agentArgs: [],
    prompt: "scenario: slow interval_ms=100 count=600",
    prompts: 1,
    cancels: 1,
    expected: { state: "cancelled", execution_state: "completed" },
  },
];

describe("graceful Runner stop with a run in flight", { timeout: 90_000 }, () => {
  it.each(CASES)("SIGTERM $name: exit 0, no survivors, terminal state recorded", async (c) => {
    const server = await startTestServer();
    servers.push(server);
    const sandbox = makeSandbox({ serverUrl: server.url, agentArgs: c.agentArgs });
    sandboxes.push(sandbox);
    const id = newRunId();

    const first = startRunner(sandbox);
    const conn1 = await server.nextConnection();
    const frame = runStartFrame(conn1, "fake", id, c.prompt);
    conn1.send(frame);
    await conn1.next((f): f is Extract<typeof f, { type: "run.start.result" }> => f.type === "run.start.result");
    // Wait until the agent is up (setup case) or has the prompt (dispatch case).
    await poll(() => processesMentioning(sandbox.ledger).length > 0, {
      timeoutMs: DAEMON_WAIT_MS,
      what: "the agent process",
    });
    if (c.prompts > 0)
      await poll(() => ledgerPrompts(sandbox.ledger).length >= 1, { timeoutMs: DAEMON_WAIT_MS, what: "the prompt" });

    await first.stop();
    expect((await first.exited).code).toBe(0);
    expect(processesMentioning(sandbox.ledger)).toEqual([]);

    const second = startRunner(sandbox);
    const conn2 = await server.nextConnection();
    const row = conn2.hello.inventory.find((r) => r.run_id === id);
    expect(row).toMatchObject({ ...c.expected, phase: "terminal" });
    // Recorded by the graceful stop itself, not left for start-up recovery.
    expect(second.output()).not.toContain('"recovered run"');
    expect(ledgerPrompts(sandbox.ledger).length).toBe(c.prompts);
    expect(ledgerCancels(sandbox.ledger)).toBe(c.cancels);
    await second.stop();
  });
});
