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
import {
  FAILPOINT_HOLDING_LINE,
  SERVER_FAILPOINT_ACTION_ENV,
  SERVER_FAILPOINT_ENV,
  type ServerFailpointName,
} from "../../src/failpoints.js";
import type { ApiError, StartInput } from "../../src/runs/api.js";
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

/**
 * A stack on a fresh database whose Server holds alice's start of `key` at `failpoint`; the database is stopped
 * there, the start let go, and the database started again. Returns the stack, the start's input and its refusal.
 */
async function startHeldWithoutDatabase(
  failpoint: ServerFailpointName,
  key: string,
): Promise<{ s: ProcStack; input: StartInput; refused: ApiError }> {
  const s = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    server: "child",
    stateUrl: await cluster.createDatabase(),
    serverEnv: { [SERVER_FAILPOINT_ENV]: failpoint, [SERVER_FAILPOINT_ACTION_ENV]: "hold" },
  }).init();
  stack = s;
  await s.startRunner("r1");
  const server = s.serverChild;
  if (server === null) throw new Error("no server child");
  const input = { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "scenario: hello" };

  const answer = s.start("alice", input);
  await poll(() => server.output().includes(`${FAILPOINT_HOLDING_LINE} ${failpoint}`), {
    timeoutMs: DAEMON_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: "the start to reach the held failpoint",
  });
  await cluster.stop();
  let refused: Awaited<typeof answer>;
  try {
    server.child.kill("SIGUSR2");
    refused = await answer;
  } finally {
    await cluster.start();
  }
  if (refused.ok) throw new Error(`the start was not refused: ${JSON.stringify(refused.value)}`);
  return { s, input, refused: refused.error };
}

/** Once the Runner is back online, the same-key retry: it must start (or meet) the run, which completes. */
async function retryToTheEnd(s: ProcStack, input: StartInput): Promise<{ replayed: boolean }> {
  await s.waitOnline("r1");
  const retried = await s.start("alice", input);
  if (!retried.ok) throw new Error(`the retry was refused: ${JSON.stringify(retried.error)}`);
  const done = await s.untilTerminal(retried.value.run_id, "alice", DAEMON_WAIT_MS);
  expect(done.state).toBe("completed");
  return { replayed: retried.value.replayed };
}

describe("a start the database failed after run.start went out", () => {
  it("is answered start_outcome_unknown (retry_same), and the same-key retry once the database is back meets the run the Runner ran", async () => {
    // The Runner has admitted the run; the database goes away before the Server records that.
    const { s, input, refused } = await startHeldWithoutDatabase("start_after_run_start", "held-start");
    expect(refused.code).toBe("start_outcome_unknown");
    expect(refused.recovery_kind).toBe("retry_same");
    expect(refused.message).toContain("the run may be running");
    // It was no "nothing sent": the agent got the prompt.
    await poll(() => s.prompts("r1").length === 1, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the agent to have the prompt",
    });

    // Back: the same key meets that run (not a second one), and it reaches its true end.
    expect(await retryToTheEnd(s, input)).toEqual({ replayed: true });
    expect(s.prompts("r1")).toHaveLength(1);
  }, 240_000);

  it("whose `sent` commit failed sent nothing: the same-key retry once the database is back runs it, once", async () => {
    // The intent is committed; the database goes away before the `sent` commit that must precede run.start.
    const { s, input, refused } = await startHeldWithoutDatabase("start_after_intent", "held-intent");
    expect(refused.recovery_kind).toBe("retry_same");

    // The Runner's link never dropped (no hello settles anything): the retry itself must run the start.
    await retryToTheEnd(s, input);
    expect(s.prompts("r1")).toHaveLength(1);
  }, 240_000);
});
