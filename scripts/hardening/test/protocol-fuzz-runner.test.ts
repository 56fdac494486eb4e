/**
 * Issue 16 §1, Runner side: a live `webcodex-runner run` child connected to a
 * scripted fake Server. Three kinds of hostile input:
 *  - schema-valid requests that must each be answered with their request_id:
 *    starts with stale fences / unknown projects / unknown providers / bad
 *    configs, syncs and cancels of random run ids, syncs of a real run with
 *    random cursors — ≥ 10k (full) pipelined on one link;
 *  - generated frames the protocol rejects (each on a fresh connection): the
 *    Runner answers `protocol_error`, closes, and reconnects with a fresh hello;
 *  - a valid `run.start` replayed on a second connection: the existing run
 *    comes back (`created: false`) and the prompt is dispatched once.
 * Throughout: the Runner stays up with bounded RSS, a run in progress finishes
 * unharmed, and no run other than the ones we started exists afterwards.
 */
import { createHash } from "node:crypto";
import { base32, parseServerFrame } from "@webcodex/protocol";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeServer, type RunnerConn } from "./support/fake-server.js";
import { hostileFrames } from "./support/hostile-frames.js";
import { rssBytes, seed, size } from "./support/profile.js";
import { RunnerProc } from "./support/runner-proc.js";

/** Schema-valid hostile requests on the live link. */
const REQUESTS = size(10_000, 600);
/** Requests in flight at once (the Runner's link bounds what it holds; we stay under it). */
const PIPELINE = 32;
/** Frames the protocol rejects, each costing one reconnect (≈ 0.5–1 s of the Runner's backoff). */
const CLOSING_FRAMES = size(200, 12);
const RSS_GROWTH_BOUND = 128 * 1024 * 1024;

const runId = (label: string) => `wc_agent_run_${base32(createHash("sha256").update(label).digest()).slice(0, 26)}`;
const fingerprint = (label: string) => createHash("sha256").update(label).digest("hex");

describe("protocol fuzz against a live Runner (fake Server)", () => {
  let server: FakeServer;
  let runner: RunnerProc;

  beforeAll(async () => {
    server = await new FakeServer().start();
    runner = new RunnerProc({ url: server.url, token: server.token });
    runner.start();
    await server.live();
  });

  afterAll(async () => {
    const survivors = await runner?.dispose();
    await server?.close();
    expect(survivors ?? []).toEqual([]);
  });

  function fence(conn: RunnerConn): { agent_instance_id: string; provider_instance_id: string } {
    const hello = conn.hello as {
      agent_instance_id: string;
      providers: Array<{ provider_id: string; provider_instance_id: string }>;
    };
    return {
      agent_instance_id: hello.agent_instance_id,
      provider_instance_id: hello.providers.find((p) => p.provider_id === "fake")!.provider_instance_id,
    };
  }

  function startFrame(conn: RunnerConn, label: string, prompt: string): Record<string, unknown> {
    return {
      type: "run.start",
      run_id: runId(label),
      intent_fingerprint: fingerprint(label),
      project_id: "p1",
      provider_id: "fake",
      ...fence(conn),
      prompt,
      config: {},
      timeout_secs: null,
    };
  }

  async function terminal(label: string): Promise<Record<string, unknown>> {
    for (let i = 0; i < 600; i++) {
      const conn = await server.live();
      const r = await server.request(conn, { type: "run.sync", run_id: runId(label), after_seq: 0, max_events: 0 });
      const run = r.run as { state: string } | undefined;
      if (run && ["completed", "failed", "cancelled", "lost"].includes(run.state)) return run;
      await new Promise((res) => setTimeout(res, 100));
    }
    throw new Error(`run ${label} did not end`);
  }

  it(
    `answers ${REQUESTS} hostile requests, closes on ${CLOSING_FRAMES} bad frames and reconnects, dispatches a replayed start once, and stays up`,
    async () => {
      const s = seed();
      console.log(`protocol fuzz (Runner) seed=${s} requests=${REQUESTS} closing=${CLOSING_FRAMES}`);
      const t0 = Date.now();
      const pid = runner.child!.pid!;
      let conn = await server.live();

      // A real run that completes, and a slow one that must survive all the link churn below.
      expect((await server.request(conn, startFrame(conn, "first", "scenario: hello"))).created).toBe(true);
      expect((await terminal("first")).state).toBe("completed");
      conn = await server.live();
      const slow = await server.request(conn, startFrame(conn, "slow", "scenario: slow interval_ms=100 count=100"));
      expect(slow.created).toBe(true);
      const rssBefore = (await rssBytes(pid))!;
      let rssMax = rssBefore;

      // 1. Schema-valid, semantically hostile requests, pipelined.
      const f = fence(conn);
      const hostileRequest = fc.oneof(
        fc.record({
          type: fc.constant("run.start"),
          run_id: fc.string({ minLength: 1, maxLength: 12 }).map(runId),
          intent_fingerprint: fc.string().map(fingerprint),
          project_id: fc.constantFrom("p1", "nope", "other-project"),
          provider_id: fc.constantFrom("fake", "codex", "x"),
          agent_instance_id: fc.constantFrom(f.agent_instance_id, "stale_agent_instance_0001"),
          provider_instance_id: fc.constantFrom(f.provider_instance_id, "stale_provider_instance_01"),
          prompt: fc.string({ minLength: 1, maxLength: 64 }),
          config: fc.dictionary(
            fc.constantFrom("model", "mode", "x", "__proto__"),
            fc.oneof(fc.string(), fc.boolean()),
            {
              maxKeys: 3,
            },
          ),
          timeout_secs: fc.constantFrom(null, 60),
        }),
        fc.record({
          type: fc.constant("run.sync"),
          run_id: fc.oneof(fc.constant(runId("first")), fc.string({ maxLength: 12 }).map(runId)),
          after_seq: fc.nat({ max: 2 ** 31 }),
          max_events: fc.nat({ max: 1000 }),
        }),
        fc.record({
          type: fc.constant("run.cancel"),
          run_id: fc.oneof(fc.constant(runId("first")), fc.string({ maxLength: 12 }).map(runId)),
        }),
      );
      const requests = fc.sample(hostileRequest, { numRuns: REQUESTS, seed: s }).filter((r) => {
        // A start that would pass every check would be a legitimate new run, not hostile input: keep only
        // the ones with at least one wrong fence, project or provider.
        if (r.type !== "run.start") return true;
        const ok =
          r.project_id === "p1" &&
          r.provider_id === "fake" &&
          r.agent_instance_id === f.agent_instance_id &&
          r.provider_instance_id === f.provider_instance_id;
        return !ok;
      });
      const answers = new Map<string, number>();
      let next = 0;
      await Promise.all(
        Array.from({ length: PIPELINE }, async () => {
          for (;;) {
            const i = next++;
            if (i >= requests.length) return;
            const answer = await server.request(conn, requests[i]!);
            expect(answer.type, `request ${i} (${requests[i]!.type}) answered, not a protocol error`).not.toBe(
              "protocol_error",
            );
            const key = answer.type === "error" ? `error:${String(answer.code)}` : String(answer.type);
            answers.set(key, (answers.get(key) ?? 0) + 1);
            if (i % 500 === 0) rssMax = Math.max(rssMax, (await rssBytes(pid)) ?? Number.POSITIVE_INFINITY);
          }
        }),
      );
      expect(conn.isClosed, "the link survived the valid requests").toBe(false);
      // Cancelling "first" (terminal) is fine; a start never got through.
      expect(answers.get("run.start.result") ?? 0).toBe(0);
      console.log(`protocol fuzz (Runner): answers ${JSON.stringify(Object.fromEntries(answers))}`);

      // 2. Frames the protocol rejects: protocol_error, close, reconnect with a fresh hello.
      const valid = {
        ack: {
          type: "hello.ack",
          runner_id: "fuzzed",
          server_instance_id: "fake_server_instance_01",
          heartbeat_interval_ms: 5000,
          resume_secret: "a".repeat(43),
        },
        start: { ...startFrame(conn, "mutated", "scenario: hello"), request_id: "req-1" },
        sync: { type: "run.sync", request_id: "req-2", run_id: runId("first"), after_seq: 0, max_events: 10 },
        cancel: { type: "run.cancel", request_id: "req-3", run_id: runId("slow") },
        heartbeat: { type: "heartbeat", sent_at: new Date().toISOString() },
      };
      const bad = fc
        .sample(hostileFrames(valid), { numRuns: CLOSING_FRAMES * 4, seed: s + 1 })
        .filter((h) => h.binary || typeof h.data !== "string" || !parseServerFrame(h.data).ok)
        .slice(0, CLOSING_FRAMES);
      expect(bad.length).toBe(CLOSING_FRAMES);
      const closeKinds = new Map<string, number>();
      for (const frame of bad) {
        conn = await server.live();
        conn.ws.send(frame.data, { binary: frame.binary });
        const code = await Promise.race([
          conn.closed,
          new Promise<undefined>((r) => setTimeout(() => r(undefined), 15_000)),
        ]);
        expect(code, `${frame.kind}: the Runner closed the link`).toBeDefined();
        const answered = conn.frames.some((x) => x.type === "protocol_error");
        if (!answered) expect([1009, 1007], `${frame.kind}: closed by ws (code ${code})`).toContain(code);
        const k = answered ? "protocol_error" : `ws_${code}`;
        closeKinds.set(k, (closeKinds.get(k) ?? 0) + 1);
        expect(runner.alive, `the Runner survived ${frame.kind}`).toBe(true);
      }
      rssMax = Math.max(rssMax, (await rssBytes(pid)) ?? Number.POSITIVE_INFINITY);
      console.log(`protocol fuzz (Runner): closes ${JSON.stringify(Object.fromEntries(closeKinds))}`);

      // 3. The slow run survived the link churn, and a start replayed on a new connection is not redispatched.
      expect((await terminal("slow")).state).toBe("completed");
      conn = await server.live();
      const replay = await server.request(conn, startFrame(conn, "first", "scenario: hello"));
      expect(replay.type).toBe("run.start.result");
      expect(replay.created).toBe(false);
      conn.ws.close(1000);
      await conn.closed;
      const again = await server.live();
      expect(again).not.toBe(conn);
      const replay2 = await server.request(again, startFrame(again, "first", "scenario: hello"));
      expect(replay2.created).toBe(false);
      expect(runner.prompts()).toHaveLength(2);

      // No run we did not start exists: the fresh hello's inventory lists exactly ours.
      const inventory = (again.hello as { inventory: Array<{ run_id: string }> }).inventory.map((r) => r.run_id).sort();
      expect(inventory).toEqual([runId("first"), runId("slow")].sort());
      expect(runner.alive).toBe(true);
      expect(rssMax - rssBefore, "Runner RSS growth").toBeLessThan(RSS_GROWTH_BOUND);
      console.log(
        `protocol fuzz (Runner): ${((Date.now() - t0) / 1000).toFixed(1)} s; RSS ${(rssBefore / 2 ** 20).toFixed(0)} → max ${(rssMax / 2 ** 20).toFixed(0)} MiB`,
      );
    },
    18 * 60_000,
  );
});
