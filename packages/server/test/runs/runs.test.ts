/**
 * The run core over a real WebSocket link: in-process Server (real SQLite in
 * a temp dir) + the Runner's real link.ts driving an in-memory RunService.
 */
import { encodeFrame, PROTOCOL_VERSION, type RunUpdateFrame, TENANT_TAG_PATTERN } from "@webcodex/protocol";
import { afterEach, describe, expect, it, vi } from "vitest";
import WebSocket from "ws";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import type { RunnerConnection } from "../../src/link/hub.js";
import { MAX_SAME_KEY_WAITS } from "../../src/runs/admission.js";
import type { ObserveOutput, StartInput } from "../../src/runs/api.js";
import { deriveRunId } from "../../src/runs/identity.js";
import { neverAdmittedPatch } from "../../src/runs/reconcile.js";
import { MAX_PENDING_RUNNER_FRAMES, type Runs } from "../../src/runs/runs.js";
import { StateBusyError, StateUnavailableError } from "../../src/state/engine.js";
import { FakeRunService, instanceId, msg } from "../support/fake-run-service.js";
import { alice, bob, Harness, principal } from "../support/in-process.js";

/** Bound on the link reconnecting to a restarted in-process Server, its backoff included. */
const RECONNECT_WAIT_MS = 10_000;

/** Until an observe on `runId` is parked on its mirror (a waiter), so what the test does next wakes it. */
function untilWaiting(h: Harness, runId: string) {
  return poll(() => (h.server.runs as Runs).mirrors.get(runId)?.idle === false, {
    timeoutMs: IN_PROCESS_WAIT_MS,
    intervalMs: IN_PROCESS_POLL_MS,
  });
}

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };
const R2 = { id: "r2", token: "token-two-bbbbbbbbbbbbbbbb", projects: ["other"] };

function input(key: string, extra: Partial<StartInput> = {}): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "scenario: hello", ...extra };
}

async function online(h: Harness, svc: FakeRunService, token = R1.token) {
  const link = h.link(svc, token);
  await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
  await poll(
    async () =>
      (await h.server.runs.listProjects(alice)).some(
        (p) => p.runner_online && svc.projects.some((x) => x.project_id === p.project_id),
      ),
    { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS },
  );
  return link;
}

function ok<T>(r: { ok: true; value: T } | { ok: false; error: unknown }): T {
  if (!r.ok) throw new Error(`expected ok, got ${JSON.stringify(r.error)}`);
  return r.value;
}

describe("run core", () => {
  let h: Harness;
  afterEach(async () => {
    vi.restoreAllMocks();
    await h.close();
  });

  it("admits a run, sends the captured fences, and streams only-new events in order", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const key = canary("idempotency-key");
    const started = ok(await h.server.runs.start(alice, input(key)));
    expect(started).toMatchObject({ state: "starting", execution_state: "not_started", replayed: false });
    expect(svc.starts).toHaveLength(1);
    expect(svc.starts[0]).toMatchObject({
      run_id: started.run_id,
      agent_instance_id: svc.agentInstanceId,
      provider_instance_id: svc.providerInstanceId,
      prompt: "scenario: hello",
    });
    expect(JSON.stringify(svc.starts[0])).not.toContain(key);

    svc.setState(started.run_id, "running", { execution_state: "started" });
    svc.emit(started.run_id, [msg("one"), msg("two")]);
    let obs = ok(
      await h.server.runs.observe(alice, {
        run_id: started.run_id,
        after_observation_token: started.observation_token,
        wait_secs: 5,
      }),
    );
    if (obs.events.length < 2) {
      const more = ok(
        await h.server.runs.observe(alice, {
          run_id: started.run_id,
          after_observation_token: obs.observation_token,
          wait_secs: 5,
        }),
      );
      obs = { ...more, events: [...obs.events, ...more.events] };
    }
    expect(obs.events.map((e) => e.seq)).toEqual([1, 2]);
    svc.finish(started.run_id);
    const end = ok(
      await h.server.runs.observe(alice, {
        run_id: started.run_id,
        after_observation_token: obs.observation_token,
        wait_secs: 5,
      }),
    );
    expect(end.events.map((e) => e.kind)).toEqual(["terminal"]);
    expect(end.state).toBe("completed");
    expect(end.stop_reason).toBe("end_turn");
    const again = ok(
      await h.server.runs.observe(alice, {
        run_id: started.run_id,
        after_observation_token: end.observation_token,
        wait_secs: 5,
      }),
    );
    expect(again.events).toEqual([]);
    expect(again.state).toBe("completed");
  });

  it("replays the same run for the same key and input, dispatching once", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const [a, b] = await Promise.all([
      h.server.runs.start(alice, input("same")),
      h.server.runs.start(alice, input("same")),
    ]);
    const first = ok(a);
    const second = ok(b);
    expect(second.run_id).toBe(first.run_id);
    expect([first.replayed, second.replayed].sort()).toEqual([false, true]);
    expect(ok(await h.server.runs.start(alice, input("same"))).replayed).toBe(true);
    expect(svc.starts).toHaveLength(1);
  });

  it("answers idempotency_conflict before any dispatch when the key is reused with other input", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    ok(await h.server.runs.start(alice, input("k")));
    const r = await h.server.runs.start(alice, input("k", { prompt: "something else" }));
    expect(r).toMatchObject({ ok: false, error: { code: "idempotency_conflict" } });
    expect(svc.starts).toHaveLength(1);
  });

  it("tags each start with its caller's tenant: the same for one principal, different for two, never the principal id", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    // Principal ids that are long random canaries, so "never the principal id" can fail.
    const first = principal(canary("principal"), ["coding_agent:run", "project:write"], ["demo"]);
    const second = principal(canary("principal"), ["coding_agent:run", "project:write"], ["demo"]);
    const a1 = ok(await h.server.runs.start(first, input(canary("key"))));
    const a2 = ok(await h.server.runs.start(first, input(canary("key"))));
    const b1 = ok(await h.server.runs.start(second, input(canary("key"))));
    const tenantOf = (runId: string) => svc.starts.find((s) => s.run_id === runId)?.tenant;
    expect(tenantOf(a1.run_id)).toMatch(TENANT_TAG_PATTERN);
    expect(tenantOf(a2.run_id)).toBe(tenantOf(a1.run_id));
    expect(tenantOf(b1.run_id)).toMatch(TENANT_TAG_PATTERN);
    expect(tenantOf(b1.run_id)).not.toBe(tenantOf(a1.run_id));
    expect(JSON.stringify(svc.starts)).not.toContain(first.id);
    expect(JSON.stringify(svc.starts)).not.toContain(second.id);
  });

  it("checks scopes and grants, and hides other principals' runs as not_found", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    for (const scopes of [["project:write"], ["job:run", "project:write"], ["mcp:local", "runtime:read"]] as const) {
      const p = principal("alice", [...scopes], ["demo"]);
      expect(await h.server.runs.start(p, input("x"))).toMatchObject({ ok: false, error: { code: "forbidden" } });
    }
    expect(await h.server.runs.start(bob, input("x", { project_id: "other" }))).toMatchObject({
      ok: false,
      error: { code: "forbidden" },
    });
    const run = ok(await h.server.runs.start(alice, input("mine")));
    expect(await h.server.runs.observe(bob, { run_id: run.run_id })).toMatchObject({
      ok: false,
      error: { code: "not_found" },
    });
    expect(await h.server.runs.cancel(bob, { run_id: run.run_id })).toMatchObject({
      ok: false,
      error: { code: "not_found" },
    });
    expect(await h.server.runs.observe(alice, { run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" })).toMatchObject({
      ok: false,
      error: { code: "not_found" },
    });
    const unknownProvider = await h.server.runs.start(alice, input("p", { provider_id: "nope" }));
    expect(unknownProvider).toMatchObject({ ok: false, error: { code: "provider_unavailable" } });
    expect(unknownProvider.ok ? "" : unknownProvider.error.message).toContain("fake (Fake)");
    expect(svc.starts).toHaveLength(1);
  });

  it("rejects a forged, tampered or cross-run observation token", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const a = ok(await h.server.runs.start(alice, input("a")));
    const b = ok(await h.server.runs.start(alice, input("b")));
    for (const token of [b.observation_token, `${a.observation_token}x`, "wcobs1.AAAA.BBBB"]) {
      expect(await h.server.runs.observe(alice, { run_id: a.run_id, after_observation_token: token })).toMatchObject({
        ok: false,
        error: { code: "invalid_observation_token" },
      });
    }
  });

  it("leaves retryable records for capacity and offline rejections, and an exact retry re-admits", async () => {
    h = await new Harness().start([R1]);
    const offline = await h.server.runs.start(alice, input("late"));
    expect(offline).toMatchObject({ ok: false, error: { code: "runner_unavailable", recovery_kind: "retry_same" } });
    expect(await h.server.runs.start(alice, input("late", { prompt: "other" }))).toMatchObject({
      ok: false,
      error: { code: "idempotency_conflict" },
    });
    const svc = new FakeRunService();
    await online(h, svc);
    svc.capacityFull = true;
    expect(await h.server.runs.start(alice, input("late"))).toMatchObject({
      ok: false,
      error: { code: "capacity", recovery_kind: "retry_same" },
    });
    svc.capacityFull = false;
    const run = ok(await h.server.runs.start(alice, input("late")));
    expect(run.replayed).toBe(false);
    expect(svc.runs.has(run.run_id)).toBe(true);
  });

  it("rejects a stale runner instance before admission when the Runner restarts between resolve and dispatch", async () => {
    // The hook's delay only bounds how long the restart below may take; the window opens at an observed state.
    h = await new Harness().start([R1], { WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS: "3000" });
    const svc = new FakeRunService();
    const link = await online(h, svc);
    const pending = h.server.runs.start(alice, input("fence"));
    // Resolved: the record is written (with the fences) just before the hook's pause, and nothing was sent yet.
    await poll(async () => await h.server.store.get(deriveRunId(h.server.store.serverSecret, alice.id, "fence")), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(svc.starts).toHaveLength(0);
    await link.close();
    svc.restart();
    await online(h, svc);
    const r = await pending;
    expect(r).toMatchObject({ ok: false, error: { code: "stale_runner", recovery_kind: "retry_same" } });
    expect(svc.runs.size).toBe(0);
    const runId = deriveRunId(h.server.store.serverSecret, alice.id, "fence");
    expect(await h.server.store.get(runId)).toMatchObject({
      admission: "rejected_pre_admission",
      state: "failed",
      execution_state: "not_started",
      failure_kind: "runner_restarted",
      recovery_kind: "retry_same",
    });
    const retried = ok(await h.server.runs.start(alice, input("fence")));
    expect(svc.runs.has(retried.run_id)).toBe(true);
  });

  it("keeps a record closed while its start was out when the Runner's rejection comes after", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    let release: () => void = () => undefined;
    svc.startGate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const pending = h.server.runs.start(alice, input("closed-meanwhile"));
    await poll(() => svc.starts.length === 1, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    const runId = deriveRunId(h.server.store.serverSecret, alice.id, "closed-meanwhile");
    // Meanwhile another instance closed it as never admitted (its own run.sync answered not_found).
    await h.server.store.update(runId, neverAdmittedPatch(true));
    const closed = await h.server.store.get(runId);
    // The Runner restarted before it looked at the start: it rejects it as stale.
    svc.agentInstanceId = instanceId();
    release();
    const r = await pending;
    expect(r).toMatchObject({ ok: false, error: { recovery_kind: "retry_same" } });
    expect(await h.server.store.get(runId)).toMatchObject({
      admission: "rejected_pre_admission",
      state: "failed",
      failure_kind: "never_admitted",
      updated_at: closed?.updated_at,
    });
  });

  it("rejects a provider instance that changed between resolve and dispatch as stale_provider", async () => {
    h = await new Harness().start([R1], { WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS: "1000" });
    const svc = new FakeRunService();
    await online(h, svc);
    const pending = h.server.runs.start(alice, input("provider-fence"));
    // The run's intent (with the old provider instance) is recorded before the provider restarts.
    const runId = deriveRunId(h.server.store.serverSecret, alice.id, "provider-fence");
    await poll(async () => (await h.server.store.get(runId)) !== undefined, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    svc.providerInstanceId = instanceId();
    const r = await pending;
    expect(r).toMatchObject({ ok: false, error: { code: "stale_provider", recovery_kind: "retry_same" } });
    expect(await h.server.store.get(runId)).toMatchObject({ state: "failed", failure_kind: "stale_provider" });
    expect(svc.runs.size).toBe(0);
  });

  it("answers start_in_progress, never capacity, to a same-key start queued behind more starts than it waits for", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    // All calls are made in one tick: each waits for the one ahead of it, one admission at a time.
    const results = await Promise.all(
      Array.from({ length: MAX_SAME_KEY_WAITS + 3 }, () => h.server.runs.start(alice, input("burst"))),
    );
    const codes = results.map((r) => (r.ok ? (r.value.replayed ? "replayed" : "started") : r.error.code));
    expect(codes.filter((c) => c === "started")).toHaveLength(1);
    expect(codes).toContain("start_in_progress");
    expect(codes.every((c) => c === "started" || c === "replayed" || c === "start_in_progress")).toBe(true);
    const refused = results.find((r) => !r.ok);
    expect(refused).toMatchObject({ ok: false, error: { code: "start_in_progress", recovery_kind: "retry_same" } });
    expect(svc.starts).toHaveLength(1);
    // The advised retry returns the one run.
    expect(ok(await h.server.runs.start(alice, input("burst"))).replayed).toBe(true);
    expect(svc.starts).toHaveLength(1);
  });

  it("detects a gap by seq and re-syncs from the Runner's ring", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("gap")));
    svc.emit(run.run_id, [msg("1"), msg("2")], { silent: true });
    svc.emit(run.run_id, [msg("3")]);
    const seen: number[] = [];
    let token = run.observation_token;
    while (seen.length < 3) {
      const o = ok(
        await h.server.runs.observe(alice, { run_id: run.run_id, after_observation_token: token, wait_secs: 5 }),
      );
      seen.push(...o.events.map((e) => e.seq));
      token = o.observation_token;
    }
    expect(seen).toEqual([1, 2, 3]);
  });

  it("wakes a waiting observer as soon as an event arrives", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("wake")));
    const t0 = Date.now();
    const waiting = h.server.runs.observe(alice, {
      run_id: run.run_id,
      after_observation_token: run.observation_token,
      wait_secs: 20,
    });
    await untilWaiting(h, run.run_id);
    svc.emit(run.run_id, [msg("now")]);
    const o = ok(await waiting);
    expect(o.events).toHaveLength(1);
    // Woken by the event, not by the end of its 20 s wait.
    expect(Date.now() - t0).toBeLessThan(20_000);
  });

  it("keeps observe output within the budget and pages with has_more", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("big")));
    svc.emit(
      run.run_id,
      Array.from({ length: 60 }, (_, i) => msg(`${i}`.padEnd(1900, "é"))),
    );
    await poll(() => svc.runs.get(run.run_id), { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    let token: string | undefined;
    const seen: number[] = [];
    let pages = 0;
    for (;;) {
      const o: ObserveOutput = ok(
        await h.server.runs.observe(alice, {
          run_id: run.run_id,
          ...(token ? { after_observation_token: token } : {}),
          wait_secs: 2,
        }),
      );
      expect(Buffer.byteLength(JSON.stringify(o), "utf8")).toBeLessThanOrEqual(96 * 1024);
      seen.push(...o.events.map((e) => e.seq));
      token = o.observation_token;
      pages++;
      if (!o.has_more && seen.length >= 60) break;
      if (pages > 20) throw new Error("too many pages");
    }
    expect(pages).toBeGreaterThan(1);
    expect(seen).toEqual(Array.from({ length: 60 }, (_, i) => i + 1));
  });

  it("sends again after a restart a cancel whose answer never came, from its record", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const link = await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("cancel-unknown")));
    let release = () => {};
    svc.cancelGate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const cancelling = h.server.runs.cancel(alice, { run_id: run.run_id });
    await poll(() => svc.cancels.length === 1, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    await link.close(); // the Runner's answer never reaches this Server
    expect(ok(await cancelling)).toMatchObject({ cancel_requested: true, already_terminal: false });
    expect(await h.server.store.get(run.run_id)).toMatchObject({ cancel_forwarded: false, cancel_pending: true });
    // Nothing of this Server's memory survives: only the record can say the cancel is owed.
    await h.restartServer();
    svc.cancelGate = null;
    release();
    await online(h, svc);
    await poll(async () => (await h.server.store.get(run.run_id))?.cancel_forwarded === true, {
      timeoutMs: RECONNECT_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
      what: "the cancel sent again after the Runner's hello",
    });
    expect(await h.server.store.get(run.run_id)).toMatchObject({ cancel_pending: false });
    expect(svc.cancels).toEqual([run.run_id, run.run_id]);
  });

  it("forwards cancel once and answers repeats idempotently", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("c")));
    const c1 = ok(await h.server.runs.cancel(alice, { run_id: run.run_id }));
    const c2 = ok(await h.server.runs.cancel(alice, { run_id: run.run_id }));
    expect(c1).toMatchObject({ cancel_requested: true, already_terminal: false });
    expect(c2).toMatchObject({ cancel_requested: true, already_terminal: false });
    expect(svc.cancels).toEqual([run.run_id]);
    svc.finish(run.run_id, "cancelled");
    const done = ok(await h.server.runs.observe(alice, { run_id: run.run_id, wait_secs: 1 }));
    await poll(async () => (await h.server.store.get(run.run_id))?.state === "cancelled", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(ok(await h.server.runs.cancel(alice, { run_id: run.run_id }))).toMatchObject({
      already_terminal: true,
      state: "cancelled",
    });
    expect(done.run_id).toBe(run.run_id);
  });

  it("marks runs on an offline runner with runner_offline and keeps their last state", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const link = await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("off")));
    svc.setState(run.run_id, "running", { execution_state: "started" });
    await poll(async () => (await h.server.store.get(run.run_id))?.state === "running", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    const t0 = Date.now();
    const waiting = h.server.runs.observe(alice, {
      run_id: run.run_id,
      after_observation_token: run.observation_token,
      wait_secs: 20,
    });
    await untilWaiting(h, run.run_id);
    await link.close();
    expect(ok(await waiting).runner_offline).toBe(true);
    // Woken by the Runner going offline, not by the end of its 20 s wait.
    expect(Date.now() - t0).toBeLessThan(20_000);
    await poll(
      async () => !(await h.server.runs.listProjects(alice)).find((p) => p.project_id === "demo")?.runner_online,
      {
        timeoutMs: IN_PROCESS_WAIT_MS,
        intervalMs: IN_PROCESS_POLL_MS,
      },
    );
    const o = ok(
      await h.server.runs.observe(alice, { run_id: run.run_id, after_observation_token: run.observation_token }),
    );
    expect(o).toMatchObject({ state: "running", runner_offline: true, history_lost: false });
  });

  it("gives history_lost and a fresh baseline for tokens from before a Runner restart", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const link = await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("rr")));
    svc.setState(run.run_id, "running", { execution_state: "started", phase: "dispatch_barrier" });
    svc.emit(run.run_id, [msg("before")]);
    const o1 = ok(
      await h.server.runs.observe(alice, {
        run_id: run.run_id,
        after_observation_token: run.observation_token,
        wait_secs: 5,
      }),
    );
    await link.close();
    svc.restart();
    await online(h, svc);
    await poll(async () => (await h.server.store.get(run.run_id))?.state === "lost", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    const o2 = ok(
      await h.server.runs.observe(alice, { run_id: run.run_id, after_observation_token: o1.observation_token }),
    );
    expect(o2).toMatchObject({ state: "lost", execution_state: "outcome_unknown", history_lost: true, events: [] });
    const o3 = ok(
      await h.server.runs.observe(alice, { run_id: run.run_id, after_observation_token: o2.observation_token }),
    );
    expect(o3.history_lost).toBe(false);
  });

  it("reconciles a run whose Runner store changed as lost", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const link = await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("store")));
    await link.close();
    svc.restart({ newStore: true });
    await online(h, svc);
    await poll(async () => (await h.server.store.get(run.run_id))?.state === "lost", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(await h.server.store.get(run.run_id)).toMatchObject({
      failure_kind: "runner_store_changed",
      execution_state: "outcome_unknown",
    });
  });

  it("keeps observing across a Server restart with the same Runner", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("srv")));
    svc.setState(run.run_id, "running", { execution_state: "started" });
    svc.emit(run.run_id, [msg("a")]);
    // Both updates applied first: an observe that looks between them is answered at the state change alone
    // (on PostgreSQL the first one's record write can outlast the wait for the second).
    await poll(async () => ok(await h.server.runs.observe(alice, { run_id: run.run_id })).events.length === 1, {
      timeoutMs: RECONNECT_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    const o1 = ok(
      await h.server.runs.observe(alice, {
        run_id: run.run_id,
        after_observation_token: run.observation_token,
        wait_secs: 5,
      }),
    );
    expect(o1.events.map((e) => e.seq)).toEqual([1]);
    await h.restartServer();
    await poll(
      async () => (await h.server.runs.listProjects(alice)).find((p) => p.project_id === "demo")?.runner_online,
      {
        timeoutMs: RECONNECT_WAIT_MS,
        intervalMs: IN_PROCESS_POLL_MS,
      },
    );
    svc.emit(run.run_id, [msg("b")]);
    const o2 = ok(
      await h.server.runs.observe(alice, {
        run_id: run.run_id,
        after_observation_token: o1.observation_token,
        wait_secs: 5,
      }),
    );
    expect(o2.history_lost).toBe(false);
    expect(o2.events.map((e) => e.seq)).toEqual([2]);
    const base = ok(await h.server.runs.observe(alice, { run_id: run.run_id }));
    expect(base.events.map((e) => e.seq)).toEqual([1, 2]);
    expect(ok(await h.server.runs.start(alice, input("srv"))).replayed).toBe(true);
    expect(svc.starts).toHaveLength(1);
  });

  it("routes two projects to their two runners", async () => {
    h = await new Harness().start([R1, R2]);
    const s1 = new FakeRunService();
    const s2 = new FakeRunService({ projects: [{ project_id: "other", allow_patch: true }] });
    await online(h, s1, R1.token);
    await online(h, s2, R2.token);
    const a = ok(await h.server.runs.start(alice, input("d")));
    const b = ok(await h.server.runs.start(alice, input("o", { project_id: "other" })));
    expect(s1.runs.has(a.run_id) && !s1.runs.has(b.run_id)).toBe(true);
    expect(s2.runs.has(b.run_id) && !s2.runs.has(a.run_id)).toBe(true);
  });

  it("keeps serving other runners while one runner never answers", async () => {
    h = await new Harness().start([R1, R2]);
    const stuckSvc = new FakeRunService();
    const stuck = new WebSocket(h.wsUrl(), { headers: { authorization: `Bearer ${R1.token}` } });
    await new Promise((r) => stuck.once("open", r));
    stuck.send(
      encodeFrame({ type: "hello", protocol_version: PROTOCOL_VERSION, ...stuckSvc.helloBody(), inventory: [] }),
    );
    await poll(
      async () => (await h.server.runs.listProjects(alice)).find((p) => p.project_id === "demo")?.runner_online,
      {
        timeoutMs: IN_PROCESS_WAIT_MS,
        intervalMs: IN_PROCESS_POLL_MS,
      },
    );
    stuck.pause(); // reads nothing more, answers nothing
    const hanging = h.server.runs.start(alice, input("stuck"));
    const s2 = new FakeRunService({ projects: [{ project_id: "other", allow_patch: true }] });
    await online(h, s2, R2.token);
    const b = ok(await h.server.runs.start(alice, input("fine", { project_id: "other" })));
    expect(s2.runs.has(b.run_id)).toBe(true);
    stuck.terminate();
    const r = await hanging;
    // The frame was sent and no answer came: the run exists with an unknown outcome, never re-sent.
    expect(r.ok && r.value.state).toBe("starting");
    expect(ok(await h.server.runs.start(alice, input("stuck"))).replayed).toBe(true);
  });

  it("keeps prompts, event text and idempotency keys out of the Server database and logs", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("KEY-CANARY-1f3a", { prompt: "PROMPT-CANARY-9c2e" })));
    svc.emit(run.run_id, [msg("EVENT-CANARY-77d1")]);
    await poll(
      () => h.server.runs.observe(alice, { run_id: run.run_id }).then((o) => o.ok && o.value.events.length > 0),
      { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS },
    );
    svc.finish(run.run_id);
    await poll(async () => (await h.server.store.get(run.run_id))?.state === "completed", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    const bytes = await h.stateText();
    const logs = h.log.lines.join("");
    for (const canary of ["KEY-CANARY-1f3a", "PROMPT-CANARY-9c2e", "EVENT-CANARY-77d1"]) {
      expect(bytes).not.toContain(canary);
      expect(logs).not.toContain(canary);
    }
  });

  it("answers a start, an observe and a cancel the state database cannot serve with its code, naming nothing of the database", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("before-outage")));
    const secret = canary("database-url");
    const store = h.server.store;
    const down = () => Promise.reject(new StateUnavailableError(`connect ECONNREFUSED ${secret}`));
    const get = vi.spyOn(store, "get").mockImplementation(down);
    const started = await h.server.runs.start(alice, input("during-outage"));
    const observed = await h.server.runs.observe(alice, { run_id: run.run_id });
    const cancelled = await h.server.runs.cancel(alice, { run_id: run.run_id });
    get.mockRestore();
    vi.spyOn(store, "decide").mockRejectedValueOnce(new StateBusyError(secret));
    const busy = await h.server.runs.start(alice, input("busy"));
    for (const [result, code, recovery] of [
      [started, "state_unavailable", "retry_same"],
      [observed, "state_unavailable", "reobserve"],
      [cancelled, "state_unavailable", "retry_same"],
      [busy, "state_busy", "retry_same"],
    ] as const) {
      expect(result).toMatchObject({ ok: false, error: { code, recovery_kind: recovery } });
      expect(JSON.stringify(result)).not.toContain(secret);
    }
    // Back: the start refused while the database was away is made with the same key.
    expect(ok(await h.server.runs.start(alice, input("busy"))).replayed).toBe(false);
  });

  it(`closes a Runner's link when ${MAX_PENDING_RUNNER_FRAMES} of its run.update frames already wait for the state database`, async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    await online(h, svc);
    const run = ok(await h.server.runs.start(alice, input("backlog")));
    // The state database stops answering: the first frame's read never ends, the rest wait behind it.
    vi.spyOn(h.server.store, "get").mockImplementation(() => new Promise(() => undefined));
    const closes: unknown[][] = [];
    const conn = { runnerId: R1.id, close: (...args: unknown[]) => closes.push(args) } as unknown as RunnerConnection;
    const frame = { type: "run.update", run: { run_id: run.run_id }, events: [] } as unknown as RunUpdateFrame;
    const runs = h.server.runs as Runs;
    for (let i = 0; i < MAX_PENDING_RUNNER_FRAMES; i++) runs.onUpdate(conn, frame);
    expect(closes).toEqual([]);
    runs.onUpdate(conn, frame);
    expect(closes).toEqual([[1013, "server state busy"]]);
  });
});
