/**
 * The task events' outbox rows on both state engines (tasks/changes.ts, webhooks/outbox.ts `enqueueTask`, design
 * §18): written in the transaction of the task change (a change that rolls back leaves none, and a listener that
 * fails rolls the change back), and a lease expiry announced once per generation even when two instances sweep
 * at once (PostgreSQL: two engines on one database; the task's row lock decides).
 */
import { randomBytes } from "node:crypto";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import type { Principal } from "../../src/principals/principal.js";
import type { RunAdmission } from "../../src/runs/api.js";
import type { StateEngine } from "../../src/state/engine.js";
import { StateStore } from "../../src/state/store.js";
import type { TaskChangeListener } from "../../src/tasks/changes.js";
import { TaskService } from "../../src/tasks/service.js";
import { TaskStore } from "../../src/tasks/store.js";
import { Webhooks } from "../../src/webhooks/service.js";
import { ENGINE_NAMES, engineFixture } from "../support/engines.js";

const fixture = engineFixture();
const SETTINGS = { allowLoopbackHttp: true, retryBaseMs: 100, disableAfterFailures: 100, disableAfterMs: 0 };
const SILENT = pino({ level: "silent" });
const SECRET = randomBytes(32);
const alice: Principal = {
  id: "alice",
  scopes: new Set(["coding_agent:run", "project:write"]),
  projects: new Set(["demo"]),
};
/** Never called: these tests start no run. */
const NO_ADMISSION = {} as RunAdmission;

function on(engine: StateEngine, clock: { now: number }, listener?: TaskChangeListener) {
  const records = new StateStore({ engine, serverSecret: SECRET, migrated: [] });
  // Never started: nothing is delivered, the rows are read.
  const webhooks = new Webhooks(records, SETTINGS, SILENT);
  const tasks = new TaskService({
    tasks: new TaskStore(engine),
    records,
    admission: NO_ADMISSION,
    logger: SILENT,
    now: () => clock.now,
    onChange: listener ?? webhooks.onTaskChange,
  });
  return { webhooks, tasks };
}

function value<T>(r: { ok: true; value: T } | { ok: false; error: { message: string } }): T {
  if (!r.ok) throw new Error(r.error.message);
  return r.value;
}

describe.each(ENGINE_NAMES)("task events on $name", ({ name }) => {
  it("announces an expiry once per generation however many sweep at once, and the close in its transaction", async () => {
    const [a, b] = await fixture.instances(name, 2);
    if (!a || !b) throw new Error("engines");
    const clock = { now: Date.now() };
    const one = on(a, clock);
    const two = on(b, clock);
    const sub = await one.webhooks.subscriptions.add({
      principal_id: "alice",
      url: "http://127.0.0.1:9/hook",
      event_types: ["task.attempt_expired", "task.closed"],
      secret: "whsec_c2VjcmV0",
    });
    const task = value(
      await one.tasks.createTask(alice, { project_id: "demo", instruction: "do it", idempotency_key: "k1" }),
    );
    const attempt = value(await one.tasks.startAttempt(alice, { task_id: task.task_id, assignee: "h", lease_secs: 1 }));
    // Live lease: nothing to announce.
    expect(await one.tasks.sweepExpiries()).toBe(0);
    clock.now += 5_000;
    const swept = await Promise.all([one.tasks.sweepExpiries(), two.tasks.sweepExpiries(), one.tasks.sweepExpiries()]);
    expect(swept.reduce((x, y) => x + y, 0)).toBe(1);
    // A renewal of the expired claim (generation 2) meets no unannounced expiry of generation 1.
    value(
      await two.tasks.startAttempt(alice, {
        task_id: task.task_id,
        assignee: "h",
        lease_secs: 1,
        renew_attempt_ref: attempt.attempt_ref,
      }),
    );
    clock.now += 5_000;
    // Generation 2 expired too; the close meets it first (no sweep ran), then closes.
    const listener = one.webhooks.onTaskChange;
    const failing = on(a, clock, async (change, tx) => {
      await listener(change, tx);
      if (change.kind === "closed") throw new Error("listener failed");
    });
    await expect(failing.tasks.close(alice, { task_id: task.task_id, outcome: "succeeded" })).rejects.toThrow(
      "listener failed",
    );
    // Rolled back with the close: the task is open, and generation 2's expiry is still unannounced.
    expect((await one.webhooks.outbox.events({}, 10)).map((e) => e.event_type)).toEqual(["task.attempt_expired"]);
    value(await one.tasks.close(alice, { task_id: task.task_id, outcome: "succeeded" }));
    expect(await two.tasks.sweepExpiries()).toBe(0);
    const events = (await one.webhooks.outbox.events({ subscription_id: sub.subscription_id }, 10)).reverse();
    expect(events.map((e) => [e.event_type, e.run_id])).toEqual([
      ["task.attempt_expired", task.task_id],
      ["task.attempt_expired", task.task_id],
      ["task.closed", task.task_id],
    ]);
    const bodies = events.map((e) => JSON.parse(e.body) as { data: Record<string, unknown> });
    expect(bodies.map((x) => x.data.controller_generation)).toEqual([1, 2, undefined]);
    expect(bodies[2]?.data).toMatchObject({ outcome: "succeeded", attempts: 1, runs: 0 });
    for (const e of events) expect(e.body).not.toContain("do it");
  });
});
