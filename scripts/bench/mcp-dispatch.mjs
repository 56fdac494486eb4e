#!/usr/bin/env node
/**
 * One-off measurement (not a test, not part of `npm run bench`): what one long-polling
 * `tools/call observe_coding_agent` costs the Server's CPU and memory in the MCP dispatch layer with many
 * requests parked at once, for three paths: `PostMux` + the v1 SDK's one low-level `Server` (before the
 * move), `PostMux` + one long-lived v2 `Server` per era (what packages/server/src/mcp/http.ts does now),
 * and the v2 SDK's own path (`createMcpHandler` of `@modelcontextprotocol/server` over
 * `@hono/node-server`, one v2 `Server` per request from the factory). CPU per request with nothing
 * parked, every path in one process: suites/dispatch.mjs (`npm run bench -- --only dispatch`).
 *
 * Both servers run the same trivial handler: it parks until woken, then answers a small
 * observe-shaped result — so what differs is only the dispatch path (request intake, JSON-RPC
 * routing, per-request objects, response). The fan-out case: CONCURRENT requests park at once,
 * all are woken together, ROUNDS times. The server runs in a child process; its CPU
 * (process.cpuUsage, user + system) per request and the wake → last answer time are reported,
 * for a 2025-era body and a 2026-07-28 body.
 *
 *   npm run build && node scripts/bench/mcp-dispatch.mjs [--concurrent 1000] [--rounds 8]
 */
import { fork } from "node:child_process";
import http from "node:http";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const SELF = fileURLToPath(import.meta.url);
const RESULT = {
  content: [{ type: "text", text: '{"run_id":"wc_agent_run_x","state":"running","events":[]}' }],
  structuredContent: { run_id: "wc_agent_run_x", state: "running", events: [] },
};

async function serve(mode) {
  const waiting = new Set();
  const park = () => new Promise((resolve) => waiting.add(resolve));
  let listener;
  if (mode === "v1-postmux") {
    const { Server } = await import("@modelcontextprotocol/sdk/server/index.js");
    const { CallToolRequestSchema } = await import("@modelcontextprotocol/sdk/types.js");
    const { PostMux, readMcpPost } = await import("../../packages/server/dist/mcp/post.js");
    const mux = new PostMux();
    const server = new Server({ name: "bench", version: "0" }, { capabilities: { tools: {} } });
    server.setRequestHandler(CallToolRequestSchema, async (_request, extra) => {
      mux.context(extra.requestId);
      await park();
      return RESULT;
    });
    await server.connect(mux);
    listener = async (req, res) => {
      const post = await readMcpPost(req, res, 1024 * 1024);
      if (post === null) return;
      if (post.request === null) return void res.writeHead(202).end();
      mux.deliver(res, post.message, {});
    };
  } else if (mode === "v2-postmux") {
    const { Server, SUPPORTED_PROTOCOL_VERSIONS } = await import("@modelcontextprotocol/server");
    const { PostMux, readMcpPost } = await import("../../packages/server/dist/mcp/post.js");
    const muxes = { legacy: new PostMux(), modern: new PostMux({ era: "modern", revision: "2026-07-28" }) };
    for (const kind of ["legacy", "modern"]) {
      const server = new Server(
        { name: "bench", version: "0" },
        {
          capabilities: { tools: {} },
          ...(kind === "modern" ? { supportedProtocolVersions: [...SUPPORTED_PROTOCOL_VERSIONS, "2026-07-28"] } : {}),
        },
      );
      server.setRequestHandler("tools/call", async (_request, ctx) => {
        muxes[kind].context(ctx.mcpReq.id);
        await park();
        return RESULT;
      });
      await server.connect(muxes[kind]);
    }
    listener = async (req, res) => {
      const post = await readMcpPost(req, res, 1024 * 1024);
      if (post === null) return;
      if (post.request === null) return void res.writeHead(202).end();
      muxes[post.era.kind].deliver(res, post.message, {});
    };
  } else {
    const { createMcpHandler, Server } = await import("@modelcontextprotocol/server");
    const { getRequestListener } = await import("@hono/node-server");
    const handler = createMcpHandler(() => {
      const server = new Server({ name: "bench", version: "0" }, { capabilities: { tools: {} } });
      server.setRequestHandler("tools/call", async () => {
        await park();
        return RESULT;
      });
      server.setRequestHandler("tools/list", () => ({ tools: [] }));
      return server;
    });
    listener = getRequestListener((request) => handler.fetch(request));
  }
  const httpServer = http.createServer(listener);
  httpServer.keepAliveTimeout = 60_000;
  httpServer.listen(0, "127.0.0.1", () => process.send({ port: httpServer.address().port }));
  process.on("message", (m) => {
    if (m === "parked") process.send({ parked: waiting.size });
    else if (m === "wake") {
      const all = [...waiting];
      waiting.clear();
      for (const w of all) w();
    } else if (m === "cpu") {
      const u = process.cpuUsage();
      process.send({ cpu: u.user + u.system, rss: process.memoryUsage().rss });
    } else if (m === "exit") process.exit(0);
  });
}

function body(era, id) {
  const params = { name: "observe_coding_agent", arguments: { run_id: "wc_agent_run_x", wait_secs: 30 } };
  if (era === "2026-07-28") {
    params._meta = {
      "io.modelcontextprotocol/protocolVersion": "2026-07-28",
      "io.modelcontextprotocol/clientInfo": { name: "bench", version: "0" },
      "io.modelcontextprotocol/clientCapabilities": {},
    };
  }
  return JSON.stringify({ jsonrpc: "2.0", id, method: "tools/call", params });
}

function headers(era) {
  const h = { Accept: "application/json, text/event-stream", "Content-Type": "application/json" };
  if (era === "2026-07-28") {
    Object.assign(h, {
      "MCP-Protocol-Version": era,
      "Mcp-Method": "tools/call",
      "Mcp-Name": "observe_coding_agent",
    });
  } else h["MCP-Protocol-Version"] = era;
  return h;
}

function post(agent, port, era, id) {
  return new Promise((resolve, reject) => {
    const data = body(era, id);
    const req = http.request(
      {
        host: "127.0.0.1",
        port,
        path: "/mcp",
        method: "POST",
        agent,
        headers: { ...headers(era), "Content-Length": Buffer.byteLength(data) },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c) => {
          text += c;
        });
        res.on("end", () => {
          if (res.statusCode !== 200 || !text.includes("wc_agent_run_x"))
            reject(new Error(`${res.statusCode} ${text.slice(0, 300)}`));
          else resolve(performance.now());
        });
      },
    );
    req.on("error", reject);
    req.end(data);
  });
}

async function measure(mode, era, concurrent, rounds) {
  const child = fork(SELF, ["--serve", mode], { execArgv: ["--max-semi-space-size=4"] });
  const ask = (m, key) =>
    new Promise((resolve) => {
      const on = (r) => {
        if (key in r) {
          child.off("message", on);
          resolve(r);
        }
      };
      child.on("message", on);
      if (m !== null) child.send(m);
    });
  const { port } = await ask(null, "port");
  const agent = new http.Agent({ keepAlive: true, maxSockets: concurrent });
  const perRequestUs = [];
  const wakeMs = [];
  let rss = 0;
  let id = 0;
  for (let round = 0; round < rounds + 1; round++) {
    const before = await ask("cpu", "cpu");
    const answers = Array.from({ length: concurrent }, () => post(agent, port, era, ++id));
    for (;;) {
      const { parked } = await ask("parked", "parked");
      if (parked >= concurrent) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    const woke = performance.now();
    child.send("wake");
    const done = await Promise.all(answers);
    const after = await ask("cpu", "cpu");
    rss = Math.max(rss, after.rss);
    // Round 0 warms up (JIT, sockets); it is not counted.
    if (round === 0) continue;
    perRequestUs.push((after.cpu - before.cpu) / concurrent);
    wakeMs.push(Math.max(...done) - woke);
  }
  agent.destroy();
  child.send("exit");
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  return { mode, era, cpuUsPerRequest: median(perRequestUs), wakeToLastMs: median(wakeMs), peakRssMb: rss / 2 ** 20 };
}

const { values } = parseArgs({
  options: {
    serve: { type: "string" },
    concurrent: { type: "string", default: "1000" },
    rounds: { type: "string", default: "8" },
  },
});
if (values.serve) await serve(values.serve);
else {
  const concurrent = Number(values.concurrent);
  const rounds = Number(values.rounds);
  const rows = [];
  for (const era of ["2025-11-25", "2026-07-28"]) {
    for (const mode of ["v1-postmux", "v2-postmux", "v2-createMcpHandler"]) {
      const r = await measure(mode, era, concurrent, rounds);
      rows.push(r);
      console.log(
        `${era} ${mode.padEnd(20)} CPU ${r.cpuUsPerRequest.toFixed(0).padStart(5)} µs/request  wake→last ${r.wakeToLastMs.toFixed(1).padStart(7)} ms  peak RSS ${r.peakRssMb.toFixed(0)} MB`,
      );
    }
  }
  console.log(JSON.stringify({ concurrent, rounds, rows }));
}
