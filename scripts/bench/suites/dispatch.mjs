/**
 * MCP dispatch: the Server's CPU per `tools/call`, per protocol era, through three dispatch paths served by
 * ONE server process, so every figure is a ratio to the v1 baseline measured in the same process run:
 *
 * - `v1`       — the v1 SDK's low-level `Server` (`@modelcontextprotocol/sdk`) behind `PostMux`
 *                (packages/server/src/mcp/post.ts): how /mcp dispatched both eras before the move (baseline).
 * - `v2`       — what /mcp does now (packages/server/src/mcp/http.ts): two long-lived v2 SDK `Server`s
 *                (`@modelcontextprotocol/server`), one per era (the 2026-07-28 one bound to that revision,
 *                with its cache hints), each behind its own `PostMux`.
 * - `v2-entry` — the v2 SDK's own HTTP entry: `createMcpHandler` over `@hono/node-server`, a v2 `Server`
 *                from the factory per request (the path measured at 3.4–4.5× before the move).
 *
 * All three run the same trivial handler (answer a small observe-shaped result at once), so what differs is
 * only request intake, JSON-RPC dispatch, per-request objects and the response. `v1` and `v2` share the
 * POST intake (`readMcpPost`, the era classifier), as /mcp does. The client (this process) posts N requests
 * with C in flight over keep-alive sockets; the server child reports `process.cpuUsage()` (user + system)
 * around each batch. Rounds alternate the paths (round 0 warms up and is not counted); the median per path
 * and era is reported, with its ratio to `v1`.
 *
 *   npm run build && node scripts/bench/suites/dispatch.mjs [--requests 2000] [--rounds 5] [--paths v1,v2] [--profile DIR]
 *   npm run bench -- --only dispatch
 *
 * `--profile DIR` runs the server child with `node --cpu-prof` (one profile for the whole run, every path);
 * read it with `node scripts/bench/profile-summary.mjs DIR/*.cpuprofile`.
 */
import { fork } from "node:child_process";
import http from "node:http";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const SELF = fileURLToPath(import.meta.url);
const SERVER_DIST = new URL("../../../packages/server/dist/", import.meta.url);
/** The Server's daemon flags (scripts/local-stack.mjs DAEMON_NODE_FLAGS.server). */
const SERVER_NODE_FLAGS = ["--max-semi-space-size=4"];
/** Requests in flight at once, per batch. */
const CONCURRENT = 16;
/** Body bound handed to readMcpPost (the Server's MCP_MAX_BODY_BYTES). */
const MAX_BODY_BYTES = 1024 * 1024;
export const PATHS = ["v1", "v2", "v2-entry"];
export const ERAS = ["2025-11-25", "2026-07-28"];
const MODERN = "2026-07-28";

const RESULT = {
  content: [{ type: "text", text: '{"run_id":"wc_agent_run_x","state":"running","events":[]}' }],
  structuredContent: { run_id: "wc_agent_run_x", state: "running", events: [] },
};
const INFO = { name: "bench", version: "0" };

/** The server child: one node:http server per path, each on its own port. */
async function serve() {
  const { PostMux, readMcpPost } = await import(new URL("mcp/post.js", SERVER_DIST).href);
  const v1 = await import("@modelcontextprotocol/sdk/server/index.js");
  const v1types = await import("@modelcontextprotocol/sdk/types.js");
  const v2 = await import("@modelcontextprotocol/server");
  const { getRequestListener } = await import("@hono/node-server");

  /** The PostMux intake of /mcp: one mux per era, each request answered by its era's mux. */
  const muxListener = (muxes) => async (req, res) => {
    const post = await readMcpPost(req, res, MAX_BODY_BYTES);
    if (post === null) return;
    if (post.request === null) return void res.writeHead(202).end();
    muxes[post.era.kind].deliver(res, post.message, {});
  };

  const listeners = {};
  {
    const mux = new PostMux();
    const server = new v1.Server(INFO, { capabilities: { tools: {} } });
    server.setRequestHandler(v1types.CallToolRequestSchema, async (_request, extra) => {
      mux.context(extra.requestId);
      return RESULT;
    });
    await server.connect(mux);
    listeners.v1 = muxListener({ legacy: mux, modern: mux });
  }
  {
    const muxes = { legacy: new PostMux(), modern: new PostMux({ era: "modern", revision: MODERN }) };
    for (const kind of ["legacy", "modern"]) {
      const server = new v2.Server(INFO, {
        capabilities: { tools: {} },
        ...(kind === "modern"
          ? {
              supportedProtocolVersions: [...v2.SUPPORTED_PROTOCOL_VERSIONS, MODERN],
              cacheHints: { "tools/list": { ttlMs: 300_000, cacheScope: "public" } },
            }
          : {}),
      });
      server.setRequestHandler("tools/call", async (_request, ctx) => {
        muxes[kind].context(ctx.mcpReq.id);
        return RESULT;
      });
      await server.connect(muxes[kind]);
    }
    listeners.v2 = muxListener(muxes);
  }
  {
    const handler = v2.createMcpHandler(() => {
      const server = new v2.Server(INFO, { capabilities: { tools: {} } });
      server.setRequestHandler("tools/call", async () => RESULT);
      return server;
    });
    listeners["v2-entry"] = getRequestListener((request) => handler.fetch(request));
  }

  const ports = {};
  for (const path of PATHS) {
    const server = http.createServer(listeners[path]);
    server.keepAliveTimeout = 60_000;
    await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
    ports[path] = server.address().port;
  }
  process.send({ ports });
  process.on("message", (m) => {
    if (m === "cpu") {
      const u = process.cpuUsage();
      process.send({ cpu: u.user + u.system });
    } else if (m === "exit") process.exit(0);
  });
}

function body(era, id) {
  const params = { name: "observe_coding_agent", arguments: { run_id: "wc_agent_run_x", wait_secs: 0 } };
  if (era === MODERN) {
    params._meta = {
      "io.modelcontextprotocol/protocolVersion": MODERN,
      "io.modelcontextprotocol/clientInfo": INFO,
      "io.modelcontextprotocol/clientCapabilities": {},
    };
  }
  return JSON.stringify({ jsonrpc: "2.0", id, method: "tools/call", params });
}

function headers(era, length) {
  const h = {
    Accept: "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": era,
    "Content-Length": length,
  };
  if (era === MODERN) Object.assign(h, { "Mcp-Method": "tools/call", "Mcp-Name": "observe_coding_agent" });
  return h;
}

function post(agent, port, era, id) {
  const data = body(era, id);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: "127.0.0.1", port, path: "/mcp", method: "POST", agent, headers: headers(era, Buffer.byteLength(data)) },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c) => {
          text += c;
        });
        res.on("end", () => {
          if (res.statusCode === 200 && text.includes("wc_agent_run_x")) resolve();
          else reject(new Error(`${res.statusCode} ${text.slice(0, 300)}`));
        });
      },
    );
    req.on("error", reject);
    req.end(data);
  });
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/**
 * Runs the measurement; returns per era and path the median Server CPU µs per request and its ratio to v1.
 * `profileDir`: run the server child with --cpu-prof into that directory; `paths`: a subset of PATHS (with v1).
 */
export async function measure({ requests = 2000, rounds = 5, profileDir, paths = PATHS } = {}) {
  if (!paths.includes("v1")) throw new Error("dispatch: the paths must include v1 (the baseline)");
  const execArgv = [...SERVER_NODE_FLAGS, ...(profileDir ? ["--cpu-prof", `--cpu-prof-dir=${profileDir}`] : [])];
  const child = fork(SELF, ["--serve"], { execArgv, stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const ask = (m, key) =>
    new Promise((resolve, reject) => {
      const on = (r) => {
        if (key in r) {
          child.off("message", on);
          child.off("exit", onExit);
          resolve(r);
        }
      };
      const onExit = (code) => reject(new Error(`dispatch server child exited (${code})`));
      child.on("message", on);
      child.once("exit", onExit);
      if (m !== null) child.send(m);
    });
  try {
    const { ports } = await ask(null, "ports");
    const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENT });
    const samples = Object.fromEntries(ERAS.map((era) => [era, Object.fromEntries(paths.map((p) => [p, []]))]));
    let id = 0;
    for (let round = 0; round <= rounds; round++) {
      for (const era of ERAS) {
        for (const path of paths) {
          const before = await ask("cpu", "cpu");
          let sent = 0;
          await Promise.all(
            Array.from({ length: CONCURRENT }, async () => {
              while (sent < requests) {
                sent += 1;
                await post(agent, ports[path], era, ++id);
              }
            }),
          );
          const after = await ask("cpu", "cpu");
          // Round 0 warms up (JIT, sockets, lazy module parts); it is not counted.
          if (round > 0) samples[era][path].push((after.cpu - before.cpu) / requests);
        }
      }
    }
    agent.destroy();
    const rows = [];
    for (const era of ERAS) {
      const base = median(samples[era].v1);
      for (const path of paths) {
        const us = median(samples[era][path]);
        rows.push({ era, path, cpu_us_per_request: Math.round(us), ratio_to_v1: Math.round((us / base) * 100) / 100 });
      }
    }
    return { requests, rounds, concurrent: CONCURRENT, rows };
  } finally {
    child.send("exit");
    if (child.exitCode === null) await new Promise((resolve) => child.once("exit", resolve));
  }
}

/** For run.mjs: --quick measures fewer requests and rounds; `profileDir` as for measure(). */
export async function run({ quick = false, profileDir } = {}) {
  const size = quick ? { requests: 500, rounds: 2 } : {};
  return measure({ ...size, ...(profileDir ? { profileDir } : {}) });
}

if (process.argv[1] === SELF) {
  const { values } = parseArgs({
    options: {
      serve: { type: "boolean", default: false },
      requests: { type: "string", default: "2000" },
      rounds: { type: "string", default: "5" },
      profile: { type: "string" },
      paths: { type: "string", default: PATHS.join(",") },
    },
  });
  if (values.serve) await serve();
  else {
    const r = await measure({
      requests: Number(values.requests),
      rounds: Number(values.rounds),
      paths: values.paths.split(",").map((p) => p.trim()),
      ...(values.profile ? { profileDir: values.profile } : {}),
    });
    for (const row of r.rows) {
      console.log(
        `${row.era} ${row.path.padEnd(9)} ${String(row.cpu_us_per_request).padStart(6)} µs/request  ${row.ratio_to_v1.toFixed(2)}× v1`,
      );
    }
    console.log(JSON.stringify(r));
  }
}
