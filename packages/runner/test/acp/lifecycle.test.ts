/**
 * The turn's control paths against the real fake agent: permission (never
 * allowed; deadline and cancel both answer `cancelled`), cancel before and
 * after dispatch, the cancel grace, the run deadline, capacity, env clearing
 * and redaction, and process-tree cleanup (SIGTERM-ignoring grandchild, and a
 * launcher script that does not forward signals).
 */
import { readFileSync } from "node:fs";
import type { RunSummary } from "@webcodex/protocol";
import { afterAll, describe, expect, test, vi } from "vitest";
import { alive, readLedger } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { MAX_PENDING_PERMISSIONS } from "../../src/acp/permissions.js";
import { SHUTDOWN_UNCONFIRMED } from "../../src/acp/terminal.js";
import {
  endHangingRun,
  groupMembers,
  makeWorkspace,
  newManager,
  runToEnd,
  startRequest,
  waitForState,
  writeConfig,
  writeLauncher,
} from "../support/harness.js";

const ws = makeWorkspace();
/**
 * Each cleanup step's grace in the test of a run that has ended while its agent is still being stopped: long enough
 * that the next start surely comes while it still holds its slot, however loaded the machine.
 */
const ENDING_GRACE_MS = 5_000;
/** An agent's session/new delay far beyond a close that aborts the setup, however loaded the machine. */
const SLOW_SESSION_NEW_MS = 60_000;
const SECRET = canary("env-value");
const config = writeConfig(ws, {
  acp: { permission_timeout_secs: 1, cancel_grace_secs: 1, max_concurrent_runs: 2 },
  agents: [
    { id: "fake" },
    {
      id: "env",
      args: ["--ledger", ws.ledger, "--env-names", ws.envNames],
      env: { PATH: "PATH", API_TOKEN: "WC_TEST_SECRET", SHORT: "WC_TEST_SHORT" },
    },
    { id: "launcher", executable: writeLauncher(ws) },
  ],
});
const sourceEnv = { ...process.env, WC_TEST_SECRET: SECRET, WC_TEST_SHORT: "abc", WC_NOT_MAPPED: "nope" };
const { manager } = newManager(config, { sourceEnv });

afterAll(async () => {
  await manager.close();
  ws.cleanup();
});

const outcomes = () => readLedger(ws.ledger).filter((e) => e.event === "permission_outcome");

describe("permission requests", () => {
  test("are never allowed: the deadline answers cancelled and the terminal message says why", async () => {
    const before = outcomes().length;
    const mark = readLedger(ws.ledger).length;
    let sawWaiting = false;
    const { run, events } = await runToEnd(manager, "scenario: permission\ncase: deadline", {}, async (runId) => {
      await waitForState(manager, runId, "waiting_permission");
      sawWaiting = true;
    });
    expect(sawWaiting).toBe(true);
    expect(run).toMatchObject({
      state: "cancelled",
      execution_state: "completed",
      stop_reason: "cancelled",
      failure_kind: "permission_timeout",
    });
    expect(run.message).toMatch(/permission deadline expired/);
    const request = events.find((e) => e.kind === "permission_request");
    expect(request).toMatchObject({ tool_call_id: "call-perm-1", title: "Edit src/math.js" });
    expect(outcomes().slice(before)).toEqual([{ event: "permission_outcome", outcome: "cancelled" }]);
    // No cancel was requested: session/cancel is never sent.
    expect(
      readLedger(ws.ledger)
        .slice(mark)
        .map((e) => e.event),
    ).toEqual(["prompt", "permission_outcome"]);
  });

  test("a cancel answers the pending request cancelled before session/cancel", async () => {
    const before = outcomes().length;
    const mark = readLedger(ws.ledger).length;
    const { run } = await runToEnd(manager, "scenario: permission\ncase: cancel", {}, async (runId) => {
      await waitForState(manager, runId, "waiting_permission");
      const first = await manager.cancel(runId);
      const second = await manager.cancel(runId);
      expect(first).toMatchObject({ cancel_requested: true, already_terminal: false });
      expect(second).toMatchObject({ cancel_requested: true, already_terminal: false });
    });
    expect(run).toMatchObject({ state: "cancelled", execution_state: "completed", stop_reason: "cancelled" });
    expect(run.message).toMatch(/cancel was requested/);
    const after = outcomes().slice(before);
    expect(after).toEqual([{ event: "permission_outcome", outcome: "cancelled" }]);
    expect(readLedger(ws.ledger).some((e) => e.event === "permission_outcome" && e.outcome === "selected")).toBe(false);
    // Two cancel calls, at most one session/cancel, read by the agent after the permission answer. (The
    // fake agent ends the turn on a cancelled answer, so the Runner may see the turn end before it
    // gets to send session/cancel, and then never sends it.)
    expect([
      ["prompt", "permission_outcome"],
      ["prompt", "permission_outcome", "cancel"],
    ]).toContainEqual(
      readLedger(ws.ledger)
        .slice(mark)
        .map((e) => e.event),
    );
  });
});

describe("permission flood", () => {
  test("at most MAX_PENDING_PERMISSIONS wait; the rest are answered cancelled at once, without events, and counted", async () => {
    const before = outcomes().length;
    const count = MAX_PENDING_PERMISSIONS + 24;
    const { run, events } = await runToEnd(manager, `scenario: permission_flood count=${count}\ncase: flood`);
    expect(run).toMatchObject({ state: "cancelled", execution_state: "completed", stop_reason: "cancelled" });
    const requests = events.filter((e) => e.kind === "permission_request");
    expect(requests.length).toBeGreaterThan(0);
    expect(requests.length).toBeLessThanOrEqual(MAX_PENDING_PERMISSIONS);
    expect(run.ignored_updates).toBeGreaterThanOrEqual(count - MAX_PENDING_PERMISSIONS);
    expect(requests.length + run.ignored_updates).toBe(count);
    const answered = outcomes().slice(before);
    expect(answered).toHaveLength(count);
    expect(answered.every((e) => e.outcome === "cancelled")).toBe(true);
  });
});

describe("cancel", () => {
  test("after dispatch: correlated cancelled; a later cancel reports already_terminal", async () => {
    const mark = readLedger(ws.ledger).length;
    const request = startRequest(manager, "scenario: slow interval_ms=100 count=600\ncase: cancel");
    await manager.start(request);
    await waitForState(manager, request.run_id, "running");
    await manager.ring(request.run_id)?.waitFor(0);
    await manager.cancel(request.run_id);
    await manager.cancel(request.run_id);
    await manager.whenSettled(request.run_id);
    const run = manager.sync(request.run_id, 0, 0)?.run;
    expect(run).toMatchObject({ state: "cancelled", execution_state: "completed", stop_reason: "cancelled" });
    expect(await manager.cancel(request.run_id)).toMatchObject({ cancel_requested: false, already_terminal: true });
    expect(
      readLedger(ws.ledger)
        .slice(mark)
        .map((e) => e.event),
    ).toEqual(["prompt", "cancel"]);
  });

  test("before dispatch: cancelled / not_started, no prompt reaches the agent", async () => {
    const hangConfig = writeConfig(ws, {
      agents: [{ id: "hang", args: ["--ledger", ws.ledger, "--hang-on", "session_new"] }],
    });
    const { manager: m } = newManager(hangConfig);
    const request = startRequest(m, "scenario: hello\ncase: cancel-before", { provider_id: "hang" });
    const mark = readLedger(ws.ledger).length;
    await m.start(request);
    await waitForState(m, request.run_id, "starting");
    // Cancelled during setup (the agent hangs at session/new): whichever setup step it is in, nothing is dispatched.
    await m.cancel(request.run_id);
    await m.whenSettled(request.run_id);
    const run = m.sync(request.run_id, 0, 0)?.run;
    expect(run).toMatchObject({ state: "cancelled", execution_state: "not_started", stop_reason: null });
    expect(run?.message).toMatch(/No prompt was dispatched/);
    // The agent's ledger: no prompt at all (and no session/cancel, there was no session to cancel).
    expect(readLedger(ws.ledger).slice(mark)).toEqual([]);
    await m.close();
  });

  test("an agent that never confirms ends lost / outcome_unknown after the grace", async () => {
    const mark = readLedger(ws.ledger).length;
    const { run } = await runToEnd(manager, "scenario: hang\ncase: grace", {}, async (runId) => {
      await waitForState(manager, runId, "running");
      await manager.cancel(runId);
    });
    expect(run).toMatchObject({ state: "lost", execution_state: "outcome_unknown", recovery_kind: "reconcile" });
    expect(
      readLedger(ws.ledger)
        .slice(mark)
        .map((e) => e.event),
    ).toEqual(["prompt", "cancel"]);
  });
});

describe("run deadline", () => {
  test("a cooperative agent is cancelled at the deadline (run_timeout)", async () => {
    const mark = readLedger(ws.ledger).length;
    const { run } = await runToEnd(manager, "scenario: slow interval_ms=100 count=600\ncase: deadline", {
      timeout_secs: 1,
    });
    expect(run).toMatchObject({ state: "cancelled", stop_reason: "cancelled", failure_kind: "run_timeout" });
    expect(
      readLedger(ws.ledger)
        .slice(mark)
        .map((e) => e.event),
    ).toEqual(["prompt", "cancel"]);
  });

  test("an agent that ignores the cancel is lost at deadline + grace", async () => {
    const { run } = await runToEnd(manager, "scenario: hang\ncase: deadline-lost", { timeout_secs: 1 });
    expect(run).toMatchObject({ state: "lost", execution_state: "outcome_unknown", failure_kind: "run_timeout" });
  });
});

describe("capacity", () => {
  test("max_concurrent_runs is enforced before spawn with a capacity rejection, never a queue", async () => {
    const a = startRequest(manager, "scenario: hang\ncase: cap-a", { timeout_secs: 30 });
    const b = startRequest(manager, "scenario: hang\ncase: cap-b", { timeout_secs: 30 });
    const c = startRequest(manager, "scenario: hello\ncase: cap-c");
    expect((await manager.start(a)).ok).toBe(true);
    expect((await manager.start(b)).ok).toBe(true);
    const rejected = await manager.start(c);
    expect(rejected).toMatchObject({ ok: false, code: "capacity", capacity_reason: "runner_full" });
    expect(manager.sync(c.run_id, 0, 0)).toBeNull();
    await manager.cancel(a.run_id);
    await manager.cancel(b.run_id);
    await Promise.all([manager.whenSettled(a.run_id), manager.whenSettled(b.run_id)]);
  });
});

describe("capacity while an ended run's agent is being stopped", () => {
  // One slot, and a cleanup grace long enough that the ended run surely still holds it when the next start comes.
  const oneSlot = writeConfig(ws, { acp: { cancel_grace_secs: 1, max_concurrent_runs: 1 }, agents: [{ id: "fake" }] });
  const { manager: m } = newManager(oneSlot, { cleanupGraceMs: ENDING_GRACE_MS });
  afterAll(() => m.close());

  test("a start is not refused runner_full for a run that has ended: it waits for that run's agent to be gone", async () => {
    const a = startRequest(m, "scenario: hang\ncase: ending-a", { timeout_secs: 30 });
    expect((await m.start(a)).ok).toBe(true);
    const settled = await endHangingRun(m, a.run_id);
    expect(settled(), "the ended run still holds its slot (its agent not yet stopped)").toBe(false);

    const b = startRequest(m, "scenario: hello\ncase: ending-b");
    expect(await m.start(b)).toMatchObject({ ok: true, created: true });
    expect(settled(), "the slot was freed by the ended run settling").toBe(true);
    await m.whenSettled(b.run_id);
    expect(m.sync(b.run_id, 0, 0)?.run.state).toBe("completed");
  });

  test("starts racing for the slots of several runs that have ended are each admitted as those runs settle", async () => {
    // Two slots, both held by runs that have ended; two starts at once. The first slot freed admits one of them;
    // the other is checked again, finds the Runner full, and waits for the second run rather than being refused.
    const twoSlots = writeConfig(ws, {
      acp: { cancel_grace_secs: 1, max_concurrent_runs: 2 },
      agents: [{ id: "fake" }],
    });
    const { manager: m2 } = newManager(twoSlots, { cleanupGraceMs: ENDING_GRACE_MS });
    try {
      const ending = ["race-a1", "race-a2"].map((c) =>
        startRequest(m2, `scenario: hang\ncase: ${c}`, { timeout_secs: 30 }),
      );
      for (const a of ending) expect((await m2.start(a)).ok).toBe(true);
      const settled = await Promise.all(ending.map((a) => endHangingRun(m2, a.run_id)));
      expect(
        settled.map((s) => s()),
        "both ended runs still hold their slots",
      ).toEqual([false, false]);

      const next = ["race-b1", "race-b2"].map((c) => startRequest(m2, `scenario: hello\ncase: ${c}`));
      const answers = await Promise.all(next.map((b) => m2.start(b)));
      expect(answers).toMatchObject([
        { ok: true, created: true },
        { ok: true, created: true },
      ]);
      expect(
        settled.map((s) => s()),
        "both slots were freed by the ended runs settling",
      ).toEqual([true, true]);
      for (const b of next) await m2.whenSettled(b.run_id);
    } finally {
      await m2.close();
    }
  });

  test("a Runner full of runs that have not ended still refuses at once, without waiting", async () => {
    const a = startRequest(m, "scenario: hang\ncase: full-a", { timeout_secs: 30 });
    expect((await m.start(a)).ok).toBe(true);
    await waitForState(m, a.run_id, "running");
    const refused = await m.start(startRequest(m, "scenario: hello\ncase: full-b"));
    expect(refused).toMatchObject({ ok: false, code: "capacity", capacity_reason: "runner_full" });
    // Answered while the running run still runs: the refusal did not wait for it to end.
    expect(m.sync(a.run_id, 0, 0)?.run.state).toBe("running");
    await m.cancel(a.run_id);
    await m.whenSettled(a.run_id);
  });
});

describe("environment", () => {
  test("the child sees exactly the mapped variable names, and mapped values are redacted from events", async () => {
    const { run, events } = await runToEnd(manager, "scenario: echo_env name=API_TOKEN\ncase: env", {
      provider_id: "env",
    });
    expect(run.state).toBe("completed");
    const names = JSON.parse(readFileSync(ws.envNames, "utf8")) as string[];
    expect([...names].sort()).toEqual(["API_TOKEN", "PATH", "SHORT"]);
    const text = JSON.stringify(events);
    expect(text).not.toContain(SECRET);
    expect(text).toContain("[redacted]");
  });
});

describe("process tree cleanup", () => {
  test("a grandchild that ignores SIGTERM does not survive the run", async () => {
    const { run } = await runToEnd(manager, "scenario: grandchild\ncase: tree");
    expect(run.state).toBe("completed");
    const grandchild = readLedger(ws.ledger).findLast((e) => e.event === "grandchild");
    expect(typeof grandchild?.pid).toBe("number");
    expect(alive(grandchild?.pid as number)).toBe(false);
    const agentPid = readLedger(ws.ledger).findLast((e) => e.event === "prompt")?.pid as number;
    expect(groupMembers(agentPid)).toEqual([]); // the agent leads its own group: nothing in it survived
  });

  test("an agent behind a launcher script that does not forward signals is killed with it", async () => {
    const prompt = "scenario: hang\ncase: launcher";
    const { run } = await runToEnd(manager, prompt, { provider_id: "launcher", timeout_secs: 1 });
    expect(run.state).toBe("lost");
    const agentPid = readLedger(ws.ledger).findLast((e) => e.event === "prompt")?.pid as number;
    expect(agentPid).toBeGreaterThan(0);
    expect(alive(agentPid)).toBe(false);
  });
});

describe("streamed text", () => {
  test("coalesced message events carry every chunk once, in order", async () => {
    const { run, events } = await runToEnd(manager, "scenario: slow interval_ms=5 count=40\ncase: coalesce");
    expect(run.state).toBe("completed");
    const messages = events.flatMap((e) => (e.kind === "agent_message" ? [e] : []));
    expect(messages.every((m) => !m.truncated)).toBe(true);
    const expected = Array.from({ length: 40 }, (_, i) => `tick ${i}\n`).join("");
    expect(messages.map((m) => m.text).join("")).toBe(expected);
  });

  test("a flood of 10k message chunks from the agent still coalesces into far fewer events", async () => {
    const { run, events } = await runToEnd(manager, "scenario: burst count=10000 chunk=32 kind=message");
    expect(run.state).toBe("completed");
    // last_seq counts every event the run produced (sync pages are capped, so not events.length).
    expect(events.some((e) => e.kind === "agent_message")).toBe(true);
    expect(run.last_seq).toBeLessThan(1000);
  });
});

describe("close", () => {
  test("during setup (spawn pending) aborts the setup at once: failed / not_started runner_restarted", async () => {
    const slowConfig = writeConfig(ws, {
      agents: [
        { id: "slow-new", args: ["--ledger", ws.ledger, "--session-new-delay-ms", String(SLOW_SESSION_NEW_MS)] },
      ],
    });
    const { manager: m } = newManager(slowConfig);
    const finals = new Map<string, RunSummary>();
    m.onUpdate((run) => {
      if (run.phase === "terminal") finals.set(run.run_id, run);
    });
    const request = startRequest(m, "scenario: hello\ncase: close-during-spawn", { provider_id: "slow-new" });
    expect((await m.start(request)).ok).toBe(true);
    const t0 = Date.now();
    await m.close(); // spawnAgent is still pending: no connection or child exists yet
    // Without the abort, close() waits out the whole session/new delay; with it, a small part of it.
    expect(Date.now() - t0).toBeLessThan(SLOW_SESSION_NEW_MS / 2);
    expect(finals.get(request.run_id)).toMatchObject({
      state: "failed",
      execution_state: "not_started",
      failure_kind: "runner_restarted",
    });
  });

  test("a graceful close gives a dispatched run the cancel grace (unconfirmed → lost), abandons setup as a restart would, and kills every tree", async () => {
    const closeConfig = writeConfig(ws, {
      agents: [{ id: "fake" }, { id: "hang-init", args: ["--ledger", ws.ledger, "--hang-on", "initialize"] }],
    });
    const { manager: m } = newManager(closeConfig);
    const finals = new Map<string, RunSummary>();
    m.onUpdate((run) => {
      if (run.phase === "terminal") finals.set(run.run_id, run);
    });
    // `hang` never answers the prompt nor the shutdown's session/cancel: the grace runs out and the run is lost.
    // (An agent that confirms the cancel ends `cancelled`: recovery-shutdown.test.ts.)
    const during = startRequest(m, "scenario: hang\ncase: close-after", { timeout_secs: 60 });
    const before = startRequest(m, "scenario: hello\ncase: close-before", { provider_id: "hang-init" });
    await m.start(during);
    await m.start(before);
    await waitForState(m, during.run_id, "running");
    const agentPid = await vi.waitFor(
      () => {
        const pid = readLedger(ws.ledger).findLast((e) => e.event === "prompt")?.pid;
        if (typeof pid !== "number") throw new Error("the agent has not received the prompt yet");
        return pid;
      },
      { timeout: 10_000, interval: 20 },
    );
    await m.close();
    expect(finals.get(during.run_id)).toMatchObject({
      state: "lost",
      execution_state: "outcome_unknown",
      failure_kind: "transport_lost",
    });
    expect(finals.get(during.run_id)?.message).toContain(SHUTDOWN_UNCONFIRMED);
    expect(finals.get(before.run_id)).toMatchObject({
      state: "failed",
      execution_state: "not_started",
      failure_kind: "runner_restarted",
    });
    expect(alive(agentPid)).toBe(false);
    expect(await m.start(startRequest(m, "scenario: hello"))).toMatchObject({ ok: false });
  });
});
