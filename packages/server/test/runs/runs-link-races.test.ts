/**
 * The run core against a hand-driven Runner connection: races between a
 * newer hello, reconciliation, catch-up syncs, unknown-outcome starts and
 * cancels whose delivery is unknown.
 */
import { afterEach, describe, expect, it } from "vitest";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { StartInput } from "../../src/runs/api.js";
import { FakeRunService, msg } from "../support/fake-run-service.js";
import { alice, Harness } from "../support/in-process.js";
import { RawRunner } from "../support/raw-runner.js";

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };

function input(key: string, extra: Partial<StartInput> = {}): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "scenario: hello", ...extra };
}

function ok<T>(r: { ok: true; value: T } | { ok: false; error: unknown }): T {
  if (!r.ok) throw new Error(`expected ok, got ${JSON.stringify(r.error)}`);
  return r.value;
}

const runIdOf = (f: object): string | undefined => ("run_id" in f ? String(f.run_id) : undefined);

describe("run core against a hand-driven Runner link", () => {
  let h: Harness;
  const raws: RawRunner[] = [];
  afterEach(async () => {
    for (const r of raws.splice(0)) r.close();
    await h.close();
  });

  async function connect(
    svc: FakeRunService,
    hold?: Parameters<typeof RawRunner.connect>[4],
    inventory = svc.inventory(),
  ): Promise<RawRunner> {
    const r = await RawRunner.connect(h.wsUrl(), R1.token, svc, inventory, hold);
    raws.push(r);
    await poll(async () => (await h.server.runs.listProjects(alice)).some((p) => p.runner_online), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    return r;
  }

  it("still catches a mirror up after a catch-up ended before sending anything (replaced connection)", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const first = await connect(svc);
    const x = ok(await h.server.runs.start(alice, input("x")));
    const y = ok(await h.server.runs.start(alice, input("y")));
    svc.emit(y.run_id, [msg("one"), msg("two")]); // never pushed: the Server must fetch them with run.sync
    first.close();
    await poll(async () => !(await h.server.runs.listProjects(alice)).some((p) => p.runner_online), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });

    // Connection A: its inventory lacks x, so reconciliation queries x and waits on it.
    const inv = svc.inventory().filter((s) => s.run_id === y.run_id);
    const holdX = (f: { type: string; run_id?: string }) => f.type === "run.sync" && runIdOf(f) === x.run_id;
    const a = await RawRunner.connect(h.wsUrl(), R1.token, svc, inv, holdX);
    raws.push(a);
    await poll(() => a.held.length > 0, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    // Connection B replaces A while A's query is pending; B also holds its query of x.
    const b = await RawRunner.connect(h.wsUrl(), R1.token, svc, inv, holdX);
    raws.push(b);
    await poll(() => b.held.length > 0 && !a.open, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });

    const seen: number[] = [];
    let token: string | undefined;
    for (let i = 0; i < 3 && seen.length < 2; i++) {
      const o = ok(
        await h.server.runs.observe(alice, {
          run_id: y.run_id,
          ...(token ? { after_observation_token: token } : {}),
        }),
      );
      seen.push(...o.events.map((e) => e.seq));
      token = o.observation_token;
    }
    expect(seen).toEqual([1, 2]);
    expect(b.requests("run.sync").some((f) => runIdOf(f) === y.run_id)).toBe(true);
  });

  it("closes a start whose connection was replaced mid-flight as never admitted, once the start settles", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const a = await connect(svc);
    a.hold = (f) => f.type === "run.start";
    const pending = h.server.runs.start(alice, input("replaced"));
    await poll(() => a.held.length > 0, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    await connect(svc); // the newer hello fences A; its reconciliation sees the start as busy
    const r = ok(await pending);
    expect(r.state).toBe("starting");
    const rec = await poll(
      async () => {
        const x = await h.server.store.get(r.run_id);
        return x?.state === "failed" ? x : undefined;
      },
      { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS },
    );
    expect(rec).toMatchObject({
      execution_state: "not_started",
      failure_kind: "never_admitted",
      recovery_kind: "retry_same",
    });
    expect(svc.runs.size).toBe(0);
    // Proven never admitted: an exact same-key retry re-admits it, once.
    const retried = ok(await h.server.runs.start(alice, input("replaced")));
    expect(retried).toMatchObject({ run_id: r.run_id, replayed: false, state: "starting" });
    expect(svc.runs.has(r.run_id)).toBe(true);
    expect((await h.server.store.get(r.run_id))?.admission).toBe("admitted");
  });

  it("settles a start that timed out on a live connection: not admitted closes, admitted is adopted", async () => {
    h = await new Harness().start([R1], {}, { startTimeoutMs: 300 });
    const svc = new FakeRunService();
    const a = await connect(svc);
    a.hold = (f) => f.type === "run.start";
    const lost = ok(await h.server.runs.start(alice, input("never")));
    expect(lost.state).toBe("starting");
    await poll(async () => (await h.server.store.get(lost.run_id))?.failure_kind === "never_admitted", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });

    // The Runner admits this one but its answer never arrives.
    a.hold = (f) => {
      if (f.type !== "run.start") return false;
      const { type: _t, request_id: _r, ...req } = f;
      void svc.start(req);
      return true;
    };
    const slow = ok(await h.server.runs.start(alice, input("admitted")));
    await poll(async () => (await h.server.store.get(slow.run_id))?.admission === "admitted", {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(await h.server.store.get(slow.run_id)).toMatchObject({ state: "starting", failure_kind: null });
  });

  it("closes a sent-but-unknown start as never admitted when run.cancel answers not_found", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const a = await connect(svc);
    a.hold = (f) => f.type === "run.start";
    const pending = h.server.runs.start(alice, input("cancel-unknown"));
    await poll(() => a.held.length > 0, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    // B answers no run.sync at all, so only the cancel's answer can settle the record.
    const b = await connect(svc, (f) => f.type === "run.sync");
    const r = ok(await pending);
    const c = ok(await h.server.runs.cancel(alice, { run_id: r.run_id }));
    expect(c).toMatchObject({ run_id: r.run_id, state: "failed", cancel_requested: false, already_terminal: true });
    expect(await h.server.store.get(r.run_id)).toMatchObject({ state: "failed", failure_kind: "never_admitted" });
    expect(b.requests("run.cancel")).toHaveLength(1);
  });

  it("sends a cancel again after the next hello when the link closed before its answer", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const a = await connect(svc, (f) => f.type === "run.cancel");
    const run = ok(await h.server.runs.start(alice, input("cancel-lost")));
    const pending = h.server.runs.cancel(alice, { run_id: run.run_id });
    await poll(() => a.held.length > 0, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    a.close(); // the cancel may or may not have reached the Runner
    expect(ok(await pending)).toMatchObject({ cancel_requested: true, already_terminal: false });
    expect((await h.server.store.get(run.run_id))?.cancel_forwarded).toBe(false);
    expect(svc.cancels).toEqual([]);

    const b = await connect(svc);
    await poll(async () => (await h.server.store.get(run.run_id))?.cancel_forwarded === true, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(b.requests("run.cancel").map(runIdOf)).toEqual([run.run_id]);
    expect(svc.cancels).toEqual([run.run_id]);
    // Delivered now: a repeat is answered without another frame.
    expect(ok(await h.server.runs.cancel(alice, { run_id: run.run_id }))).toMatchObject({ cancel_requested: true });
    expect(b.requests("run.cancel")).toHaveLength(1);
  });

  it("answers project_not_writable the same way whether the Server or the Runner finds it: none, ask the operator", async () => {
    h = await new Harness().start([R1]);
    const closed = new FakeRunService({ projects: [{ project_id: "demo", allow_patch: false }] });
    const a = await connect(closed);
    const local = await h.server.runs.start(alice, input("np-local"));
    a.stop();
    await poll(async () => !(await h.server.runs.listProjects(alice)).some((p) => p.runner_online), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });

    const svc = new FakeRunService(); // advertises allow_patch = true, but rejects at admission
    const b = await connect(svc, (f) => f.type === "run.start");
    const pending = h.server.runs.start(alice, input("np-runner"));
    await poll(() => b.held.length > 0, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    const held = b.held[0]!;
    b.send({ type: "error", request_id: held.request_id, code: "project_not_writable", message: "not writable" });
    const remote = await pending;
    for (const r of [local, remote]) {
      expect(r).toMatchObject({ ok: false, error: { code: "forbidden", recovery_kind: "none" } });
      if (!r.ok) expect(r.error.message).toContain("allow_patch = true");
    }
    expect(!local.ok && !remote.ok && local.error.message === remote.error.message).toBe(true);
  });
});
