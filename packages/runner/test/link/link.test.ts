/**
 * The Runner's link against the real in-process Server (real ws, real SQLite
 * in a temp dir), driving an in-memory RunService.
 */
import { afterEach, describe, expect, it } from "vitest";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { FakeRunService, msg } from "../../../server/test/support/fake-run-service.js";
import { alice, Harness } from "../../../server/test/support/in-process.js";
import { chunkUpdate, startLink } from "../../src/link/link.js";

/** Bound on the link reconnecting to a restarted in-process Server, its backoff included. */
const RECONNECT_WAIT_MS = 10_000;

const R1 = { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] };

function start(h: Harness, key: string) {
  return h.server.runs.start(alice, { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "p" });
}

describe("runner link", () => {
  let h: Harness;
  afterEach(async () => {
    await h.close();
  });

  it("keeps retrying with backoff on a refused token and never logs the token", async () => {
    h = await new Harness().start([R1]);
    const secret = canary("runner-token");
    const link = startLink({
      url: h.wsUrl(),
      token: secret,
      service: new FakeRunService(),
      logger: h.log.logger,
      backoffInitialMs: 20,
      backoffMaxMs: 50,
    });
    try {
      await poll(() => h.log.lines.filter((l) => l.includes("server refused the runner link")).length >= 2, {
        timeoutMs: IN_PROCESS_WAIT_MS,
        intervalMs: IN_PROCESS_POLL_MS,
      });
      expect(link.connected).toBe(false);
      expect(h.log.lines.join("")).not.toContain(secret);
    } finally {
      await link.close();
    }
  });

  it("reconnects after the Server restarts and says hello again", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const link = h.link(svc, R1.token);
    await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    const hellos = () => h.log.lines.filter((l) => l.includes("runner hello accepted")).length;
    expect(hellos()).toBe(1);
    await h.restartServer();
    await poll(() => hellos() >= 2 && link.connected, { timeoutMs: RECONNECT_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    expect((await h.server.runs.listProjects(alice)).find((p) => p.project_id === "demo")?.runner_online).toBe(true);
  });

  it("stops pushing a run when the send queue is full and lets the Server re-sync by seq", async () => {
    h = await new Harness().start([R1]);
    const svc = new FakeRunService();
    const link = startLink({
      url: h.wsUrl(),
      token: R1.token,
      service: svc,
      logger: h.log.logger,
      sendQueueMaxFrames: 2,
    });
    try {
      await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
      await poll(async () => (await h.server.runs.listProjects(alice))[0]?.runner_online, {
        timeoutMs: IN_PROCESS_WAIT_MS,
        intervalMs: IN_PROCESS_POLL_MS,
      });
      const r = await start(h, "flood");
      if (!r.ok) throw new Error(r.error.message);
      let syncs = 0;
      const sync = svc.sync.bind(svc);
      svc.sync = (...args) => {
        syncs++;
        return sync(...args);
      };
      for (let i = 0; i < 50; i++) svc.emit(r.value.run_id, [msg(`m${i}`)]);
      // The queue filled and the link stopped pushing this run's updates ...
      expect(h.log.lines.some((l) => l.includes("send queue full; run updates paused"))).toBe(true);
      svc.finish(r.value.run_id);
      let token = r.value.observation_token;
      const seen: number[] = [];
      while (seen.length < 51) {
        const o = await h.server.runs.observe(alice, {
          run_id: r.value.run_id,
          after_observation_token: token,
          wait_secs: 5,
        });
        if (!o.ok) throw new Error(o.error.message);
        seen.push(...o.value.events.map((e) => e.seq));
        token = o.value.observation_token;
        if (o.value.events.length === 0 && o.value.state === "completed" && seen.length < 51) break;
      }
      expect(seen).toEqual(Array.from({ length: 51 }, (_, i) => i + 1));
      // ... so the Server got what it missed by run.sync, not by pushes.
      expect(syncs).toBeGreaterThan(0);
    } finally {
      await link.close();
    }
  });

  it("splits large updates into bounded frames", () => {
    const svc = new FakeRunService();
    void svc;
    const events = Array.from({ length: 600 }, (_, i) => ({
      seq: i + 1,
      at: "t",
      kind: "agent_message" as const,
      text: "x",
      truncated: false,
    }));
    const frames = chunkUpdate({} as never, events);
    expect(frames.length).toBe(3);
    expect(frames.every((f) => f.type === "run.update" && f.events.length <= 256)).toBe(true);
  });
});
