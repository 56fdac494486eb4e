#!/usr/bin/env node
/**
 * The fan-out's floor (issue 45): a bare `node:http` long-poll server with the same event flow and the same
 * answer bodies as the Server's observe, and none of what is ours — no MCP SDK, no authority, no
 * observation-token MAC, no database, no mirror beyond an array per run. The bench's own load generators
 * drive it unchanged: the simulated Runners (sim-runners.mjs) link over a WebSocket at /runner (hello →
 * hello.ack, run.start, run.update, run.cancel; frames as the protocol spells them, read with JSON.parse),
 * the observers (observers.mjs, lean client) POST the same JSON-RPC bodies to /mcp. So `ours / floor` of a
 * fan-out cell is what the Server adds on top of one HTTP long-poll per observer on this machine.
 *
 * Per observe: JSON.parse of the request, the events after the caller's cursor, one JSON.stringify of the
 * tool result (`structuredContent` plus the same JSON as one text block, as the Server answers), one write.
 * Every observe waiting on a run is answered when one of its updates arrives, each with its own body.
 *
 *   node floor-server.mjs   → prints {"ready":true,"port":P} once listening on 127.0.0.1
 */
import { randomBytes } from "node:crypto";
import http from "node:http";
import { WebSocketServer } from "ws";

/** Bound on one request body (the observers' are a few hundred bytes). */
const MAX_BODY_BYTES = 64 * 1024;
/** Events kept per run (the simulated Runner's ring holds as many). */
const RING = 1000;
/** Events in one observe answer at most (the Server's MAX_EVENTS_PER_OBSERVE is larger; a wake-up brings one). */
const MAX_EVENTS_PER_ANSWER = 200;
/** How long a start or a cancel waits for the simulated Runner's answer. */
const RUNNER_REQUEST_TIMEOUT_MS = 30_000;
/** The longest wait an observe may ask for (the Server's MAX_OBSERVE_WAIT_SECS). */
const MAX_WAIT_SECS = 60;
/** Stands in for the observation token's MAC: the same length as the Server's 20-byte HMAC in base64url. */
const MAC_FILLER = "A".repeat(27);
const TOKEN_PREFIX = "wcobs1.";

const BASE32 = "abcdefghijklmnopqrstuvwxyz234567";
const base32 = (n) => Array.from(randomBytes(n), (b) => BASE32[b & 31]).join("");
const randomId = (bytes) => randomBytes(bytes).toString("base64url");

const serverInstanceId = randomId(16);
/** project_id → { ws, agent_instance_id, provider_instance_id } */
const runnersByProject = new Map();
/** run_id → { runner, summary, events: [], waiters: Set } */
const runs = new Map();
/** request_id → resolve */
const pending = new Map();
let nextRequest = 1;

function requestRunner(runner, frame) {
  const request_id = `f${nextRequest++}`;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      pending.delete(request_id);
      reject(new Error(`${frame.type}: no answer within ${RUNNER_REQUEST_TIMEOUT_MS} ms`));
    }, RUNNER_REQUEST_TIMEOUT_MS);
    pending.set(request_id, (answer) => {
      clearTimeout(timer);
      resolve(answer);
    });
    runner.ws.send(JSON.stringify({ ...frame, request_id }));
  });
}

function onRunnerFrame(ws, text) {
  let frame;
  try {
    frame = JSON.parse(text);
  } catch {
    return;
  }
  switch (frame.type) {
    case "hello": {
      const runner = {
        ws,
        agent_instance_id: frame.agent_instance_id,
        provider_instance_id: frame.providers?.[0]?.provider_instance_id,
      };
      for (const p of frame.projects ?? []) runnersByProject.set(p.project_id, runner);
      ws.send(
        JSON.stringify({
          type: "hello.ack",
          runner_id: "floor",
          server_instance_id: serverInstanceId,
          heartbeat_interval_ms: 600_000,
          resume_secret: randomId(32),
        }),
      );
      return;
    }
    case "run.update": {
      const run = runs.get(frame.run?.run_id);
      if (!run) return;
      run.summary = frame.run;
      for (const e of frame.events ?? []) {
        run.events.push(e);
        if (run.events.length > RING) run.events.shift();
      }
      if (run.waiters.size === 0) return;
      const waiters = [...run.waiters];
      run.waiters.clear();
      for (const w of waiters) {
        clearTimeout(w.timer);
        answerObserve(w.res, w.id, run, w.after);
      }
      return;
    }
    default: {
      const resolve = frame.request_id === undefined ? undefined : pending.get(frame.request_id);
      if (resolve) {
        pending.delete(frame.request_id);
        resolve(frame);
      }
    }
  }
}

function tokenFor(instance, seq) {
  return `${TOKEN_PREFIX}${Buffer.from(`${instance}.${seq}`, "utf8").toString("base64url")}.${MAC_FILLER}`;
}

/** The seq a token points at, or null when it is not one of ours. */
function seqOf(token) {
  if (typeof token !== "string" || !token.startsWith(TOKEN_PREFIX)) return null;
  const body = token.slice(TOKEN_PREFIX.length).split(".")[0] ?? "";
  const m = /\.(\d+)$/.exec(Buffer.from(body, "base64url").toString("utf8"));
  return m ? Number(m[1]) : null;
}

function send(res, status, message) {
  const body = message === undefined ? "" : JSON.stringify(message);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
  res.end(body);
}

function toolResult(res, id, value, isError = false) {
  send(res, 200, {
    result: {
      content: [{ type: "text", text: JSON.stringify(value) }],
      ...(isError ? { isError: true } : { structuredContent: value }),
    },
    jsonrpc: "2.0",
    id,
  });
}

/** The observe answer: the same fields the Server's observe gives a running run. */
function answerObserve(res, id, run, after) {
  const s = run.summary;
  // Seqs are contiguous in the ring (as in the Server's mirror): the first one after `after` by index.
  const first = run.events[0]?.seq ?? after + 1;
  const start = Math.max(0, after + 1 - first);
  const events = run.events.slice(start, start + MAX_EVENTS_PER_ANSWER);
  const last = events.at(-1)?.seq ?? after;
  const out = {
    run_id: s.run_id,
    state: s.state,
    execution_state: s.execution_state,
    recovery_kind: s.recovery_kind,
    events,
    observation_token: tokenFor(run.runner.agent_instance_id, last),
    history_lost: false,
    has_more: last < s.last_seq,
    effective_config: s.effective_config ?? [],
  };
  if (s.stop_reason) out.stop_reason = s.stop_reason;
  out.started_at = s.created_at;
  if (s.state !== "running") out.ended_at = s.updated_at;
  toolResult(res, id, out);
}

async function onTool(res, id, name, args) {
  switch (name) {
    case "start_coding_agent": {
      const runner = runnersByProject.get(args.project_id);
      if (!runner) return toolResult(res, id, { error: { code: "not_found", message: "no runner" } }, true);
      const run_id = `wc_agent_run_${base32(26)}`;
      const answer = await requestRunner(runner, {
        type: "run.start",
        run_id,
        intent_fingerprint: randomBytes(32).toString("hex"),
        project_id: args.project_id,
        provider_id: args.provider_id,
        agent_instance_id: runner.agent_instance_id,
        provider_instance_id: runner.provider_instance_id,
        prompt: args.prompt,
        config: {},
        timeout_secs: null,
      });
      runs.set(run_id, { runner, summary: answer.run, events: [], waiters: new Set() });
      return toolResult(res, id, { run_id, state: answer.run.state, created: true });
    }
    case "cancel_coding_agent": {
      const run = runs.get(args.run_id);
      if (!run) return toolResult(res, id, { error: { code: "not_found", message: "no run" } }, true);
      const answer = await requestRunner(run.runner, { type: "run.cancel", run_id: args.run_id });
      run.summary = answer.run ?? run.summary;
      return toolResult(res, id, { run_id: args.run_id, cancel_requested: answer.cancel_requested === true });
    }
    case "observe_coding_agent": {
      const run = runs.get(args.run_id);
      if (!run) return toolResult(res, id, { error: { code: "not_found", message: "no run" } }, true);
      const token = args.after_observation_token;
      const seq = token === undefined ? 0 : seqOf(token);
      if (seq === null) {
        return toolResult(res, id, { error: { code: "invalid_observation_token", message: "bad token" } }, true);
      }
      const waitMs = Math.min(Number(args.wait_secs ?? 0), MAX_WAIT_SECS) * 1000;
      const newer = run.events.length > 0 && run.events.at(-1).seq > seq;
      if (token === undefined || newer || waitMs <= 0 || run.summary.state !== "running") {
        return answerObserve(res, id, run, seq);
      }
      const waiter = { res, id, after: seq, timer: null };
      waiter.timer = setTimeout(() => {
        run.waiters.delete(waiter);
        answerObserve(res, id, run, seq);
      }, waitMs);
      run.waiters.add(waiter);
      res.on("close", () => {
        if (!res.writableEnded) {
          clearTimeout(waiter.timer);
          run.waiters.delete(waiter);
        }
      });
      return;
    }
    default:
      return send(res, 200, { jsonrpc: "2.0", id, error: { code: -32602, message: `unknown tool ${name}` } });
  }
}

function onMcp(res, message) {
  const { id, method, params } = message ?? {};
  if (typeof method === "string" && method.startsWith("notifications/")) {
    res.writeHead(202).end();
    return;
  }
  switch (method) {
    case "initialize":
      return send(res, 200, {
        result: {
          protocolVersion: params?.protocolVersion,
          capabilities: { tools: {} },
          serverInfo: { name: "bench-floor", version: "0.0.0" },
        },
        jsonrpc: "2.0",
        id,
      });
    case "tools/call":
      return onTool(res, id, params?.name, params?.arguments ?? {}).catch((error) =>
        send(res, 500, { jsonrpc: "2.0", id, error: { code: -32603, message: String(error?.message ?? error) } }),
      );
    default:
      return send(res, 200, { jsonrpc: "2.0", id, error: { code: -32601, message: `unknown method ${method}` } });
  }
}

const server = http.createServer((req, res) => {
  if (req.method !== "POST" || req.url !== "/mcp") return send(res, 404);
  const chunks = [];
  let size = 0;
  req.on("data", (chunk) => {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) {
      send(res, 413);
      req.destroy();
      return;
    }
    chunks.push(chunk);
  });
  req.on("end", () => {
    if (res.writableEnded) return;
    let message;
    try {
      message = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch {
      return send(res, 400, { jsonrpc: "2.0", id: null, error: { code: -32700, message: "Parse error" } });
    }
    void onMcp(res, message);
  });
});
// The Server's own bounds on idle keep-alive sockets do not matter here: the observers keep theirs busy.
server.keepAliveTimeout = 60_000;
server.headersTimeout = 65_000;
server.requestTimeout = 0;

const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });
server.on("upgrade", (req, socket, head) => {
  if (req.url !== "/runner") {
    socket.destroy();
    return;
  }
  wss.handleUpgrade(req, socket, head, (ws) => ws.on("message", (data) => onRunnerFrame(ws, data.toString("utf8"))));
});

server.listen(0, "127.0.0.1", () => {
  process.stdout.write(`${JSON.stringify({ ready: true, port: server.address().port })}\n`);
});
const stop = () => {
  for (const ws of wss.clients) ws.terminate();
  server.closeAllConnections();
  server.close(() => process.exit(0));
  setTimeout(() => process.exit(0), 1000).unref();
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
