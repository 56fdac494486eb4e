/**
 * A same-key retry of a record that was sent but never acknowledged (the
 * Runner's answer was lost with the link or with a Server crash) sends the
 * same run.start again — the Runner's dedup makes that safe — instead of
 * answering `replayed: true` for a run nobody knows was admitted.
 * In-process Server (real SQLite), the Runner's real link.ts, an in-memory
 * RunService; the `sent` record is the state a crash between sending and
 * recording the answer leaves behind.
 */
import { TOMBSTONE_MESSAGE } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { StartInput } from "../../src/runs/api.js";
import { FakeRunService } from "../support/fake-run-service.js";
import { alice, Harness } from "../support/in-process.js";

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };

function input(key: string): StartInput {
  return { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "scenario: hello" };
}

function ok<T>(r: { ok: true; value: T } | { ok: false; error: unknown }): T {
  if (!r.ok) throw new Error(`expected ok, got ${JSON.stringify(r.error)}`);
  return r.value;
}

async function setup(): Promise<{ h: Harness; svc: FakeRunService; runId: string }> {
  const h = await new Harness().start([R1]);
  const svc = new FakeRunService();
  const link = h.link(svc, R1.token);
  await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
  await poll(async () => (await h.server.runs.listProjects(alice)).some((p) => p.runner_online), {
    timeoutMs: IN_PROCESS_WAIT_MS,
    intervalMs: IN_PROCESS_POLL_MS,
  });
  const first = ok(await h.server.runs.start(alice, input("k")));
  // The acknowledgement is lost: the record is back to `sent`, as a crash right after sending leaves it.
  await h.server.store.update(first.run_id, { admission: "sent" });
  return { h, svc, runId: first.run_id };
}

describe("same-key retry of a sent, unacknowledged record", () => {
  let h: Harness | undefined;
  afterEach(async () => {
    await h?.close();
    h = undefined;
  });

  it("re-sends run.start with the same run_id; a Runner that admitted it answers the existing run", async () => {
    const s = await setup();
    h = s.h;
    const retry = ok(await s.h.server.runs.start(alice, input("k")));
    expect(retry).toMatchObject({ run_id: s.runId, replayed: true });
    expect(s.svc.starts.map((r) => r.run_id)).toEqual([s.runId, s.runId]);
    expect((await s.h.server.store.get(s.runId))?.admission).toBe("admitted");
  });

  it("re-sends run.start; a Runner that never got the first one admits it now (one admission in all)", async () => {
    const s = await setup();
    h = s.h;
    s.svc.runs.delete(s.runId); // the first run.start never reached the Runner
    const retry = ok(await s.h.server.runs.start(alice, input("k")));
    expect(retry).toMatchObject({ run_id: s.runId, replayed: false, state: "starting" });
    expect(s.svc.starts.map((r) => r.run_id)).toEqual([s.runId, s.runId]);
    expect(s.svc.runs.has(s.runId)).toBe(true);
    expect((await s.h.server.store.get(s.runId))?.admission).toBe("admitted");
  });

  it("re-sends run.start; a Runner that pruned the run answers its tombstone, recorded as the run's outcome", async () => {
    const s = await setup();
    h = s.h;
    s.svc.runs.delete(s.runId);
    s.svc.tombstones.set(s.runId, {
      run_id: s.runId,
      state: "completed",
      execution_state: "completed",
      terminal_at: new Date().toISOString(),
    });
    const retry = ok(await s.h.server.runs.start(alice, input("k")));
    expect(retry).toMatchObject({ run_id: s.runId, replayed: true, state: "completed" });
    expect(await s.h.server.store.get(s.runId)).toMatchObject({
      admission: "admitted",
      state: "completed",
      execution_state: "completed",
      message: TOMBSTONE_MESSAGE,
    });
    expect(s.svc.runs.has(s.runId)).toBe(false);
  });
});
