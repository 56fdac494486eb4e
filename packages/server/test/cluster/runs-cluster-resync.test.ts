/**
 * A Server instance on a shared PostgreSQL state follows runs whose Runner another instance holds: a
 * notification starts a catch-up of the mirror an observer waits on (cluster/following.ts `onRunChanged`). When that
 * catch-up fails on the state database (its pool queue full: StateBusyError), the instance logs it and keeps
 * serving; an unhandled rejection would end the whole process (Node's default), as the cluster fan-out bench
 * showed under load.
 */
import { randomBytes } from "node:crypto";
import type { RunSummary } from "@webcodex/protocol";
import pino from "pino";
import { describe, expect, it } from "vitest";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { WakeUps } from "../../src/cluster/wake-ups.js";
import type { Registry } from "../../src/link/registry.js";
import { Runs } from "../../src/runs/runs.js";
import { StateBusyError, type StateEngine } from "../../src/state/engine.js";
import type { StateStore } from "../../src/state/store.js";
import { runSummary } from "../support/run-summary.js";

const RUN_ID = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const RUNNER_ID = "r-elsewhere";
const AGENT_INSTANCE = "agent-instance-1";

function summary(): RunSummary {
  return runSummary({
    run_id: RUN_ID,
    project_id: "p",
    provider_instance_id: "provider-instance-1",
    agent_instance_id: AGENT_INSTANCE,
  });
}

describe("following a run changed on another instance", () => {
  it("logs a catch-up that fails on a busy state database instead of ending the process", async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on("unhandledRejection", onUnhandled);
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(line) });
    // The state database refuses every read (its pool's queue is full); the Runner answers the sync.
    const busy = async () => {
      throw new StateBusyError("1000 operations already wait for a PostgreSQL state connection");
    };
    const store = { serverSecret: randomBytes(32), get: busy, peek: busy } as unknown as StateStore;
    const runner = {
      runnerId: RUNNER_ID,
      agentInstanceId: AGENT_INSTANCE,
      conn: {
        closed: false,
        request: async () => ({
          ok: true,
          frame: {
            type: "run.sync.result",
            request_id: "q1",
            run: summary(),
            events: [{ seq: 1, at: new Date().toISOString(), kind: "agent_message", text: "hi", truncated: false }],
            has_more: false,
          },
        }),
      },
    };
    const registry = {
      live: () => undefined,
      lookup: async () => runner,
      lookupRecent: async () => runner,
    } as unknown as Registry;
    let notified: ((payload: string | null) => void) | null = null;
    const engine = {
      dialect: "sqlite",
      listen: async (_channel: string, cb: (payload: string | null) => void) => {
        notified = cb;
        return () => {};
      },
      notify: async () => {},
      notifyAll: async () => {},
    } as unknown as StateEngine;
    const runs = new Runs({ store, registry, logger });
    let wakeUps: WakeUps | null = null;
    try {
      wakeUps = await WakeUps.join(runs.core, engine);
      const mirror = runs.mirrors.getOrCreate(RUN_ID);
      mirror.reset(AGENT_INSTANCE);
      // An observer waits on this instance's mirror: the notification starts a catch-up.
      const waiting = mirror.waitForChange(mirror.version, IN_PROCESS_WAIT_MS);
      expect(notified).not.toBeNull();
      (notified as unknown as (payload: string) => void)(`${RUN_ID} ${RUNNER_ID}`);
      const failure = await poll(
        () => lines.map((l) => JSON.parse(l)).find((l) => l.run_id === RUN_ID && /catch/i.test(l.msg)),
        { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS, what: "the failed catch-up logged" },
      );
      expect(failure).toMatchObject({ run_id: RUN_ID, err: expect.stringContaining("already wait") });
      // Logged, i.e. handled; a turn of the event loop (the poll's) has passed since, where an unhandled
      // rejection would have been reported.
      await new Promise((resolve) => setImmediate(resolve));
      expect(unhandled).toEqual([]);
      mirror.touch();
      await waiting;
    } finally {
      runs.close();
      wakeUps?.close();
      process.off("unhandledRejection", onUnhandled);
    }
  });
});
