/**
 * Issue 19 §4, the Server's HTTP side, against a real Server (startServer + the MCP front end) over
 * real HTTP and raw TCP sockets: hostile tool arguments are refused precisely and audited, a 401
 * closes its connection, concurrent connections are capped with a clear 503, and refused
 * unauthenticated requests are logged at a bounded rate with a count of what was left out.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../scripts/test-support/index.js";
import { buildServerConfig, sha256Hex } from "../src/config.js";
import { StateAuditLog } from "../src/mcp/audit.js";
import { MAX_TOOL_ARGUMENT_DEPTH } from "../src/mcp/tool-arguments.js";
import { REFUSAL_LOG_PER_SECOND } from "../src/refusal-log.js";
import { type RunningServer, startServer } from "../src/server.js";
import { captureLogger, type LogCapture } from "./support/in-process.js";

const TOKEN = `wct_${"a".repeat(43)}`;

interface Env {
  server: RunningServer;
  log: LogCapture;
  dir: string;
}

async function start(serverExtra: Record<string, unknown> = {}): Promise<Env> {
  const dir = mkdtempSync(join(tmpdir(), "wc-harden-"));
  const config = buildServerConfig(
    {
      server: { host: "127.0.0.1", port: 0, state_dir: "state", ...serverExtra },
      runners: [{ id: "r1", token_sha256: sha256Hex("runner-token-0123456789abcdef"), projects: ["demo"] }],
      principals: [
        {
          id: "alice",
          scopes: ["coding_agent:run", "project:write"],
          projects: ["demo"],
          token_sha256: [sha256Hex(TOKEN)],
          token_scopes: ["coding_agent:run", "project:write"],
          allow_coding_agent_run: true,
        },
      ],
    },
    { file: null, baseDir: dir },
  );
  const log = captureLogger();
  const server = await startServer({ config, logger: log.logger, mcp: true, env: {} });
  return { server, log, dir };
}

const HEADERS = {
  "content-type": "application/json",
  accept: "application/json, text/event-stream",
  "mcp-protocol-version": "2025-11-25",
};

/** tools/call with a raw JSON text for `arguments`; returns the tool result's error (or null) as parsed. */
async function callRaw(e: Env, name: string, argumentsJson: string): Promise<{ code?: string; message?: string }> {
  const body = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":${JSON.stringify(name)},"arguments":${argumentsJson}}}`;
  const res = await fetch(`${e.server.url}/mcp`, {
    method: "POST",
    headers: { ...HEADERS, authorization: `Bearer ${TOKEN}` },
    body,
  });
  expect(res.status).toBe(200);
  const msg = (await res.json()) as {
    result?: { isError?: boolean; content: { text: string }[] };
    error?: { message: string };
  };
  if (msg.error) return { code: "jsonrpc", message: msg.error.message };
  const text = msg.result?.content[0]?.text ?? "{}";
  return (JSON.parse(text) as { error?: { code: string; message: string } }).error ?? {};
}

async function auditRows(e: Env): Promise<{ tool: string; outcome: string; input_bytes: number }[]> {
  return (await new StateAuditLog(e.server.store.engine).list()).map((r) => ({
    tool: r.tool,
    outcome: r.outcome,
    input_bytes: r.input_bytes,
  }));
}

const VALID = '"project_id":"demo","provider_id":"fake","idempotency_key":"k1","prompt":"scenario: hello"';

/** Write raw HTTP on a fresh socket; resolve with the response text once the Server closes the socket. */
function rawExchange(
  port: number,
  request: string,
  timeoutMs = 5000,
): Promise<{ text: string; closedByServer: boolean }> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    let text = "";
    const timer = setTimeout(() => {
      socket.destroy();
      resolve({ text, closedByServer: false });
    }, timeoutMs);
    socket.on("data", (c) => {
      text += c.toString("utf8");
    });
    socket.on("error", () => {});
    socket.on("close", () => {
      clearTimeout(timer);
      resolve({ text, closedByServer: true });
    });
    socket.write(request);
  });
}

describe("the Server's HTTP hardening", () => {
  let e: Env | undefined;
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    await e?.server.close();
    if (e) rmSync(e.dir, { recursive: true, force: true });
    e = undefined;
  });

  it("refuses tool arguments nested 5,000 and 500,000 levels deep with invalid_input, and audits each call", async () => {
    e = await start();
    for (const depth of [5_000, 500_000]) {
      const deep = "[".repeat(depth) + "]".repeat(depth);
      const error = await callRaw(e, "start_coding_agent", `{${VALID},"config":{"model":${deep}}}`);
      expect(error.code).toBe("invalid_input");
      expect(error.message).toContain(`nested deeper than ${MAX_TOOL_ARGUMENT_DEPTH} levels`);
      expect(error.message).toMatch(/^config\.model/);
      expect(error.message).not.toContain("call stack");
    }
    await poll(async () => (await auditRows(e!)).length === 2, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(await auditRows(e)).toEqual([
      { tool: "start_coding_agent", outcome: "invalid_input", input_bytes: 0 },
      { tool: "start_coding_agent", outcome: "invalid_input", input_bytes: 0 },
    ]);
  });

  it("rejects __proto__, constructor and prototype keys anywhere in tool arguments, by name", async () => {
    e = await start();
    const cases: [string, string][] = [
      [`{${VALID},"__proto__":{"x":1}}`, "__proto__"],
      [`{${VALID},"config":{"constructor":"x"}}`, "config.constructor"],
      [`{"run_id":"wc_agent_run_abcdefghijklmnopqrstuvwxyz","x":[{"prototype":1}]}`, "x.[0].prototype"],
    ];
    for (const [args, where] of cases) {
      const tool = args.includes("run_id") ? "observe_coding_agent" : "start_coding_agent";
      const error = await callRaw(e, tool, args);
      expect(error.code).toBe("invalid_input");
      expect(error.message).toContain(`${where}: the key '${where.split(".").at(-1)}' is reserved`);
    }
    await poll(async () => (await auditRows(e!)).length === 3, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect((await auditRows(e)).every((r) => r.outcome === "invalid_input")).toBe(true);
  });

  it("says timeout_secs must be an integer for a wrong type, and required only for a missing field", async () => {
    e = await start();
    for (const bad of ['"5"', "5.5", "null", "true"]) {
      const error = await callRaw(e, "start_coding_agent", `{${VALID},"timeout_secs":${bad}}`);
      expect(error).toMatchObject({ code: "invalid_input", message: "timeout_secs: must be an integer" });
    }
    expect(
      await callRaw(e, "start_coding_agent", `{${VALID.replace(',"prompt":"scenario: hello"', "")}}`),
    ).toMatchObject({
      message: "prompt: required",
    });
    expect(await callRaw(e, "start_coding_agent", `{${VALID.replace('"scenario: hello"', "5")}}`)).toMatchObject({
      message: "prompt: must be a string",
    });
  });

  it("audits authenticated calls that never reach a tool: an unknown tool name, malformed params", async () => {
    e = await start();
    const error = await callRaw(e, "rm_rf", "{}");
    expect(error.code).toBe("jsonrpc");
    expect(await callRaw(e, "start_coding_agent", "[1,2]")).toEqual({
      code: "jsonrpc",
      message: "Invalid params: params.arguments: must be an object of the tool's arguments",
    });
    const res = await fetch(`${e.server.url}/mcp`, {
      method: "POST",
      headers: { ...HEADERS, authorization: `Bearer ${TOKEN}` },
      body: '{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":5}}',
    });
    // Invalid params (-32602) naming the field, answering request 8 — not an internal error with a schema dump.
    expect(await res.json()).toEqual({
      jsonrpc: "2.0",
      id: 8,
      error: { code: -32602, message: "Invalid params: params.name: must be a string (the tool's name)" },
    });
    await poll(async () => (await auditRows(e!)).length === 3, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect((await auditRows(e)).map((r) => [r.tool, r.outcome])).toEqual([
      ["unknown_tool", "invalid_input"],
      ["malformed_call", "invalid_input"],
      ["malformed_call", "invalid_input"],
    ]);
  });

  it("closes the connection after a 401 from /mcp and from /runner instead of keeping the socket", async () => {
    e = await start();
    const port = e.server.port;
    const mcp = await rawExchange(
      port,
      `POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 2\r\n\r\n{}`,
    );
    expect(mcp.text).toMatch(/^HTTP\/1\.1 401/);
    expect(mcp.text.toLowerCase()).toContain("connection: close");
    expect(mcp.closedByServer).toBe(true);
    const runner = await rawExchange(
      port,
      "GET /runner HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer wrong\r\n\r\n",
    );
    expect(runner.text).toMatch(/^HTTP\/1\.1 401/);
    expect(runner.text.toLowerCase()).toContain("connection: close");
    expect(runner.closedByServer).toBe(true);
  });

  it("answers a clear 503 past max_connections and serves again once a connection is freed", async () => {
    e = await start({ max_connections: 8 });
    const port = e.server.port;
    for (let i = 0; i < 8; i++) {
      const s = connect(port, "127.0.0.1");
      s.on("error", () => {});
      sockets.push(s);
      await new Promise((r) => s.once("connect", r));
    }
    const refused = await rawExchange(port, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    expect(refused.text).toMatch(/^HTTP\/1\.1 503 Service Unavailable/);
    expect(refused.text).toContain("Retry-After: 1");
    expect(refused.text).toContain("connection limit");
    expect(refused.closedByServer).toBe(true);
    expect(e.log.lines.join("")).toContain("connection limit reached");
    // The established connections were not dropped.
    expect(sockets.every((s) => !s.destroyed)).toBe(true);
    sockets.shift()?.destroy();
    const served = await poll(
      async () => {
        const r = await rawExchange(port, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        return r.text.startsWith("HTTP/1.1 200") ? r : undefined;
      },
      { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS },
    );
    expect(served.text).toContain('{"ok":true}');
  });

  it("logs refused unauthenticated requests at most N per second per address, then counts the suppressed ones", async () => {
    e = await start();
    const lines = () => e!.log.lines.filter((l) => l.includes("mcp request unauthorized"));
    const burst = 40;
    const t0 = Date.now();
    await Promise.all(
      Array.from({ length: burst }, () =>
        fetch(`${e!.server.url}/mcp`, { method: "POST", headers: HEADERS, body: "{}" }).then((r) => r.text()),
      ),
    );
    const seconds = Math.ceil((Date.now() - t0) / 1000) + 1;
    expect(lines().length).toBeLessThanOrEqual(REFUSAL_LOG_PER_SECOND * seconds);
    expect(lines().length).toBeLessThan(burst);
    // The next window's first line reports how many were left out.
    const withCount = await poll(
      async () => {
        await fetch(`${e!.server.url}/mcp`, { method: "POST", headers: HEADERS, body: "{}" }).then((r) => r.text());
        return lines().find((l) => l.includes('"suppressed"'));
      },
      { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS },
    );
    expect(JSON.parse(withCount).suppressed).toBeGreaterThan(0);
    expect(JSON.parse(withCount).remote).toBe("127.0.0.1");
  });
});
