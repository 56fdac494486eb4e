/**
 * A lean MCP client for the fan-out load generator: observe_coding_agent over
 * Streamable HTTP with plain node:http. Same requests as the SDK Client
 * (initialize, notifications/initialized, tools/call, MCP-Protocol-Version and
 * Mcp-Session-Id headers) without its per-call schema and transport machinery,
 * so 500 observers in one process stop competing with the Server they measure.
 * Same result shape as `connectMcp(...).observe` in mcp-client.mjs.
 */
import http from "node:http";
import { LATEST_PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS } from "@modelcontextprotocol/sdk/types.js";
import { unwrap } from "./tool-result.mjs";

/** Sockets to one Server: `--grid` allows M ≤ 1000 observers, each holding one long-poll. */
const MAX_SOCKETS = 1024;
/** Bound on one response body; an observe page is far smaller. */
const MAX_BODY_BYTES = 4 * 1024 * 1024;
/** Time allowed on top of wait_secs (and for the handshake). */
const TIMEOUT_MARGIN_MS = 30_000;

// One keep-alive pool for every client of the process; idle sockets are kept up
// to the same bound, so 500 long-polls do not reconnect after every answer.
const AGENT = new http.Agent({ keepAlive: true, maxSockets: MAX_SOCKETS, maxFreeSockets: MAX_SOCKETS });

/** Connects to `${url}` (the /mcp endpoint) with a bearer token. Throws if the handshake fails. */
export async function connectLeanMcp({ url, token, name = "webcodex-bench-lean" }) {
  const target = new URL(url);
  if (target.protocol !== "http:") throw new Error(`mcp-lean speaks http: only, got ${target.protocol}`);
  const headers = {
    Authorization: `Bearer ${token}`,
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
  };
  let nextId = 1;
  let closed = false;

  const send = async (message, timeoutMs) => {
    const res = await post(target, headers, message, timeoutMs);
    const sessionId = res.headers?.["mcp-session-id"];
    if (typeof sessionId === "string") headers["Mcp-Session-Id"] = sessionId;
    return res;
  };
  const request = async (method, params, timeoutMs = TIMEOUT_MARGIN_MS) => {
    const id = nextId++;
    const res = await send({ jsonrpc: "2.0", id, method, params }, timeoutMs);
    return { ...readResponse(res, id), bytes: res.body?.length ?? 0 };
  };

  const init = await request("initialize", {
    protocolVersion: LATEST_PROTOCOL_VERSION,
    capabilities: {},
    clientInfo: { name, version: "0.0.0" },
  });
  if (!init.ok) throw new Error(`initialize failed: ${init.error.code}: ${init.error.message}`);
  const version = init.value?.protocolVersion;
  if (!SUPPORTED_PROTOCOL_VERSIONS.includes(version)) {
    throw new Error(`initialize: server protocol version ${JSON.stringify(version)} is not supported`);
  }
  headers["MCP-Protocol-Version"] = version;
  const ack = await send({ jsonrpc: "2.0", method: "notifications/initialized" }, TIMEOUT_MARGIN_MS);
  if (ack.status !== 202) {
    throw new Error(`notifications/initialized: expected 202, got ${ack.error?.code ?? `http_${ack.status}`}`);
  }

  return {
    /** One tools/call → `{ ok, value | error }` (the tool result unwrapped). */
    async callTool(name, args, timeoutMs = TIMEOUT_MARGIN_MS) {
      if (closed) return { ok: false, error: { code: "closed", message: "client closed" } };
      const r = await request("tools/call", { name, arguments: args }, timeoutMs);
      return r.ok ? unwrap(r.value) : r;
    },
    /** As callTool, plus `bytes`: the size of the HTTP response body (the fan-out compares it with the floor's). */
    async observe(run_id, after_observation_token, wait_secs) {
      if (closed) return { ok: false, error: { code: "closed", message: "client closed" } };
      const args = {
        run_id,
        ...(after_observation_token ? { after_observation_token } : {}),
        ...(wait_secs !== undefined ? { wait_secs } : {}),
      };
      const r = await request(
        "tools/call",
        { name: "observe_coding_agent", arguments: args },
        (wait_secs ?? 0) * 1000 + TIMEOUT_MARGIN_MS,
      );
      return { ...(r.ok ? unwrap(r.value) : r), bytes: r.bytes };
    },
    /** Stateless Server: no session to DELETE. The shared agent stays for the other clients. */
    async close() {
      closed = true;
    },
  };
}

/** One POST → `{ status, headers, body }`, or `{ error }` on a network failure, timeout or oversized body. */
function post(target, headers, message, timeoutMs) {
  const payload = JSON.stringify(message);
  return new Promise((resolve) => {
    let settled = false;
    const done = (r) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(r);
    };
    const fail = (code, message) => done({ error: { code, message } });
    const req = http.request(
      target,
      { method: "POST", agent: AGENT, headers: { ...headers, "Content-Length": Buffer.byteLength(payload) } },
      (res) => {
        const chunks = [];
        let size = 0;
        res.on("data", (chunk) => {
          size += chunk.length;
          if (size > MAX_BODY_BYTES) {
            req.destroy();
            fail("body_too_large", `response body over ${MAX_BODY_BYTES} bytes`);
            return;
          }
          chunks.push(chunk);
        });
        res.on("end", () =>
          done({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString("utf8") }),
        );
        res.on("error", (e) => fail("network", String(e?.message ?? e)));
      },
    );
    const timer = setTimeout(() => {
      req.destroy();
      fail("timeout", `no response within ${timeoutMs} ms`);
    }, timeoutMs);
    req.on("error", (e) => fail("network", String(e?.message ?? e)));
    req.end(payload);
  });
}

/** The JSON-RPC response to request `id` → `{ ok: true, value: result }` or `{ ok: false, error }`. */
function readResponse(res, id) {
  if (res.error) return { ok: false, error: res.error };
  if (res.status < 200 || res.status > 299) {
    return { ok: false, error: { code: `http_${res.status}`, message: res.body.slice(0, 200) } };
  }
  const type = String(res.headers["content-type"] ?? "");
  let message;
  try {
    if (type.includes("text/event-stream")) message = findSseMessage(res.body, id);
    else if (type.includes("application/json")) {
      const parsed = JSON.parse(res.body);
      message = Array.isArray(parsed) ? parsed.find((m) => m?.id === id) : parsed;
    } else {
      return { ok: false, error: { code: "bad_content_type", message: `unexpected content-type ${type}` } };
    }
  } catch (e) {
    return { ok: false, error: { code: "unparsed", message: String(e?.message ?? e).slice(0, 200) } };
  }
  if (!message || message.id !== id) {
    return { ok: false, error: { code: "no_response", message: `no JSON-RPC response with id ${id}` } };
  }
  if (message.error) {
    return { ok: false, error: { code: `jsonrpc_${message.error.code}`, message: String(message.error.message) } };
  }
  return { ok: true, value: message.result };
}

/** The SSE event whose `data:` is the JSON-RPC message with this id (the body is already size-bounded). */
function findSseMessage(body, id) {
  for (const event of body.split(/\r?\n\r?\n/)) {
    const data = event
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5))
      .join("\n");
    if (!data) continue;
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      continue; // not a JSON-RPC message (a keep-alive comment, say)
    }
    if (message?.id === id) return message;
  }
  return undefined;
}
