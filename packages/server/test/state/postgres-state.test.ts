/**
 * The Server with its state on PostgreSQL (`[server.state] backend = "postgres"`, issue 29 §1): a real
 * PostgreSQL cluster from the test support, `webcodex-server run` children, a Runner daemon and the fake
 * agent; 2026-07-28 requests as raw POSTs.
 *
 * - the whole run path works with nothing written to a SQLite file, and a task-backed run outlives a
 *   Server `kill -9`;
 * - a second instance on the same database (no state-dir lock between them) answers for the same runs:
 *   the same task status, and the same key through it replays the run instead of dispatching it again;
 * - with the database stopped, a start is refused `state_unavailable` and nothing is half-written; once
 *   it is back, starts work again, and a run that was in flight meanwhile reaches its true end.
 */
import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  type DaemonProcess,
  poll,
  startServerProcess,
} from "../../../../scripts/test-support/index.js";
import { type PostgresCluster, startPostgresCluster } from "../../../../scripts/test-support/postgres.js";
import { STATE_REFUSAL_RETRY_AFTER_SECS } from "../../src/server.js";
import { STATE_DB_FILE } from "../../src/state/store.js";
import { type ModernAnswer, postModern } from "../support/modern-mcp.js";
import { freePort, ProcStack, STATE_URL_ENV } from "../support/proc-stack.js";

let cluster: PostgresCluster;
let stack: ProcStack | null = null;
let second: DaemonProcess | null = null;

beforeAll(async () => {
  cluster = await startPostgresCluster();
}, 120_000);
afterAll(async () => {
  await cluster?.close();
});
afterEach(async () => {
  await second?.stop();
  second = null;
  await stack?.stop();
  stack = null;
});

async function post(port: number, token: string, method: string, params: Record<string, unknown>, name?: string) {
  const res = await postModern(port, token, method, params, {
    ...(name !== undefined ? { name } : {}),
    clientName: "postgres-state-test",
  });
  expect(res.status).toBe(200);
  return (await res.json()) as ModernAnswer;
}

function startCall(key: string, prompt: string) {
  const args = { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt };
  return [{ name: "start_coding_agent", arguments: args }, "start_coding_agent"] as const;
}

async function startTask(port: number, token: string, key: string, prompt: string): Promise<string> {
  const [params, name] = startCall(key, prompt);
  const answer = await post(port, token, "tools/call", params, name);
  expect(answer.result, JSON.stringify(answer)).toMatchObject({ resultType: "task" });
  return answer.result?.taskId as string;
}

async function taskStatus(port: number, token: string, taskId: string): Promise<Record<string, unknown>> {
  return (await post(port, token, "tasks/get", { taskId }, taskId)).result ?? {};
}

async function untilDone(port: number, token: string, taskId: string): Promise<Record<string, unknown>> {
  let task: Record<string, unknown> = {};
  await poll(
    async () => {
      task = await taskStatus(port, token, taskId);
      return task.status !== "working";
    },
    { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: `task ${taskId} to end` },
  );
  return task;
}

async function pgStack(): Promise<ProcStack> {
  const url = await cluster.createDatabase();
  stack = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child", stateUrl: url }).init();
  await stack.startRunner("r1");
  return stack;
}

describe("the Server's state on PostgreSQL", () => {
  it("serves a run with nothing in SQLite, and its task outlives a Server kill -9", async () => {
    const s = await pgStack();
    const alice = s.principalTokens.get("alice") ?? "";
    const taskId = await startTask(s.port, alice, "pg-restart", "scenario: slow interval_ms=100 count=30");
    expect(await taskStatus(s.port, alice, taskId)).toMatchObject({ taskId, status: "working" });

    await s.killServer("SIGKILL");
    await s.startServer();
    const done = await untilDone(s.port, alice, taskId);
    expect(done).toMatchObject({ taskId, status: "completed" });
    expect(s.prompts("r1")).toHaveLength(1);
    // The same key after the restart is the same task, and nothing is dispatched again.
    expect(await startTask(s.port, alice, "pg-restart", "scenario: slow interval_ms=100 count=30")).toBe(taskId);
    expect(s.prompts("r1")).toHaveLength(1);
    expect(existsSync(join(s.serverStateDir, STATE_DB_FILE))).toBe(false);
  }, 180_000);

  it("lets a second instance on the same database answer for the same runs without dispatching them again", async () => {
    const s = await pgStack();
    const alice = s.principalTokens.get("alice") ?? "";
    // The same config on another port: no state-dir lock stands between two instances on PostgreSQL.
    const port = await freePort();
    const config = join(s.dir, "server-b.toml");
    writeFileSync(config, readFileSync(s.serverConfigFile, "utf8").replace(/^port = \d+$/m, `port = ${port}`));
    second = startServerProcess(config, {
      cwd: s.dir,
      env: { ...process.env, WEBCODEX_LOG_LEVEL: "warn", [STATE_URL_ENV]: s.stateUrl ?? "" },
      stopGraceMs: 5_000,
    });
    const b = second;
    await poll(
      () => {
        if (b.exitCode !== null) throw new Error(`second server exited ${b.exitCode}: ${b.output()}`);
        return b.output().includes('"listening"');
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the second instance to listen" },
    );

    const taskId = await startTask(s.port, alice, "pg-two", "scenario: hello");
    expect(await untilDone(s.port, alice, taskId)).toMatchObject({ status: "completed" });
    // The other instance reads the same record: the same task, the same status.
    expect(await untilDone(port, alice, taskId)).toMatchObject({ taskId, status: "completed" });
    // The same key through it replays that run: the same task, and the agent saw one prompt.
    expect(await startTask(port, alice, "pg-two", "scenario: hello")).toBe(taskId);
    expect(s.prompts("r1")).toHaveLength(1);
    // Another principal sees nothing of it through either instance.
    const bob = s.principalTokens.get("bob") ?? "";
    const foreign = await post(port, bob, "tasks/get", { taskId }, taskId);
    expect(foreign.error, JSON.stringify(foreign)).toBeDefined();
  }, 180_000);

  it("brings a run that was in flight while the database was down to its true end once it is back", async () => {
    const s = await pgStack();
    const alice = s.principalTokens.get("alice") ?? "";
    const taskId = await startTask(s.port, alice, "pg-mid-run", "scenario: slow interval_ms=100 count=40");
    expect(await taskStatus(s.port, alice, taskId)).toMatchObject({ status: "working" });
    await cluster.stop();
    try {
      // The agent keeps running on the Runner while the Server cannot write what it hears.
      await new Promise((resolve) => setTimeout(resolve, 1_500));
    } finally {
      await cluster.start();
    }
    const done = await untilDone(s.port, alice, taskId);
    expect(done).toMatchObject({ taskId, status: "completed" });
    expect(s.prompts("r1")).toHaveLength(1);
  }, 180_000);

  it("refuses a start with state_unavailable while the database is down, writes nothing, and recovers", async () => {
    const s = await pgStack();
    const alice = s.principalTokens.get("alice") ?? "";
    const first = await startTask(s.port, alice, "pg-before", "scenario: hello");
    expect(await untilDone(s.port, alice, first)).toMatchObject({ status: "completed" });

    await cluster.stop();
    try {
      const [params, name] = startCall("pg-during", "scenario: hello");
      const refused = await post(s.port, alice, "tools/call", params, name);
      const text = JSON.stringify(refused);
      expect(text).toContain("state_unavailable");
      expect(s.prompts("r1")).toHaveLength(1);
      // A token this Server has not seen cannot be checked now: 503 to retry, not a 401 or a bare 500.
      const unseen = `wct_${randomBytes(32).toString("base64url")}`;
      const unchecked = await postModern(s.port, unseen, "tools/call", params, {
        name,
        clientName: "postgres-state-test",
      });
      expect(unchecked.status).toBe(503);
      expect(unchecked.headers.get("retry-after")).toBe(String(STATE_REFUSAL_RETRY_AFTER_SECS));
      expect(await unchecked.json()).toMatchObject({ error: { data: { code: "state_unavailable" } } });
    } finally {
      await cluster.start();
    }
    // Back: the key refused while the database was down starts now, once.
    await s.waitOnline("r1");
    const later = await startTask(s.port, alice, "pg-during", "scenario: hello");
    expect(await untilDone(s.port, alice, later)).toMatchObject({ status: "completed" });
    expect(s.prompts("r1")).toHaveLength(2);
  }, 180_000);
});
