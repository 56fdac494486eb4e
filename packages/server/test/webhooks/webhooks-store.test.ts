/**
 * The webhook outbox on both state engines (webhooks/outbox.ts, design §18): events are written in the
 * transaction of the record change that causes them (a change that rolls back leaves none), only for the
 * record's own principal's subscriptions, claimed in order per subscription and run, each claimed by one
 * instance at a time (FOR UPDATE SKIP LOCKED on PostgreSQL), retried with the same id, dead after the bound.
 */
import { randomBytes } from "node:crypto";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import type { StateEngine } from "../../src/state/engine.js";
import type { AdmissionRecord } from "../../src/state/record.js";
import { StateStore } from "../../src/state/store.js";
import { eventsFor } from "../../src/webhooks/events.js";
import type { ClaimedEvent } from "../../src/webhooks/outbox.js";
import { Webhooks } from "../../src/webhooks/service.js";
import { MAX_ATTEMPTS, nextAttemptAt, retryDelayMs } from "../../src/webhooks/worker.js";
import { ENGINE_NAMES, engineFixture } from "../support/engines.js";

const fixture = engineFixture();
const SETTINGS = { allowLoopbackHttp: true, retryBaseMs: 100, disableAfterFailures: 100, disableAfterMs: 0 };
const FAR = 10 ** 13;

function storeOn(engine: StateEngine): { records: StateStore; webhooks: Webhooks } {
  const records = new StateStore({ engine, serverSecret: randomBytes(32), migrated: [] });
  // Never started: these tests claim and settle by hand.
  const webhooks = new Webhooks(records, SETTINGS, pino({ level: "silent" }));
  return { records, webhooks };
}

async function admit(records: StateStore, runId: string, principal = "alice"): Promise<void> {
  await records.insert({
    run_id: runId,
    principal_id: principal,
    project_id: "demo",
    provider_id: "fake",
    runner_id: "r1",
    intent_fingerprint: "f".repeat(64),
    agent_instance_id: null,
    provider_instance_id: null,
    store_id: null,
    admission: "admitted",
    state: "starting",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "wait",
    message: "a message that is never sent",
  });
}

const all = () => true;

describe.each(ENGINE_NAMES)("webhook outbox on $name", ({ name }) => {
  it("writes the events of a state change in its transaction, for the record's own principal only", async () => {
    const [engine] = await fixture.instances(name, 1);
    if (!engine) throw new Error("engine");
    const { records, webhooks } = storeOn(engine);
    const alice = await webhooks.subscriptions.add({
      principal_id: "alice",
      url: "http://127.0.0.1:9/hook",
      event_types: ["run.started", "run.terminal"],
      secret: "whsec_c2VjcmV0",
    });
    await webhooks.subscriptions.add({
      principal_id: "bob",
      url: "http://127.0.0.1:9/bob",
      event_types: ["run.started", "run.terminal"],
      secret: "whsec_c2VjcmV0",
    });
    await admit(records, "run_a");
    // A change that rolls back leaves no event behind.
    await expect(
      records.transaction(async (tx) => {
        await records.update("run_a", { state: "running", execution_state: "started" }, { tx });
        throw new Error("rolled back");
      }),
    ).rejects.toThrow("rolled back");
    expect(await webhooks.outbox.events({}, 100)).toEqual([]);
    await records.update("run_a", { state: "running", execution_state: "started" });
    await records.update("run_a", { state: "completed", execution_state: "completed", stop_reason: "end_turn" });
    const events = (await webhooks.outbox.events({}, 100)).reverse();
    expect(events.map((e) => [e.subscription_id, e.event_type])).toEqual([
      [alice.subscription_id, "run.started"],
      [alice.subscription_id, "run.terminal"],
    ]);
    const terminal = JSON.parse(events[1]?.body ?? "{}") as { type: string; data: Record<string, unknown> };
    expect(terminal.type).toBe("run.terminal");
    expect(terminal.data).toMatchObject({ run_id: "run_a", state: "completed", stop_reason: "end_turn" });
    expect(typeof terminal.data.duration_ms).toBe("number");
    expect(events[1]?.body).not.toContain("never sent");
  });

  it("claims one run's events in order, each by one claimant, and keeps the id across retries until dead", async () => {
    const engines = await fixture.instances(name, 2);
    const [a, b] = engines;
    if (!a || !b) throw new Error("engines");
    const { records, webhooks } = storeOn(a);
    const other = storeOn(b).webhooks.outbox;
    await webhooks.subscriptions.add({
      principal_id: "alice",
      url: "http://127.0.0.1:9/hook",
      event_types: ["run.started", "run.terminal"],
      secret: "whsec_c2VjcmV0",
    });
    for (const run of ["run_1", "run_2"]) {
      await admit(records, run);
      await records.update(run, { state: "running", execution_state: "started" });
      await records.update(run, { state: "failed", execution_state: "started", failure_kind: "provider_exited" });
    }
    const now = Date.now();
    // Two claimants at once: the first event of each run, never the same row twice, never a run's second event.
    const [first, second] = await Promise.all([
      webhooks.outbox.claim(now, 10, now + 60_000, all),
      other.claim(now, 10, now + 60_000, all),
    ]);
    const claimed = [...first, ...second];
    expect(claimed.map((e) => e.event_type).sort()).toEqual(["run.started", "run.started"]);
    expect(new Set(claimed.map((e) => e.seq)).size).toBe(2);
    expect(await webhooks.outbox.claim(now, 10, now + 60_000, all)).toEqual([]);
    // run_1's start fails once: retried later with the same id; run_1's end waits behind it.
    const run1 = claimed.find((e) => e.run_id === "run_1") as ClaimedEvent;
    await webhooks.outbox.settle(run1, { ok: false, status: 500, error: "HTTP 500" }, now, now + 1000);
    const run2 = claimed.find((e) => e.run_id === "run_2") as ClaimedEvent;
    await webhooks.outbox.settle(run2, { ok: true, status: 200 }, now, null);
    const next = await webhooks.outbox.claim(now, 10, now + 60_000, all);
    expect(next.map((e) => [e.run_id, e.event_type])).toEqual([["run_2", "run.terminal"]]);
    const retry = await webhooks.outbox.claim(now + 1000, 10, now + 60_000, all);
    expect(retry.map((e) => [e.event_id, e.attempts])).toEqual([[run1.event_id, 2]]);
    // A lease that ran out (its instance died) makes the row claimable again, same id.
    const again = await other.claim(now + 120_000, 10, now + 180_000, all);
    expect(again.map((e) => e.event_id)).toContain(run1.event_id);
    // Out of attempts: a dead letter, which no longer holds the run's next event back; redeliver revives it.
    const dead = { ...(again.find((e) => e.event_id === run1.event_id) as ClaimedEvent), attempts: MAX_ATTEMPTS };
    expect(nextAttemptAt(dead, now, 100)).toBeNull();
    await b.run("UPDATE webhook_outbox SET attempts = ? WHERE event_id = ?", [MAX_ATTEMPTS, run1.event_id]);
    await other.settle(dead, { ok: false, status: 500, error: "HTTP 500" }, now, null);
    expect((await other.events({ status: "dead" }, 10)).map((e) => e.event_id)).toEqual([run1.event_id]);
    const behind = await webhooks.outbox.claim(FAR, 10, FAR + 1, all);
    expect(behind.map((e) => [e.run_id, e.event_type])).toContainEqual(["run_1", "run.terminal"]);
    expect(await webhooks.outbox.redeliver(run1.event_id, now)).toBe(true);
    expect((await webhooks.outbox.events({ status: "pending" }, 10)).map((e) => e.event_id)).toContain(run1.event_id);
    // Audited in its transaction (as the CLI's and the console's redeliver are); a second try finds no dead letter.
    expect((await webhooks.subscriptions.auditRows(10)).filter((r) => r.event === "redelivered")).toEqual([
      expect.objectContaining({ actor: "operator", detail: run1.event_id }),
    ]);
    expect(await webhooks.outbox.redeliver(run1.event_id, now, "operator_console:ops")).toBe(false);
  });

  it("disables a subscription only when both bounds passed (failures in a row, for long enough), with an audit row; enable revives its pending events", async () => {
    const [engine] = await fixture.instances(name, 1);
    if (!engine) throw new Error("engine");
    const { records, webhooks } = storeOn(engine);
    const { subscriptions: subs, outbox } = webhooks;
    const sub = await subs.add({
      principal_id: "alice",
      url: "http://127.0.0.1:9/hook",
      event_types: ["run.terminal"],
      secret: "whsec_c2VjcmV0",
    });
    await admit(records, "run_d");
    await records.update("run_d", { state: "failed", execution_state: "started", failure_kind: "provider_exited" });
    const policy = { afterFailures: 3, afterMs: 1000 };
    const fail = { ok: false, status: 500, error: "HTTP 500" } as const;
    const attemptAt = async (at: number) => {
      const [event] = await outbox.claim(at, 1, at + 60_000, all);
      if (!event) throw new Error(`nothing claimable at ${at}`);
      return await outbox.settle(event, fail, at, at + 1, policy);
    };
    const t0 = Date.now() + 60_000;
    // Three failures within a second: the count is reached, the time is not.
    for (const at of [t0, t0 + 10, t0 + 20]) expect(await attemptAt(at)).toEqual({ disabled: false });
    expect(await subs.find(sub.subscription_id)).toMatchObject({
      status: "active",
      consecutive_failures: 3,
      failing_since_ms: t0,
    });
    // A success in between starts the count and the clock again.
    const [ok] = await outbox.claim(t0 + 30, 1, t0 + 60_000, all);
    if (!ok) throw new Error("claim");
    await outbox.settle(ok, { ok: true, status: 200 }, t0 + 30, null, policy);
    expect(await subs.find(sub.subscription_id)).toMatchObject({ consecutive_failures: 0, failing_since_ms: null });
    await records.update("run_d", { state: "starting", execution_state: "not_started" });
    await records.update("run_d", { state: "failed", execution_state: "started", failure_kind: "provider_exited" });
    const t1 = t0 + 100;
    for (const at of [t1, t1 + 10, t1 + 500]) expect(await attemptAt(at)).toEqual({ disabled: false });
    expect(await attemptAt(t1 + 1000)).toEqual({ disabled: true });
    const disabled = await subs.find(sub.subscription_id);
    expect(disabled).toMatchObject({ status: "disabled", consecutive_failures: 4 });
    expect(disabled?.disabled_at).toBe(new Date(t1 + 1000).toISOString());
    const [audit] = await subs.auditRows(10, sub.subscription_id);
    expect(audit).toMatchObject({ event: "disabled", actor: "delivery", principal_id: "alice" });
    expect(audit?.detail).toContain("4 consecutive failed attempts");
    // Disabled: its pending event is not claimed, and a new change writes no event for it.
    expect(await outbox.claim(FAR, 10, FAR + 1, all)).toEqual([]);
    await records.update("run_d", { state: "starting", execution_state: "not_started" });
    await records.update("run_d", { state: "failed", execution_state: "started", failure_kind: "provider_exited" });
    expect((await outbox.events({ status: "pending" }, 10)).length).toBe(1);
    expect((await subs.list("alice"))[0]).toMatchObject({ status: "disabled", pending: 1 });
    // Enabled again: active, counters cleared, its pending event due now with a fresh budget.
    expect(await subs.enable(sub.subscription_id, t1 + 2000)).toBe(true);
    expect(await subs.find(sub.subscription_id)).toMatchObject({
      status: "active",
      consecutive_failures: 0,
      failing_since_ms: null,
      disabled_at: null,
    });
    const [revived] = await outbox.claim(t1 + 2000, 10, t1 + 60_000, all);
    expect(revived).toMatchObject({ attempts: 1, retry_from_ms: t1 + 2000 });
    expect((await subs.auditRows(10, sub.subscription_id)).map((r) => r.event)).toEqual([
      "enabled",
      "disabled",
      "added",
    ]);
    expect(await subs.enable("whsub_nope", t1)).toBe(false);
  });

  it("signs with the previous secret too until a rotation's overlap ends, and audits the rotation", async () => {
    const [engine] = await fixture.instances(name, 1);
    if (!engine) throw new Error("engine");
    const { records, webhooks } = storeOn(engine);
    const { subscriptions: subs, outbox } = webhooks;
    const sub = await subs.add({
      principal_id: "alice",
      url: "http://127.0.0.1:9/hook",
      event_types: ["run.terminal"],
      secret: "whsec_b2xk",
    });
    await admit(records, "run_r");
    await records.update("run_r", { state: "failed", execution_state: "started", failure_kind: "provider_exited" });
    const t0 = Date.now() + 60_000;
    expect(await subs.rotateSecret(sub.subscription_id, "whsec_bmV3", t0 + 1000)).toBe(true);
    const [during] = await outbox.claim(t0 + 999, 1, t0 + 60_000, all);
    expect(during?.secrets).toEqual(["whsec_bmV3", "whsec_b2xk"]);
    if (!during) throw new Error("claim");
    await outbox.settle(during, { ok: false, status: 500, error: "HTTP 500" }, t0 + 999, t0 + 1000);
    const [after] = await outbox.claim(t0 + 1000, 1, t0 + 60_000, all);
    expect(after?.secrets).toEqual(["whsec_bmV3"]);
    expect((await subs.get(sub.subscription_id, t0))?.secrets).toEqual(["whsec_bmV3", "whsec_b2xk"]);
    const listed = JSON.stringify(await subs.list());
    expect(listed).not.toContain("whsec_");
    const [audit] = await subs.auditRows(1, sub.subscription_id);
    expect(audit).toMatchObject({ event: "secret_rotated", actor: "operator" });
    expect(audit?.detail).toContain(new Date(t0 + 1000).toISOString());
    expect(await subs.rotateSecret("whsub_nope", "whsec_eA", t0)).toBe(false);
  });
});

describe("events of a state change", () => {
  const rec = (state: AdmissionRecord["state"], execution_state: AdmissionRecord["execution_state"]) =>
    ({ state, execution_state }) as AdmissionRecord;
  it.each([
    ["starting", rec("running", "started"), ["run.started"]],
    ["starting", rec("waiting_permission", "started"), ["run.started", "run.waiting_permission"]],
    ["running", rec("waiting_permission", "started"), ["run.waiting_permission"]],
    ["waiting_permission", rec("running", "started"), []],
    ["starting", rec("completed", "completed"), ["run.started", "run.terminal"]],
    ["starting", rec("failed", "not_started"), ["run.terminal"]],
    ["running", rec("cancelled", "started"), ["run.terminal"]],
    ["running", rec("lost", "outcome_unknown"), ["run.lost"]],
    ["failed", rec("starting", "not_started"), []],
  ] as const)("from %s to %o: %o", (previous, record, expected) => {
    expect(eventsFor(record, previous)).toEqual(expected);
  });
});

describe("retry delays", () => {
  it("grow exponentially from the base, with jitter between half and all of it, capped", () => {
    expect(retryDelayMs(1, 100, () => 0)).toBe(50);
    expect(retryDelayMs(1, 100, () => 1)).toBe(100);
    expect(retryDelayMs(3, 100, () => 1)).toBe(400);
    expect(retryDelayMs(60, 100, () => 1)).toBe(60 * 60 * 1000);
  });
});
