/**
 * The operator console's run panel after a restart, against a real Server child process and a real Runner:
 * once the Runner and the Server restarted, a finished run's events are gone (the Runner's ring is in memory);
 * the panel says so, with what the CLI says (`history_lost`, and why), and shows the run's outcome — state, stop
 * reason, failure kind and the Runner's message — from the state database, instead of an empty list.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { poll } from "../../../../scripts/test-support/index.js";
import type { ConsoleSnapshot } from "../../src/console/views.js";
import { consoleLogin } from "../support/console-login.js";
import { issueKey } from "../support/oauth.js";
import { okValue, ProcStack } from "../support/proc-stack.js";

/** Bound on the restarted Server and Runner linking up again on a loaded machine. */
const RELINK_MS = 60_000;

let stack: ProcStack;
let origin: string;
let operatorKey: string;

beforeAll(async () => {
  stack = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    server: "child",
    serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
    extraScopes: ["operator:read"],
  }).init();
  origin = `http://127.0.0.1:${stack.port}`;
  operatorKey = await issueKey(stack.serverConfigFile, "alice", ["operator:read"], []);
  await stack.startRunner("r1");
}, 120_000);

afterAll(async () => {
  await stack?.stop();
}, 60_000);

async function snapshot(runId: string): Promise<ConsoleSnapshot> {
  const { cookie } = await consoleLogin(origin, operatorKey);
  const res = await fetch(`${origin}/console/api/snapshot?run=${runId}`, { headers: { cookie: cookie ?? "" } });
  expect(res.status).toBe(200);
  return (await res.json()) as ConsoleSnapshot;
}

describe("the console's run panel", () => {
  it("says a run's events are gone after a restart, and why, and shows how the run ended", async () => {
    const started = okValue(
      await stack.start("alice", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: `console-history-${process.pid}`,
        prompt: "scenario: hello",
      }),
    );
    const done = await stack.untilTerminal(started.run_id);
    expect(done.state).toBe("completed");
    const before = await snapshot(started.run_id);
    expect(before.run_events?.history_lost).toBe(false);
    expect(before.run_events?.events.length).toBeGreaterThan(0);

    // Both restart: the Runner's ring (in memory) and the Server's mirror are gone; the records are not.
    await stack.killRunner("r1");
    await stack.killServer();
    await stack.startServer();
    await stack.startRunner("r1");

    const after = await poll(
      async () => {
        const s = await snapshot(started.run_id);
        return s.run_events?.held === true ? s : undefined;
      },
      { timeoutMs: RELINK_MS, what: "the restarted Server to hold the run's mirror again" },
    );
    const panel = after.run_events;
    expect(panel?.events).toEqual([]);
    expect(panel?.history_lost).toBe(true);
    expect(panel?.outcome).toEqual({
      state: "completed",
      execution_state: "completed",
      stop_reason: "end_turn",
      failure_kind: null,
      recovery_kind: "none",
      message: "The agent completed the turn.",
    });
    // The CLI's observe says the same of the same run.
    const observed = okValue(await stack.observe("alice", { run_id: started.run_id }));
    expect(observed.history_lost).toBe(true);
    expect(observed.events).toEqual([]);
  }, 180_000);
});
