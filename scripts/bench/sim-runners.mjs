#!/usr/bin/env node
/**
 * N lightweight simulated Runners in one process, speaking the real
 * Server<->Runner protocol (@webcodex/protocol frames) over real WebSockets.
 * Each admits every run.start, then pushes one run.update with one
 * agent_message event every interval_ms, whose text carries the emit time
 * (`fanout <hr_ms>`), so observers can compute emit → visible latency.
 *
 *   node sim-runners.mjs SPEC.json
 * SPEC: { url, interval_ms, max_duration_ms, connect_concurrency?, runners: [{ runner_id, token, project_id, url? }] }
 * `connect_concurrency`: at most this many runners between opening their socket and their hello.ack
 * (default: all at once). A runner's own `url` overrides `url` (runners split across Server instances).
 * Prints one JSON line {"ready":true, runners, hello_ms, elapsed_ms, acked_per_s, rss_mb} once every
 * hello is acknowledged: `hello_ms` summarizes socket open requested → hello.ack per runner, `elapsed_ms`
 * is the first connect → the last hello.ack.
 */
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { encodeFrame, PROTOCOL_VERSION, parseServerFrame } from "@webcodex/protocol";
import WebSocket from "ws";
import { hrNow, summarize } from "./lib/stats.mjs";

const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
const instanceId = () => randomBytes(16).toString("base64url");
const RING = 1000;
let framesSent = 0;
let stopping = false;

function summary(run) {
  const now = new Date().toISOString();
  const terminal = run.state !== "running";
  return {
    run_id: run.run_id,
    intent_fingerprint: run.intent_fingerprint,
    project_id: run.project_id,
    provider_id: run.provider_id,
    provider_instance_id: run.provider_instance_id,
    agent_instance_id: run.agent_instance_id,
    phase: terminal ? "terminal" : "dispatch_barrier",
    state: run.state,
    execution_state: terminal ? "completed" : "started",
    stop_reason: terminal ? (run.state === "cancelled" ? "cancelled" : "end_turn") : null,
    failure_kind: null,
    recovery_kind: "none",
    message: null,
    effective_config: [],
    ignored_updates: 0,
    last_seq: run.seq,
    oldest_seq: run.events[0]?.seq ?? run.seq + 1,
    created_at: run.created_at,
    updated_at: now,
  };
}

function startRunner(def) {
  const connectStartedAt = hrNow();
  const agentInstanceId = instanceId();
  const providerInstanceId = instanceId();
  const runs = new Map();
  const ws = new WebSocket(def.url ?? spec.url, {
    headers: { Authorization: `Bearer ${def.token}` },
    perMessageDeflate: false,
  });
  const send = (frame) => {
    if (ws.readyState !== WebSocket.OPEN) return;
    ws.send(encodeFrame(frame));
    framesSent++;
  };
  const push = (run) => {
    if (stopping) return;
    run.seq++;
    const event = {
      seq: run.seq,
      at: new Date().toISOString(),
      kind: "agent_message",
      text: `fanout ${hrNow().toFixed(3)}`,
      truncated: false,
    };
    run.events.push(event);
    if (run.events.length > RING) run.events.shift();
    send({ type: "run.update", run: summary(run), events: [event] });
  };
  const ready = new Promise((resolve, reject) => {
    ws.on("open", () => {
      send({
        type: "hello",
        protocol_version: PROTOCOL_VERSION,
        agent_instance_id: agentInstanceId,
        store_id: instanceId(),
        capabilities: { coding_agent_run: { max_concurrent_runs: 64 } },
        providers: [
          {
            provider_id: "sim",
            provider_instance_id: providerInstanceId,
            name: "Simulated",
            allowed_config_options: [],
          },
        ],
        projects: [{ project_id: def.project_id, allow_patch: true }],
        inventory: [],
      });
    });
    ws.on("error", reject);
    ws.on("close", (code) => reject(new Error(`runner ${def.runner_id} closed (${code})`)));
    ws.on("message", (data) => {
      const parsed = parseServerFrame(data.toString("utf8"));
      if (!parsed.ok) return;
      const frame = parsed.frame;
      switch (frame.type) {
        case "hello.ack":
          resolve(hrNow() - connectStartedAt);
          return;
        case "run.start": {
          let run = runs.get(frame.run_id);
          const created = !run;
          if (!run) {
            run = {
              ...frame,
              state: "running",
              seq: 0,
              events: [],
              created_at: new Date().toISOString(),
              timer: null,
            };
            runs.set(frame.run_id, run);
            const r = run;
            const phase = Math.random() * spec.interval_ms;
            setTimeout(() => {
              if (r.state === "running") r.timer = setInterval(() => push(r), spec.interval_ms);
            }, phase);
          }
          send({ type: "run.start.result", request_id: frame.request_id, run: summary(run), created });
          return;
        }
        case "run.sync": {
          const run = runs.get(frame.run_id);
          if (!run) {
            send({ type: "error", request_id: frame.request_id, code: "not_found", message: "unknown run" });
            return;
          }
          const events = run.events.filter((e) => e.seq > frame.after_seq).slice(0, frame.max_events);
          const last = events.at(-1)?.seq ?? frame.after_seq;
          send({
            type: "run.sync.result",
            request_id: frame.request_id,
            run: summary(run),
            events,
            has_more: last < run.seq,
          });
          return;
        }
        case "run.cancel": {
          const run = runs.get(frame.run_id);
          if (!run) {
            send({ type: "error", request_id: frame.request_id, code: "not_found", message: "unknown run" });
            return;
          }
          const already = run.state !== "running";
          if (!already) {
            run.state = "cancelled";
            clearInterval(run.timer);
            run.timer = null;
          }
          send({
            type: "run.cancel.result",
            request_id: frame.request_id,
            run: summary(run),
            cancel_requested: !already,
            already_terminal: already,
          });
          if (!already) send({ type: "run.update", run: summary(run), events: [] });
          return;
        }
        default:
          return;
      }
    });
  });
  return { ws, runs, ready };
}

const CONNECT_CONCURRENCY = spec.connect_concurrency ?? spec.runners.length;
if (!Number.isInteger(CONNECT_CONCURRENCY) || CONNECT_CONCURRENCY < 1) {
  throw new Error(`spec.connect_concurrency: expected a positive integer, got ${spec.connect_concurrency}`);
}
const runners = [];
const helloMs = [];
const connectStart = hrNow();
/** Opens the runners in order, at most CONNECT_CONCURRENCY between open and hello.ack at once. */
async function connectAll() {
  let next = 0;
  const lane = async () => {
    while (next < spec.runners.length && !stopping) {
      const r = startRunner(spec.runners[next++]);
      runners.push(r);
      helloMs.push(await r.ready);
    }
  };
  await Promise.all(Array.from({ length: Math.min(CONNECT_CONCURRENCY, spec.runners.length) }, lane));
}
const stop = () => {
  if (stopping) return;
  stopping = true;
  const open = runners.filter((r) => r.ws.readyState === WebSocket.OPEN).length;
  for (const r of runners) {
    for (const run of r.runs.values()) clearInterval(run.timer);
    r.ws.terminate();
  }
  process.stdout.write(`${JSON.stringify({ stopped: true, frames_sent: framesSent, open_at_stop: open })}\n`);
  setTimeout(() => process.exit(0), 50);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
setTimeout(stop, spec.max_duration_ms ?? 300_000).unref();

try {
  await connectAll();
  const elapsedMs = hrNow() - connectStart;
  process.stdout.write(
    `${JSON.stringify({
      ready: true,
      runners: runners.length,
      connect_concurrency: CONNECT_CONCURRENCY,
      hello_ms: summarize(helloMs),
      elapsed_ms: elapsedMs,
      acked_per_s: runners.length / (elapsedMs / 1000),
      rss_mb: process.memoryUsage.rss() / 1048576,
    })}\n`,
  );
} catch (error) {
  process.stdout.write(`${JSON.stringify({ ready: false, error: String(error?.message ?? error) })}\n`);
  process.exit(1);
}
