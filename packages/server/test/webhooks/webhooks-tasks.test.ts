/**
 * The managed tasks' webhooks through the whole stack (design §18, issue 43): a real Server, Runner and fake
 * agent, the task tools over a real MCP client, the operator's `webcodex-server webhooks add`, and a real HTTP
 * receiver verifying each request with `standardwebhooks`. `task.attempt_expired` comes once per claim
 * generation (from the expiry sweep or from the renewal that met the expiry first), `task.closed` once, both in
 * the task's order, only to the task's principal's subscriptions, and never with the instruction, title or
 * assignee in them.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { EXPIRY_SWEEP_INTERVAL_MS } from "../../src/tasks/changes.js";
import { ProcStack } from "../support/proc-stack.js";
import { observeToEnd, ok, type Structured } from "../support/tool-calls.js";
import { WebhookReceiver } from "../support/webhook-receiver.js";
import { subscribe, type VerifiedEvent, verified, WEBHOOK_TOML } from "../support/webhooks.js";

let stack: ProcStack | null = null;
const receivers: WebhookReceiver[] = [];

afterEach(async () => {
  for (const r of receivers.splice(0)) await r.close();
  await stack?.stop();
  stack = null;
});

/** Bound on an event reaching the receiver: a sweep interval, a claim and an attempt, under load. */
const EVENT_WAIT_MS = DAEMON_WAIT_MS + EXPIRY_SWEEP_INTERVAL_MS;

async function createTask(client: Client, key: string, instruction: string, title: string): Promise<string> {
  const task = await ok(client, "create_agent_task", { project_id: "demo", instruction, idempotency_key: key, title });
  return task.task_id as string;
}

function attempt(client: Client, args: Structured): Promise<Structured> {
  return ok(client, "start_agent_task_attempt", args);
}

async function eventsUntil(
  hook: WebhookReceiver,
  secret: string,
  what: string,
  done: (events: VerifiedEvent[]) => boolean,
): Promise<VerifiedEvent[]> {
  return await poll(
    () => {
      const got = verified(hook, secret);
      return done(got) ? got : undefined;
    },
    { timeoutMs: EVENT_WAIT_MS, intervalMs: DAEMON_POLL_MS, what },
  );
}

describe("task webhooks, whole stack", () => {
  it("announces each lease expiry once per generation and the close, in order, signed, without task text, to the owner only", async () => {
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      extraServerToml: WEBHOOK_TOML,
    }).init();
    await stack.startRunner("r1");
    const hook = await new WebhookReceiver().start();
    receivers.push(hook);
    const sub = await subscribe(stack.serverConfigFile, "alice", hook.url, "task.attempt_expired,task.closed");
    const secrets = { instruction: canary("instruction"), title: canary("title"), assignee: canary("assignee") };
    const alice = await stack.mcp("alice");
    const bob = await stack.mcp("bob");

    // Bob's task expires and closes too: nothing of it reaches alice's receiver.
    const bobTask = await createTask(bob, "bob-task", "scenario: hello", "bob's");
    await attempt(bob, { task_id: bobTask, assignee: "bob-host", lease_secs: 1 });

    const taskId = await createTask(
      alice,
      "alice-task",
      `scenario: hello text="${secrets.instruction}"`,
      secrets.title,
    );
    const claim = await attempt(alice, { task_id: taskId, assignee: secrets.assignee, lease_secs: 3 });
    const run = await ok(alice, "start_agent_task_coding_run", {
      project_id: "demo",
      provider_id: "fake",
      attempt_ref: claim.attempt_ref,
    });
    expect((await observeToEnd(alice, run.run_id as string)).state).toBe("completed");

    // Generation 1 expires; the sweep (or nothing else: nobody touches the task) announces it.
    const first = await eventsUntil(hook, sub.secret, "the first task.attempt_expired", (e) => e.length >= 1);
    expect(first[0]).toMatchObject({
      type: "task.attempt_expired",
      data: {
        task_id: taskId,
        principal_id: "alice",
        project_id: "demo",
        attempt_id: claim.attempt_id,
        fence: 1,
        controller_generation: 1,
        run_id: run.run_id,
      },
    });
    // The holder re-takes its expired claim (generation 2) with a one-second lease; that expiry is announced too.
    const renewed = await attempt(alice, {
      task_id: taskId,
      assignee: secrets.assignee,
      lease_secs: 1,
      renew_attempt_ref: claim.attempt_ref,
    });
    expect(renewed.controller_generation).toBe(2);
    await eventsUntil(hook, sub.secret, "the second task.attempt_expired", (e) => e.length >= 2);
    await ok(alice, "close_agent_task", { task_id: taskId, outcome: "succeeded" });
    await ok(bob, "close_agent_task", { task_id: bobTask, outcome: "abandoned" });
    const events = await eventsUntil(hook, sub.secret, "task.closed", (e) => e.some((x) => x.type === "task.closed"));
    expect(events.map((e) => [e.type, e.data.controller_generation])).toEqual([
      ["task.attempt_expired", 1],
      ["task.attempt_expired", 2],
      ["task.closed", undefined],
    ]);
    expect(events[2]?.data).toMatchObject({
      task_id: taskId,
      principal_id: "alice",
      outcome: "succeeded",
      attempts: 1,
      runs: 1,
    });
    expect(new Set(events.map((e) => e.id)).size).toBe(3);
    // Exactly these three rows were written for alice's subscription (none for bob's task: no subscription of his).
    const rows = await stack.stateRows<{ event_type: string; run_id: string }>(
      "SELECT event_type, run_id FROM webhook_outbox ORDER BY seq",
    );
    expect(rows).toEqual([
      { event_type: "task.attempt_expired", run_id: taskId },
      { event_type: "task.attempt_expired", run_id: taskId },
      { event_type: "task.closed", run_id: taskId },
    ]);
    expect(hook.received.some((r) => r.body.includes(bobTask))).toBe(false);
    // Bob's expiry was recorded as announced all the same (the sweep decides it whether or not anyone listens).
    const [bobAttempt] = await stack.stateRows<{ expiry_announced_generation: number }>(
      "SELECT a.expiry_announced_generation FROM agent_task_attempts a WHERE a.task_id = ?",
      [bobTask],
    );
    expect(Number(bobAttempt?.expiry_announced_generation)).toBe(1);
    // No instruction, title or assignee in any body sent or kept.
    const bodies = await stack.stateRows<{ body: string }>("SELECT body FROM webhook_outbox");
    for (const text of [...hook.received.map((r) => r.body), ...bodies.map((b) => b.body)]) {
      for (const secret of Object.values(secrets)) expect(text).not.toContain(secret);
    }
  }, 180_000);
});
