/**
 * Issue 39 §6: a start whose `run.start` reached the Runner when the state database went away is not answered
 * "nothing written, nothing sent". A real PostgreSQL cluster (scripts/test-support/postgres.ts), a
 * `webcodex-server` child on it, a Runner daemon and the fake agent. The Server's failpoint
 * `start_after_run_start` with the `hold` action holds the start right after the Runner answered, before the
 * answer is recorded; the test stops the database there and lets the start go on.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { type PostgresCluster, startPostgresCluster } from "../../../../scripts/test-support/postgres.js";
import { FAILPOINT_HOLDING_LINE, SERVER_FAILPOINT_ACTION_ENV, SERVER_FAILPOINT_ENV } from "../../src/failpoints.js";
import { ProcStack } from "../support/proc-stack.js";

let cluster: PostgresCluster;
let stack: ProcStack | null = null;

beforeAll(async () => {
  cluster = await startPostgresCluster();
}, 120_000);
afterAll(async () => {
  await cluster?.close();
}, 60_000);
afterEach(async () => {
  await stack?.stop();
  stack = null;
}, 60_000);

describe("a start the database failed after run.start went out", () => {
  it("is answered start_outcome_unknown (retry_same), and the same-key retry once the database is back meets the run the Runner ran", async () => {
    const url = await cluster.createDatabase();
    const s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      stateUrl: url,
      serverEnv: { [SERVER_FAILPOINT_ENV]: "start_after_run_start", [SERVER_FAILPOINT_ACTION_ENV]: "hold" },
    }).init();
    stack = s;
    await s.startRunner("r1");
    const server = s.serverChild;
    if (server === null) throw new Error("no server child");
    const input = { project_id: "demo", provider_id: "fake", idempotency_key: "held-start", prompt: "scenario: hello" };

    const answer = s.start("alice", input);
    await poll(() => server.output().includes(`${FAILPOINT_HOLDING_LINE} start_after_run_start`), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the start to reach the held failpoint",
    });
    // The Runner has admitted the run; the database goes away before the Server records that.
    await cluster.stop();
    let refused: Awaited<typeof answer>;
    try {
      server.child.kill("SIGUSR2");
      refused = await answer;
    } finally {
      await cluster.start();
    }
    expect(refused.ok).toBe(false);
    if (refused.ok) return;
    expect(refused.error.code).toBe("start_outcome_unknown");
    expect(refused.error.recovery_kind).toBe("retry_same");
    expect(refused.error.message).toContain("the run may be running");
    // It was no "nothing sent": the agent got the prompt.
    await poll(() => s.prompts("r1").length === 1, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the agent to have the prompt",
    });

    // Back: the same key meets that run (not a second one), and it reaches its true end.
    await s.waitOnline("r1");
    const retried = await s.start("alice", input);
    expect(retried.ok, JSON.stringify(retried)).toBe(true);
    if (!retried.ok) return;
    expect(retried.value.replayed).toBe(true);
    const done = await s.untilTerminal(retried.value.run_id, "alice", DAEMON_WAIT_MS);
    expect(done.state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  }, 240_000);

  it("whose `sent` commit failed sent nothing: the same-key retry once the database is back runs it, once", async () => {
    const url = await cluster.createDatabase();
    const s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      stateUrl: url,
      serverEnv: { [SERVER_FAILPOINT_ENV]: "start_after_intent", [SERVER_FAILPOINT_ACTION_ENV]: "hold" },
    }).init();
    stack = s;
    await s.startRunner("r1");
    const server = s.serverChild;
    if (server === null) throw new Error("no server child");
    const input = {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "held-intent",
      prompt: "scenario: hello",
    };

    const answer = s.start("alice", input);
    await poll(() => server.output().includes(`${FAILPOINT_HOLDING_LINE} start_after_intent`), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the start to reach the held failpoint",
    });
    // The intent is committed; the database goes away before the `sent` commit that must precede run.start.
    await cluster.stop();
    let refused: Awaited<typeof answer>;
    try {
      server.child.kill("SIGUSR2");
      refused = await answer;
    } finally {
      await cluster.start();
    }
    expect(refused.ok).toBe(false);
    if (refused.ok) return;
    expect(refused.error.recovery_kind).toBe("retry_same");

    // The Runner's link never dropped (no hello settles anything): the retry itself must run the start.
    await s.waitOnline("r1");
    const retried = await s.start("alice", input);
    expect(retried.ok, JSON.stringify(retried)).toBe(true);
    if (!retried.ok) return;
    const done = await s.untilTerminal(retried.value.run_id, "alice", DAEMON_WAIT_MS);
    expect(done.state).toBe("completed");
    expect(s.prompts("r1")).toHaveLength(1);
  }, 240_000);
});
