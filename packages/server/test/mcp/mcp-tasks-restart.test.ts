/**
 * Issue 27 §3: a run's MCP Task is derived from the durable run record, so it
 * outlives a Server `kill -9`; a `lost` run is a failed task that says so.
 * Real processes: a `webcodex-server run` child, a Runner daemon, the fake
 * agent; 2026-07-28 requests as raw POSTs (what any client sends).
 */
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { type ModernAnswer, postModern } from "../support/modern-mcp.js";
import { ProcStack } from "../support/proc-stack.js";

let stack: ProcStack | null = null;

afterEach(async () => {
  await stack?.stop();
  stack = null;
});

async function post(s: ProcStack, method: string, params: Record<string, unknown>, name?: string) {
  const res = await postModern(s.port, s.principalTokens.get("alice") ?? "", method, params, {
    ...(name !== undefined ? { name } : {}),
    clientName: "restart-test",
  });
  expect(res.status).toBe(200);
  return (await res.json()) as ModernAnswer;
}

async function startTask(s: ProcStack, key: string, prompt: string): Promise<string> {
  const arguments_ = { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt };
  const answer = await post(
    s,
    "tools/call",
    { name: "start_coding_agent", arguments: arguments_ },
    "start_coding_agent",
  );
  expect(answer.result).toMatchObject({ resultType: "task" });
  return answer.result?.taskId as string;
}

const getTask = async (s: ProcStack, taskId: string) => (await post(s, "tasks/get", { taskId }, taskId)).result ?? {};

describe("a run's task across a Server kill -9", () => {
  it("reports the same run after the restart, and its result once terminal", async () => {
    stack = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child" }).init();
    await stack.startRunner("r1");
    const s = stack;
    const taskId = await startTask(s, "restart-task", "scenario: slow interval_ms=100 count=30");
    const before = await getTask(s, taskId);
    expect(before).toMatchObject({ taskId, status: "working" });

    await s.killServer("SIGKILL");
    await s.startServer();

    let after: Record<string, unknown> = {};
    await poll(
      async () => {
        after = await getTask(s, taskId);
        return after.status !== "working";
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the task to end after the restart" },
    );
    expect(after).toMatchObject({ taskId, status: "completed", createdAt: before.createdAt });
    const result = after.result as { resultType: string; structuredContent: Record<string, unknown> };
    expect(result.resultType).toBe("complete");
    // The Runner kept every event of the run through the Server's restart: nothing is lost.
    expect(result.structuredContent).toMatchObject({
      state: "completed",
      execution_state: "completed",
      history_lost: false,
    });
    // The same key after the restart is the same task.
    expect(await startTask(s, "restart-task", "scenario: slow interval_ms=100 count=30")).toBe(taskId);
  }, 120_000);

  it("reports a lost run as a failed task that says the outcome is unknown and what to do", async () => {
    stack = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child" }).init();
    const s = stack;
    await s.startRunner("r1", [], { WEBCODEX_FAILPOINT: "after_prompt_write" });
    const taskId = await startTask(s, "lost-task", "scenario: hello");
    expect(await s.runnerExit("r1")).toEqual({ code: null, signal: "SIGKILL" });
    await s.waitOffline("r1");
    await poll(() => s.prompts("r1").length === 1, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the agent's ledger",
    });
    await s.startRunner("r1");

    let task: Record<string, unknown> = {};
    await poll(
      async () => {
        task = await getTask(s, taskId);
        return task.status !== "working";
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the lost run's task to settle" },
    );
    expect(task).toMatchObject({ taskId, status: "failed", error: { code: -32011 } });
    const error = task.error as { message: string; data: Record<string, unknown> };
    expect(error.message).toContain("cannot tell whether the agent finished");
    expect(error.message).toContain("Inspect the project's working tree");
    expect(error.data).toMatchObject({ state: "lost", execution_state: "outcome_unknown" });
    expect(task).not.toHaveProperty("result");
  }, 120_000);
});
