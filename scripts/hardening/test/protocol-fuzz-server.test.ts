/**
 * Issue 16 §1, Server side: ≥ 10k (full) generated hostile frames against a
 * live `webcodex-server run` child, sent as fake Runner connections (four
 * configured fuzz runners, own tokens), while a real Runner stays connected on
 * its own project. Oracle: the protocol package's own parser. A frame it
 * rejects must be answered with `protocol_error` and its connection closed
 * (or, for what ws refuses itself — over-size, invalid UTF-8 — closed with
 * 1009/1007); a frame it accepts must get its documented answer. The Server
 * stays up, its RSS bounded, the real Runner's link is never disturbed, and
 * the Server's durable state is byte-for-byte the same afterwards.
 */
import { join } from "node:path";
import { PROTOCOL_VERSION, parseRunnerFrame } from "@webcodex/protocol";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { instanceId } from "../../../packages/server/test/support/fake-run-service.js";
import { okValue, ProcStack } from "../../../packages/server/test/support/proc-stack.js";
// @ts-expect-error plain .mjs scripts without type declarations
import { DAEMON_NODE_FLAGS } from "../../local-stack.mjs";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../test-support/index.js";
import { type HostileFrame, hostileFrames } from "./support/hostile-frames.js";
import { rssBytes, seed, size } from "./support/profile.js";
import { auditRows, changedTables, leaseHolder, stateSnapshot } from "./support/server-state.js";
import { closedWithin, nextFrame, openProbe, type Probe, sendRaw } from "./support/ws-probe.js";

/** Frames sent in total (each on its own connection, most of which the Server closes). */
const FRAMES = size(10_000, 600);
/** Connections in flight at once. */
const LANES = 4;
/** How long one connection may take to be answered or closed. */
const ANSWER_MS = 10_000;
/** Allowed growth of the Server's RSS over the whole fuzz run. */
const RSS_GROWTH_BOUND = 96 * 1024 * 1024;

const FUZZ_RUNNERS = Array.from({ length: LANES }, (_, i) => ({ id: `fz${i}`, projects: [`pf${i}`] }));

describe("protocol fuzz against a live Server (fake Runner connections)", () => {
  let stack: ProcStack;
  let realRunId = "";
  const startedAt = Date.now();

  beforeAll(async () => {
    stack = await new ProcStack({
      server: "child",
      runners: [{ id: "r1", projects: ["p1"] }, ...FUZZ_RUNNERS],
      // The Server as it is deployed (demo, systemd, bench): with its heap cap V8 collects the fuzz's
      // garbage early; without it peak RSS measured when V8 chose to collect, not what the Server keeps.
      serverEnv: { NODE_OPTIONS: DAEMON_NODE_FLAGS.server.join(" ") },
    }).init();
    await stack.startRunner("r1");
    const started = okValue(
      await stack.start("alice", {
        project_id: "p1",
        provider_id: "fake",
        idempotency_key: "fuzz-baseline-run",
        prompt: "scenario: hello",
      }),
    );
    realRunId = started.run_id;
    await poll(
      async () => {
        const o = await stack.observe("alice", { run_id: realRunId });
        return o.ok && o.value.state === "completed";
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the baseline run to complete" },
    );
  }, 120_000);

  afterAll(async () => {
    await stack?.stop();
  });

  function hello(lane: number, resume?: string): Record<string, unknown> {
    return {
      type: "hello",
      protocol_version: PROTOCOL_VERSION,
      agent_instance_id: laneIds[lane]!.agent,
      store_id: laneIds[lane]!.store,
      capabilities: { coding_agent_run: { max_concurrent_runs: 2 } },
      providers: [
        {
          provider_id: "fake",
          provider_instance_id: laneIds[lane]!.provider,
          name: "Fuzz",
          allowed_config_options: [],
        },
      ],
      projects: [{ project_id: `pf${lane}`, allow_patch: true }],
      inventory: [],
      ...(resume ? { resume_secret: resume } : {}),
    };
  }
  const laneIds = FUZZ_RUNNERS.map(() => ({ agent: instanceId(), store: instanceId(), provider: instanceId() }));
  const resumeSecrets: Array<string | undefined> = FUZZ_RUNNERS.map(() => undefined);

  /** Valid frames of every Runner→Server type: mutated by the generator, some sent as they are. */
  function validFrames(): Record<string, Record<string, unknown>> {
    const summary = {
      run_id: realRunId,
      intent_fingerprint: "f".repeat(64),
      project_id: "p1",
      provider_id: "fake",
      provider_instance_id: laneIds[0]!.provider,
      agent_instance_id: laneIds[0]!.agent,
      phase: "terminal",
      state: "failed",
      execution_state: "not_started",
      stop_reason: null,
      failure_kind: "runner_restarted",
      recovery_kind: "none",
      message: "forged by the fuzzer",
      effective_config: [],
      ignored_updates: 0,
      last_seq: 99,
      oldest_seq: 1,
      created_at: new Date().toISOString(),
      updated_at: new Date().toISOString(),
    };
    return {
      hello: hello(0),
      update: { type: "run.update", run: summary, events: [] },
      startResult: { type: "run.start.result", request_id: "req-1", run: summary, created: true },
      error: { type: "error", request_id: "req-2", code: "not_found", message: "no such run" },
      heartbeat: { type: "heartbeat", sent_at: new Date().toISOString() },
      protocolError: { type: "protocol_error", code: "invalid_frame", message: "peer says so" },
    };
  }

  type Outcome = "protocol_error_closed" | "ws_closed" | "answered" | "ignored_open";

  async function fuzzOne(lane: number, frame: HostileFrame, afterHello: boolean): Promise<Outcome> {
    const p: Probe = openProbe(`ws://127.0.0.1:${stack.port}/runner`, {
      authorization: `Bearer ${stack.tokens.get(`fz${lane}`)}`,
    });
    try {
      expect(await p.opened, "the Server accepts the fake Runner's upgrade").toBe(true);
      if (afterHello) {
        p.ws.send(JSON.stringify(hello(lane, resumeSecrets[lane])));
        const ack = await nextFrame(p, (f) => f.type === "hello.ack", ANSWER_MS);
        expect(ack, `hello.ack for lane ${lane}`).toBeDefined();
        resumeSecrets[lane] = ack!.resume_secret as string;
      }
      sendRaw(p.ws, frame.data, frame.binary);
      const parsed = typeof frame.data === "string" && !frame.binary ? parseRunnerFrame(frame.data) : undefined;
      const accepted = parsed?.ok === true ? parsed.frame : undefined;
      if (accepted === undefined) {
        const code = await closedWithin(p, ANSWER_MS);
        expect(code, `${frame.kind}: connection closed`).toBeDefined();
        if (p.frames.some((f) => f.type === "protocol_error")) return "protocol_error_closed";
        // What ws itself refuses before our parser sees it.
        expect([1009, 1007], `${frame.kind}: closed by ws (code ${code})`).toContain(code);
        return "ws_closed";
      }
      if (!afterHello) {
        if (accepted.type === "hello") {
          const answer = await nextFrame(p, (f) => f.type === "hello.ack" || f.type === "protocol_error", ANSWER_MS);
          expect(answer, "a valid first hello is answered").toBeDefined();
          if (answer!.type === "hello.ack") resumeSecrets[lane] = answer!.resume_secret as string;
          return "answered";
        }
        expect(await nextFrame(p, (f) => f.type === "protocol_error", ANSWER_MS)).toBeDefined();
        expect(await closedWithin(p, ANSWER_MS)).toBeDefined();
        return "protocol_error_closed";
      }
      if (accepted.type !== "hello" && accepted.type !== "protocol_error") {
        // Ignored by design: a push for a run this runner does not hold changes nothing, and a response to
        // no pending request is a late answer (its request timed out) — the link stays open and answers
        // the next bad frame.
        p.ws.send("not json {");
        const err = await nextFrame(p, (f) => f.type === "protocol_error", ANSWER_MS);
        expect(err?.code, `${frame.kind}: the link stayed open after a valid ${accepted.type}`).toBe("invalid_json");
        return "ignored_open";
      }
      if (accepted.type === "protocol_error") {
        expect(await closedWithin(p, ANSWER_MS)).toBeDefined();
        return "ws_closed";
      }
      // A second hello on one connection.
      expect(await nextFrame(p, (f) => f.type === "protocol_error", ANSWER_MS), `${frame.kind}`).toBeDefined();
      expect(await closedWithin(p, ANSWER_MS)).toBeDefined();
      return "protocol_error_closed";
    } finally {
      p.ws.terminate();
    }
  }

  it(
    `answers or closes each of ${FRAMES} hostile frames with a protocol error, stays up with bounded memory, and changes nothing`,
    async () => {
      const s = seed();
      console.log(`protocol fuzz (Server) seed=${s} frames=${FRAMES} (WEBCODEX_HARDENING_SEED=${s} reproduces)`);
      const dbFile = join(stack.dir, "server-state", "server.sqlite3");
      const before = stateSnapshot(dbFile);
      const r1LinkRows = auditRows(dbFile, "runner_link_audit", "runner_id = 'r1'").length;
      const r1Holder = leaseHolder(dbFile, "r1");
      expect(r1Holder).not.toBeNull();
      const observedBefore = okValue(await stack.observe("alice", { run_id: realRunId }));
      const pid = stack.serverChild!.pid!;
      const rssBefore = (await rssBytes(pid))!;
      let rssMax = rssBefore;

      const frames = fc.sample(fc.tuple(hostileFrames(validFrames()), fc.boolean()), { numRuns: FRAMES, seed: s });
      const outcomes = new Map<string, number>();
      const kinds = new Map<string, number>();
      let next = 0;
      await Promise.all(
        Array.from({ length: LANES }, async (_, lane) => {
          for (;;) {
            const i = next++;
            if (i >= frames.length) return;
            const [frame, afterHello] = frames[i]!;
            const outcome = await fuzzOne(lane, frame, afterHello);
            outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
            const kind = frame.kind.replace(/:.*/, "");
            kinds.set(kind, (kinds.get(kind) ?? 0) + 1);
            if (i % 250 === 0) {
              const rss = await rssBytes(pid);
              expect(rss, `the Server is alive after ${i} frames`).toBeDefined();
              rssMax = Math.max(rssMax, rss!);
            }
          }
        }),
      );

      // Floods: thousands of frames on one link as fast as the socket takes them, ending in a bad one.
      for (let lane = 0; lane < LANES; lane++) {
        const p = openProbe(`ws://127.0.0.1:${stack.port}/runner`, {
          authorization: `Bearer ${stack.tokens.get(`fz${lane}`)}`,
        });
        expect(await p.opened).toBe(true);
        p.ws.send(JSON.stringify(hello(lane, resumeSecrets[lane])));
        const ack = await nextFrame(p, (f) => f.type === "hello.ack", ANSWER_MS);
        resumeSecrets[lane] = ack!.resume_secret as string;
        const heartbeat = JSON.stringify({ type: "heartbeat", sent_at: new Date().toISOString() });
        const update = JSON.stringify(validFrames().update);
        for (let i = 0; i < size(5_000, 500); i++) p.ws.send(i % 2 === 0 ? heartbeat : update);
        p.ws.send("]]]");
        expect(await closedWithin(p, 30_000), "the flooded link ends with a close").toBeDefined();
        expect(p.frames.some((f) => f.type === "protocol_error")).toBe(true);
      }

      console.log(
        `protocol fuzz (Server): ${FRAMES} frames in ${((Date.now() - startedAt) / 1000).toFixed(1)} s; outcomes ${JSON.stringify(Object.fromEntries(outcomes))}; kinds ${JSON.stringify(Object.fromEntries(kinds))}; RSS ${(rssBefore / 2 ** 20).toFixed(0)} → max ${(rssMax / 2 ** 20).toFixed(0)} MiB`,
      );
      expect(outcomes.get("protocol_error_closed") ?? 0).toBeGreaterThan(FRAMES / 2);
      const rssAfter = await rssBytes(pid);
      expect(rssAfter, "the Server survived").toBeDefined();
      expect(rssMax - rssBefore, "Server RSS growth").toBeLessThan(RSS_GROWTH_BOUND);

      // Nothing durable changed; the forged updates did not touch the real run.
      expect(changedTables(before, stateSnapshot(dbFile))).toEqual([]);
      const observedAfter = okValue(await stack.observe("alice", { run_id: realRunId }));
      expect(observedAfter.state).toBe("completed");
      expect(observedAfter.events.length).toBe(observedBefore.events.length);
      expect(observedAfter.message).toBe(observedBefore.message);

      // The real Runner's link was never replaced or re-granted, and it still runs work.
      expect(auditRows(dbFile, "runner_link_audit", "runner_id = 'r1'").length).toBe(r1LinkRows);
      expect(leaseHolder(dbFile, "r1"), "the real Runner still holds its link lease").toBe(r1Holder);
      const after = okValue(
        await stack.start("alice", {
          project_id: "p1",
          provider_id: "fake",
          idempotency_key: "fuzz-after-run",
          prompt: "scenario: hello",
        }),
      );
      await poll(
        async () => {
          const o = await stack.observe("alice", { run_id: after.run_id });
          return o.ok && o.value.state === "completed";
        },
        { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "a run started after the fuzz to complete" },
      );
      expect(stack.prompts("r1")).toHaveLength(2);
    },
    18 * 60_000,
  );
});
