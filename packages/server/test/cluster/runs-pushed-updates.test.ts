/**
 * An instance following a run whose Runner another instance holds takes the updates that instance pushes
 * (cluster/run-push.ts, cluster/following.ts `applyPushed`, through cluster/wake-ups.ts): one that continues its mirror exactly wakes the observers
 * with no request to the holder, and the notification of that update is then skipped; anything else — a
 * gap, another Runner process, a catch-up in flight — makes it catch up through the holder, as a
 * notification does. A push meant for another instance is never taken.
 */
import { randomBytes } from "node:crypto";
import type { RunEvent, RunSummary } from "@webcodex/protocol";
import pino from "pino";
import { describe, expect, it, vi } from "vitest";
import { NOTICE_PUSH_GRACE_MS } from "../../src/cluster/following.js";
import { FOLLOW_IDLE_MS, type RunPush } from "../../src/cluster/run-push.js";
import { WakeUps } from "../../src/cluster/wake-ups.js";
import type { RequestOutcome, RunnerRequest } from "../../src/link/hub.js";
import type { Registry } from "../../src/link/registry.js";
import { Runs } from "../../src/runs/runs.js";
import type { StateEngine } from "../../src/state/engine.js";
import type { StateStore } from "../../src/state/store.js";
import { runSummary } from "../support/run-summary.js";

const RUN_ID = "wc_agent_run_bbbbbbbbbbbbbbbbbbbbbbbbbb";
const RUNNER_ID = "r-elsewhere";
const AGENT_INSTANCE = "agent-instance-1";
const SELF = "follower-instance-1";
const HOLDER = "holder-instance-01";
/**
 * Every catch-up a push or a notice starts here runs on in-process fakes (no I/O, no timer): its whole chain of
 * promises has run once the microtasks queued before the next turn of the event loop have.
 */
const settle = () => new Promise((resolve) => setImmediate(resolve));

function event(seq: number): RunEvent {
  return { seq, at: new Date().toISOString(), kind: "agent_message", text: `tick ${seq}`, truncated: false };
}

function summary(lastSeq: number, over: Partial<RunSummary> = {}): RunSummary {
  return runSummary({ run_id: RUN_ID, agent_instance_id: AGENT_INSTANCE, last_seq: lastSeq, ...over });
}

/** A follower with a synced mirror holding seq 1; the holder's Runner holds `held` events and records every request. */
async function follower(held = 1, gate: Promise<void> = Promise.resolve()) {
  const requests: RunnerRequest[] = [];
  const runner = {
    runnerId: RUNNER_ID,
    agentInstanceId: AGENT_INSTANCE,
    conn: {
      closed: false,
      request: async (frame: RunnerRequest): Promise<RequestOutcome> => {
        requests.push(frame);
        await gate;
        const after = frame.type === "run.sync" ? frame.after_seq : 0;
        const events = Array.from({ length: Math.max(0, held - after) }, (_, i) => event(after + i + 1));
        return {
          ok: true,
          frame: { type: "run.sync.result", request_id: "q1", run: summary(held), events, has_more: false },
        };
      },
    },
  };
  const registry = {
    live: () => undefined,
    lookup: async () => runner,
    lookupRecent: async () => runner,
  } as unknown as Registry;
  let notify: (payload: string) => void = () => undefined;
  const engine = {
    dialect: "sqlite",
    listen: async (_channel: string, cb: (payload: string | null) => void) => {
      notify = cb;
      return () => {};
    },
    notify: async () => {},
    notifyAll: async () => {},
  } as unknown as StateEngine;
  const store = { serverSecret: randomBytes(32), peek: async () => undefined } as unknown as StateStore;
  const runs = new Runs({ store, registry, logger: pino({ level: "silent" }) });
  const wakeUps = await WakeUps.join(runs.core, engine, { instanceId: SELF, key: randomBytes(32) });
  const mirror = runs.mirrors.getOrCreate(RUN_ID);
  mirror.reset(AGENT_INSTANCE);
  mirror.applySync(0, summary(1), [event(1)], false);
  const push = (update: number, events: RunEvent[], over: Partial<RunPush> = {}): RunPush => ({
    runId: RUN_ID,
    runnerId: RUNNER_ID,
    holder: HOLDER,
    update,
    to: SELF,
    agentInstanceId: AGENT_INSTANCE,
    run: summary(events.at(-1)?.seq ?? 1),
    events,
    ...over,
  });
  const close = () => {
    runs.close();
    wakeUps.close();
  };
  return { runs, wakeUps, close, mirror, requests, push, notify: (payload: string) => notify(payload) };
}

describe("updates pushed by the instance holding the link", () => {
  it("takes an update that continues the mirror, wakes the observer, and skips that update's notice", async () => {
    const f = await follower(4);
    try {
      const waiting = f.mirror.waitForChange(f.mirror.version, 5_000);
      expect(f.wakeUps.applyPushed(f.push(7, [event(2)]))).toBe(true);
      await waiting;
      expect(f.mirror.eventsAfter(0).map((e) => e.seq)).toEqual([1, 2]);
      // The notice of that update (or an earlier one) asks the holder nothing.
      const stillWaiting = f.mirror.waitForChange(f.mirror.version, 5_000);
      f.notify(`${RUN_ID} ${RUNNER_ID} ${HOLDER} 7`);
      f.notify(`${RUN_ID} ${RUNNER_ID} ${HOLDER} 6`);
      expect(f.wakeUps.counts).toMatchObject({ pushes_applied: 1, notices_skipped: 2 });
      await settle();
      expect(f.requests).toEqual([]);
      // The grace a notice ahead of its push waits runs on a fake clock: "not before" is exact, not a race.
      vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
      // A later update's notice ahead of its push: the push, arriving within the grace, is enough.
      f.notify(`${RUN_ID} ${RUNNER_ID} ${HOLDER} 8`);
      expect(f.wakeUps.applyPushed(f.push(8, [event(3)]))).toBe(true);
      await vi.advanceTimersByTimeAsync(NOTICE_PUSH_GRACE_MS);
      // The grace ended on the push that came: that notice is skipped too.
      expect(f.wakeUps.counts).toMatchObject({ pushes_applied: 2, notices_skipped: 3 });
      await settle();
      expect(f.requests).toEqual([]);
      expect(f.mirror.lastSeq).toBe(3);
      await stillWaiting;
      // A later update whose push never comes: a catch-up once the grace is over, not before.
      const caughtUp = f.mirror.waitForChange(f.mirror.version, 5_000);
      f.notify(`${RUN_ID} ${RUNNER_ID} ${HOLDER} 9`);
      await vi.advanceTimersByTimeAsync(NOTICE_PUSH_GRACE_MS - 1);
      await settle();
      expect(f.requests).toEqual([]);
      await vi.advanceTimersByTimeAsync(1);
      vi.useRealTimers();
      await caughtUp;
      await settle();
      expect(f.requests).toHaveLength(1);
      expect(f.requests[0]).toMatchObject({ type: "run.sync", run_id: RUN_ID, after_seq: 3 });
      expect(f.mirror.lastSeq).toBe(4);
      // Another holder's notice, or a record change's: a catch-up at once.
      for (const payload of [`${RUN_ID} ${RUNNER_ID} other-holder-000001 9`, `${RUN_ID} ${RUNNER_ID}`]) {
        const w = f.mirror.waitForChange(f.mirror.version, 5_000);
        const asked = f.requests.length;
        f.notify(payload);
        await w;
        await settle();
        expect(f.requests).toHaveLength(asked + 1);
      }
      expect(f.requests).toHaveLength(3);
    } finally {
      vi.useRealTimers();
      f.close();
    }
  });

  it("catches up through the holder when a push leaves a gap or names another Runner process", async () => {
    const f = await follower(4);
    try {
      const waiting = f.mirror.waitForChange(f.mirror.version, 5_000);
      // seq 3 after seq 1: seq 2 was in a push that never came.
      expect(f.wakeUps.applyPushed(f.push(5, [event(3)]))).toBe(true);
      await waiting;
      await settle();
      expect(f.requests).toEqual([expect.objectContaining({ type: "run.sync", after_seq: 1 })]);
      expect(f.mirror.eventsAfter(0).map((e) => e.seq)).toEqual([1, 2, 3, 4]);
      // Its notice is not skipped: the push was not taken whole.
      expect(f.mirror.pushed).toBeNull();

      const before = f.mirror.lastSeq;
      const w = f.mirror.waitForChange(f.mirror.version, 5_000);
      f.wakeUps.applyPushed(f.push(6, [event(5)], { agentInstanceId: "agent-instance-2" }));
      await w;
      await settle();
      // The other process's seq 5 is not appended to this process's events; the holder is asked instead.
      expect(f.mirror.lastSeq).toBe(before);
      expect(f.requests).toHaveLength(2);
    } finally {
      f.close();
    }
  });

  it("never takes a push meant for another instance, and stops following an idle or ended run", async () => {
    const f = await follower();
    try {
      const version = f.mirror.version;
      expect(f.wakeUps.applyPushed(f.push(3, [event(2)], { to: "another-instance-1" }))).toBe(false);
      expect(f.mirror.version).toBe(version);
      expect(f.mirror.lastSeq).toBe(1);

      // Nobody waits, and nobody waited within FOLLOW_IDLE_MS: taken, but no longer followed.
      f.mirror.lastWaitAt = Date.now() - FOLLOW_IDLE_MS - 1;
      expect(f.wakeUps.applyPushed(f.push(4, [event(2)]))).toBe(false);
      expect(f.mirror.lastSeq).toBe(2);
      f.mirror.lastWaitAt = Date.now();
      expect(f.wakeUps.applyPushed(f.push(5, [event(3)]))).toBe(true);
      // The run's end: taken, and nothing more to follow.
      const end = f.push(6, [event(4)], { run: summary(4, { state: "completed", execution_state: "completed" }) });
      expect(f.wakeUps.applyPushed(end)).toBe(false);
      expect(f.mirror.terminal).toBe(true);
      expect(f.requests).toEqual([]);
      // A run this instance has no mirror of is not followed.
      expect(f.wakeUps.applyPushed(f.push(7, [], { runId: "wc_agent_run_cccccccccccccccccccccccccc" }))).toBe(false);
    } finally {
      f.close();
    }
  });

  it("holds a push that comes during a catch-up until it ends, and ignores one that catch-up overtook", async () => {
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const f = await follower(2, gate);
    try {
      // A record change's notice starts a catch-up; its answer (seqs up to 2) is held back.
      const caughtUp = f.mirror.waitForChange(f.mirror.version, 5_000);
      f.notify(`${RUN_ID} ${RUNNER_ID}`);
      await settle();
      expect(f.requests).toHaveLength(1);
      // Seq 3 is pushed meanwhile: held, not taken before the older answer.
      expect(f.wakeUps.applyPushed(f.push(5, [event(3)]))).toBe(true);
      expect(f.mirror.lastSeq).toBe(1);
      release();
      await caughtUp;
      await settle();
      expect(f.mirror.eventsAfter(0).map((e) => e.seq)).toEqual([1, 2, 3]);
      expect(f.mirror.summary?.last_seq).toBe(3);
      expect(f.mirror.pushed).toEqual({ holder: HOLDER, update: 5 });
      expect(f.requests).toHaveLength(1);
      // A push of an older update that arrives late changes nothing.
      f.wakeUps.applyPushed(f.push(4, [event(2)]));
      expect(f.mirror.summary?.last_seq).toBe(3);
      expect(f.mirror.pushed).toEqual({ holder: HOLDER, update: 5 });
      expect(f.wakeUps.counts).toMatchObject({ pushes_deferred: 1, pushes_stale: 1 });
    } finally {
      f.close();
    }
  });
});
