/**
 * The /mcp plumbing with the real SDK client over real HTTP, against an
 * in-test RunsApi (the run core is exercised by mcp-acceptance.test.ts).
 */
import { createServer, type Server as HttpServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LATEST_PROTOCOL_VERSION } from "@modelcontextprotocol/sdk/types.js";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MemoryAuditLog } from "../../src/mcp/audit.js";
import { originAllowed } from "../../src/mcp/gate.js";
import { createMcpHttpHandler, type McpHttpHandler } from "../../src/mcp/http.js";
import type { Principal } from "../../src/runs/api.js";
import { ObserveLimits } from "../../src/runs/observe-limits.js";
import { FakeRuns, principal } from "../support/fake-runs.js";

const TOKENS: Record<string, Principal> = {
  "token-alice": principal("alice", ["coding_agent:run", "project:write", "project:read"], ["demo"]),
  "token-bob": principal("bob", ["coding_agent:run", "project:write"], ["other"]),
  "token-ops": principal("ops", ["project:write", "job:run", "mcp:local", "runtime:read"], ["demo"]),
};

let http: HttpServer;
let handler: McpHttpHandler;
let url: URL;
const runs = new FakeRuns();
const audit = new MemoryAuditLog();
const limits = new ObserveLimits(2);
const clients: Client[] = [];

beforeAll(async () => {
  handler = createMcpHttpHandler({
    runs,
    audit,
    logger: pino({ level: "silent" }),
    authenticate: async (token) => TOKENS[token] ?? null,
    observeLimits: limits,
    maxBodyBytes: 256 * 1024,
  });
  http = createServer((req, res) => {
    if (req.url?.split("?")[0] === "/mcp") void handler(req, res);
    else {
      res.statusCode = 404;
      res.end();
    }
  });
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  url = new URL(`http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`);
});

afterAll(async () => {
  for (const c of clients) await c.close();
  await handler.close();
  http.closeAllConnections();
  await new Promise<void>((resolve) => http.close(() => resolve()));
});

async function connect(token: string): Promise<Client> {
  const client = new Client({ name: "test", version: "0" });
  await client.connect(
    new StreamableHTTPClientTransport(url, { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
  );
  clients.push(client);
  return client;
}

function initBody(): string {
  return JSON.stringify({
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: { protocolVersion: LATEST_PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: "t", version: "0" } },
  });
}

/** POST an initialize with exactly these headers (fetch cannot set Host); resolves to the status. */
function rawPostInit(headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const body = initBody();
    const req = request(
      {
        host: "127.0.0.1",
        port: Number(url.port),
        path: url.pathname,
        method: "POST",
        headers: {
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
          "content-length": Buffer.byteLength(body),
          ...headers,
        },
      },
      (res) => {
        res.resume();
        res.once("end", () => resolve(res.statusCode ?? 0));
      },
    );
    req.once("error", reject);
    req.end(body);
  });
}

function postInit(headers: Record<string, string>, body?: string) {
  return fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers },
    body: body ?? initBody(),
  });
}

describe("Streamable HTTP /mcp", () => {
  it("negotiates the 2025-11-25 protocol and lists exactly the five run tools and two resources", async () => {
    const client = await connect("token-alice");
    expect(client.getServerVersion()?.name).toBe("webcodex");
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual([
      "apply_coding_agent_changes",
      "cancel_coding_agent",
      "get_coding_agent_changes",
      "observe_coding_agent",
      "start_coding_agent",
    ]);
    const { resources } = await client.listResources();
    expect(resources.map((r) => r.uri)).toEqual(["webcodex://projects", "ui://webcodex/run"]);
    const res = await postInit({ authorization: "Bearer token-alice" });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { result: { protocolVersion: string } }).result.protocolVersion).toBe("2025-11-25");
  });

  it("runs start → observe through the SDK client, whose output-schema validation accepts the results", async () => {
    const client = await connect("token-alice");
    await client.listTools(); // caches output validators
    const start = await client.callTool({
      name: "start_coding_agent",
      arguments: { project_id: "demo", provider_id: "fake", idempotency_key: "http-1", prompt: "hi" },
    });
    expect(start.isError).toBeFalsy();
    const { run_id, observation_token } = start.structuredContent as { run_id: string; observation_token: string };
    const observed = await client.callTool({
      name: "observe_coding_agent",
      arguments: { run_id, after_observation_token: observation_token },
    });
    expect(observed.structuredContent).toMatchObject({ run_id, state: "running", events: [{ kind: "agent_message" }] });
    const bad = await client.callTool({ name: "cancel_coding_agent", arguments: { run_id, jsonrpc: "2.0" } });
    expect(bad.isError).toBe(true);
    expect(JSON.parse((bad.content as { text: string }[])[0]!.text)).toEqual({
      error: { code: "invalid_input", message: "unknown field 'jsonrpc' not allowed", recovery_kind: "fix_input" },
    });
  });

  it("answers 401 with WWW-Authenticate for a missing or invalid bearer token", async () => {
    const missing = await postInit({});
    expect(missing.status).toBe(401);
    expect(missing.headers.get("www-authenticate")).toBe('Bearer realm="webcodex"');
    const invalid = await postInit({ authorization: "Bearer nope" });
    expect(invalid.status).toBe(401);
    expect(invalid.headers.get("www-authenticate")).toContain('error="invalid_token"');
    await expect(connect("nope")).rejects.toThrow();
  });

  it("answers 403 to a request whose Origin is present and not allowed (DNS rebinding), before auth", async () => {
    for (const origin of ["http://evil.example", `http://evil.example:${url.port}`, "null", "file://"]) {
      const r = await postInit({ authorization: "Bearer token-alice", origin });
      expect(r.status, origin).toBe(403);
    }
    expect((await postInit({ origin: "http://evil.example" })).status).toBe(403);
    // No Origin (not a browser) and the Server's own loopback origin are fine.
    expect((await postInit({ authorization: "Bearer token-alice" })).status).toBe(200);
    expect((await postInit({ authorization: "Bearer token-alice", origin: url.origin })).status).toBe(200);
    const localhost = `http://localhost:${url.port}`;
    expect((await postInit({ authorization: "Bearer token-alice", origin: localhost })).status).toBe(200);
    // A browser-based tool on another loopback port, talking to the Server by the same loopback name, is fine.
    const otherPort = `http://127.0.0.1:${Number(url.port) === 6274 ? 6275 : 6274}`;
    expect((await postInit({ authorization: "Bearer token-alice", origin: otherPort })).status).toBe(200);
  });

  it("accepts a loopback Origin only when its host is the request's loopback Host, and no rebinding Host/Origin pair", async () => {
    const port = Number(url.port);
    const tool = port === 6274 ? 6275 : 6274;
    const cases: { host: string; origin: string; status: number }[] = [
      { host: `localhost:${port}`, origin: `http://localhost:${tool}`, status: 200 },
      { host: `127.0.0.1:${port}`, origin: `http://127.0.0.1:${tool}`, status: 200 },
      { host: `localhost:${port}`, origin: `https://localhost`, status: 200 },
      { host: `127.0.0.1:${port}`, origin: `http://localhost:${tool}`, status: 403 },
      { host: `localhost:${port}`, origin: `http://127.0.0.1:${tool}`, status: 403 },
      { host: "evil.example.com", origin: "http://evil.example.com", status: 403 },
      { host: `evil.example.com:${port}`, origin: `http://evil.example.com:${port}`, status: 403 },
      { host: `evil.example.com:${port}`, origin: `http://localhost:${tool}`, status: 403 },
      { host: `localhost.evil.example:${port}`, origin: `http://localhost.evil.example:${tool}`, status: 403 },
      { host: `localhost:${port}`, origin: `http://localhost.evil.example:${tool}`, status: 403 },
      { host: `localhost:${port}`, origin: "null", status: 403 },
    ];
    for (const c of cases) {
      const status = await rawPostInit({ host: c.host, origin: c.origin, authorization: "Bearer token-alice" });
      expect(status, `Host ${c.host} Origin ${c.origin}`).toBe(c.status);
    }
  });

  it("accepts exactly the configured allowed_origins besides its own", () => {
    const allowed = ["https://app.example"];
    expect(originAllowed("https://app.example", 7420, allowed, "0.0.0.0")).toBe(true);
    expect(originAllowed("https://app.example.evil", 7420, allowed, "0.0.0.0")).toBe(false);
    expect(originAllowed("http://app.example", 7420, allowed, "0.0.0.0")).toBe(false);
    expect(originAllowed("http://0.0.0.0:7420", 7420, [], "0.0.0.0")).toBe(false);
    expect(originAllowed("http://wc.lan:7420", 7420, [], "wc.lan")).toBe(true);
    expect(originAllowed(undefined, 7420, [], "127.0.0.1")).toBe(true);
    // The request's Host decides for loopback origins on other ports; a malformed or foreign Host never matches.
    expect(originAllowed("http://[::1]:6274", 7420, [], "::1", "[::1]:7420")).toBe(true);
    expect(originAllowed("http://localhost:6274", 7420, [], "127.0.0.1", "localhost")).toBe(true);
    expect(originAllowed("http://localhost:6274", 7420, [], "127.0.0.1", undefined)).toBe(false);
    expect(originAllowed("http://localhost:6274", 7420, [], "127.0.0.1", "user@localhost:7420")).toBe(false);
    expect(originAllowed("http://localhost:6274", 7420, [], "127.0.0.1", "localhost:7420/x")).toBe(false);
    expect(originAllowed("http://wc.lan:6274", 7420, [], "wc.lan", "wc.lan:7420")).toBe(false);
  });

  it("refuses a body over the limit with 413 and GET with 405", async () => {
    const big = await postInit(
      { authorization: "Bearer token-alice" },
      JSON.stringify({ pad: "x".repeat(300 * 1024) }),
    );
    expect(big.status).toBe(413);
    const get = await fetch(url, { headers: { authorization: "Bearer token-alice", accept: "text/event-stream" } });
    expect(get.status).toBe(405);
  });

  it("shows each caller only its own projects and sanitized providers", async () => {
    const alice = await connect("token-alice");
    const doc = JSON.parse(
      ((await alice.readResource({ uri: "webcodex://projects" })).contents[0] as { text: string }).text,
    );
    expect(doc).toEqual({
      projects: [
        {
          project_id: "demo",
          runner_online: true,
          allow_patch: true,
          agents_share_runner_user: false,
          providers: [{ provider_id: "fake", name: "Fake agent", allowed_config_options: ["model"] }],
        },
      ],
    });
    const bob = await connect("token-bob");
    const bobDoc = JSON.parse(
      ((await bob.readResource({ uri: "webcodex://projects" })).contents[0] as { text: string }).text,
    );
    expect(bobDoc.projects.map((p: { project_id: string }) => p.project_id)).toEqual(["other"]);
    const ops = await connect("token-ops");
    const opsDoc = JSON.parse(
      ((await ops.readResource({ uri: "webcodex://projects" })).contents[0] as { text: string }).text,
    );
    expect(opsDoc.projects).toEqual([]);
  });

  it("refuses every tool to a token without coding_agent:run", async () => {
    const ops = await connect("token-ops");
    for (const [name, args] of [
      ["start_coding_agent", { project_id: "demo", provider_id: "fake", idempotency_key: "ops-1", prompt: "x" }],
      ["observe_coding_agent", { run_id: "wc_agent_run_abcdefghijklmnopqrstuvwxyz" }],
      ["cancel_coding_agent", { run_id: "wc_agent_run_abcdefghijklmnopqrstuvwxyz" }],
    ] as const) {
      const result = await ops.callTool({ name, arguments: args });
      expect(result.isError).toBe(true);
      expect(JSON.parse((result.content as { text: string }[])[0]!.text).error.code).toBe("forbidden");
    }
  });

  it("aborts a waiting observe and frees its slot when the client disconnects", async () => {
    const client = await connect("token-alice");
    const start = await client.callTool({
      name: "start_coding_agent",
      arguments: { project_id: "demo", provider_id: "fake", idempotency_key: "http-abort", prompt: "hi" },
    });
    const { run_id } = start.structuredContent as { run_id: string };
    const first = await client.callTool({ name: "observe_coding_agent", arguments: { run_id } });
    const token = (first.structuredContent as { observation_token: string }).observation_token;
    const abort = new AbortController();
    const pending = fetch(url, {
      method: "POST",
      signal: abort.signal,
      headers: {
        authorization: "Bearer token-alice",
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "mcp-protocol-version": LATEST_PROTOCOL_VERSION,
      },
      body: JSON.stringify({
        jsonrpc: "2.0",
        id: 7,
        method: "tools/call",
        params: {
          name: "observe_coding_agent",
          arguments: { run_id, after_observation_token: token, wait_secs: 30 },
        },
      }),
    }).catch((e: unknown) => e);
    await expect.poll(() => limits.waiting("alice"), { timeout: 10_000 }).toBe(1);
    expect(runs.waiting).toBe(1);
    abort.abort();
    await pending;
    await expect.poll(() => limits.waiting("alice"), { timeout: 10_000 }).toBe(0);
    expect(runs.waiting).toBe(0);
  });

  it("answers two callers' concurrent requests with the same JSON-RPC id each with its own answer, and a notifications/cancelled naming that id stops neither", async () => {
    // One SDK Server serves every POST (mcp/post.ts PostMux): ids of different callers collide, and a
    // caller's identity must never reach another caller's request.
    const alice = await connect("token-alice");
    const started = await alice.callTool({
      name: "start_coding_agent",
      arguments: { project_id: "demo", provider_id: "fake", idempotency_key: "http-same-id", prompt: "hi" },
    });
    const { run_id } = started.structuredContent as { run_id: string };
    const first = await alice.callTool({ name: "observe_coding_agent", arguments: { run_id } });
    const token = (first.structuredContent as { observation_token: string }).observation_token;
    const post = (bearer: string, message: Record<string, unknown>) =>
      fetch(url, {
        method: "POST",
        headers: {
          authorization: `Bearer ${bearer}`,
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
          "mcp-protocol-version": LATEST_PROTOCOL_VERSION,
        },
        body: JSON.stringify({ jsonrpc: "2.0", ...message }),
      });
    const observe = (bearer: string) =>
      post(bearer, {
        id: 5,
        method: "tools/call",
        params: { name: "observe_coding_agent", arguments: { run_id, after_observation_token: token, wait_secs: 30 } },
      });
    const aliceWaits = observe("token-alice");
    await expect.poll(() => runs.waiting, { timeout: 10_000 }).toBe(1);
    // Bob, same id 5, at the same time: his own answer (not alice's run), while alice's request waits on.
    const bob = await observe("token-bob");
    const bobBody = (await bob.json()) as { id: number; result: { isError?: boolean; structuredContent?: unknown } };
    expect(bobBody.id).toBe(5);
    expect(bobBody.result.isError).toBe(true);
    expect(JSON.stringify(bobBody.result)).toContain("not_found");
    const lists = await post("token-bob", { id: 5, method: "tools/list" });
    expect(((await lists.json()) as { id: number; result: { tools: unknown[] } }).result.tools.length).toBeGreaterThan(
      0,
    );
    // A cancellation naming id 5 (and the first internal ids) is not delivered to anyone: 202, alice still waits.
    for (const requestId of [5, 1, 2, 3]) {
      const cancelled = await post("token-bob", { method: "notifications/cancelled", params: { requestId } });
      expect(cancelled.status).toBe(202);
    }
    expect(runs.waiting).toBe(1);
    runs.runs
      .get(run_id)
      ?.events.push({ seq: 99, at: new Date().toISOString(), kind: "agent_message", text: "x", truncated: false });
    runs.wake();
    const aliceBody = (await (await aliceWaits).json()) as {
      id: number;
      result: { structuredContent: { run_id: string; events: Array<{ seq: number }> } };
    };
    expect(aliceBody.id).toBe(5);
    expect(aliceBody.result.structuredContent.run_id).toBe(run_id);
    expect(aliceBody.result.structuredContent.events.map((e) => e.seq)).toContain(99);
  });

  it("answers 2025-era requests as it always has where the v2 SDK's 2025 codec answers otherwise", async () => {
    const post = async (message: Record<string, unknown>) => {
      const res = await fetch(url, {
        method: "POST",
        headers: {
          authorization: "Bearer token-alice",
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
          "mcp-protocol-version": LATEST_PROTOCOL_VERSION,
        },
        body: JSON.stringify({ jsonrpc: "2.0", ...message }),
      });
      expect(res.status).toBe(200);
      return (await res.json()) as { id: number; error?: { code: number; message: string }; result?: unknown };
    };
    const key = `task-augmented-${crypto.randomUUID()}`;
    const startsBefore = runs.startCalls.length;
    // 2025 task creation: this Server offers no 2025 Tasks, so it is refused and nothing starts.
    const augmented = await post({
      id: 31,
      method: "tools/call",
      params: {
        name: "start_coding_agent",
        arguments: { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "hi" },
        task: { ttl: 60_000 },
      },
    });
    expect(augmented).toMatchObject({
      id: 31,
      error: { code: -32603, message: "Server does not support task creation (required for tools/call)" },
    });
    expect(augmented.result).toBeUndefined();
    expect(runs.startCalls.length).toBe(startsBefore);
    expect(runs.startCalls.some((s) => s.idempotency_key === key)).toBe(false);
    // A bare server/discover is told what a 2026-07-28 request needs, not just "Method not found".
    const discover = await post({ id: 32, method: "server/discover", params: {} });
    expect(discover.error?.code).toBe(-32601);
    expect(discover.error?.message).toContain("server/discover is a 2026-07-28 request");
    // A handler's JSON-RPC error keeps its wording ("MCP error <code>: …").
    const unknown = await post({ id: 33, method: "tools/call", params: { name: "no_such_tool", arguments: {} } });
    expect(unknown.error).toEqual({ code: -32602, message: "MCP error -32602: Unknown tool; see tools/list." });
  });

  describe("POST checks (the SDK transport's, on the Node request)", () => {
    const alice = { authorization: "Bearer token-alice" };
    const versioned = { ...alice, "mcp-protocol-version": LATEST_PROTOCOL_VERSION };
    const listTools = (id: number) => ({ jsonrpc: "2.0", id, method: "tools/list" });

    async function errorOf(res: Response): Promise<{ status: number; code: number; message: string }> {
      const body = (await res.json()) as { error: { code: number; message: string }; id: null };
      expect(body.id).toBeNull();
      return { status: res.status, code: body.error.code, message: body.error.message };
    }

    it("answers 406 when Accept does not offer both JSON and SSE, and 415 for a non-JSON body type", async () => {
      const onlyJson = await postInit({ ...alice, accept: "application/json" });
      expect(await errorOf(onlyJson)).toMatchObject({ status: 406, code: -32000, message: /Not Acceptable/ });
      const text = await postInit({ ...alice, "content-type": "text/plain; a=application/json" });
      expect(await errorOf(text)).toMatchObject({ status: 415, code: -32000, message: /Content-Type/ });
      const withCharset = await postInit({ ...alice, "content-type": "Application/JSON; charset=utf-8" });
      expect(withCharset.status).toBe(200);
    });

    it("answers 400 -32700 to bad JSON and to JSON that is not a JSON-RPC message", async () => {
      expect(await errorOf(await postInit(alice, "{not json"))).toMatchObject({ status: 400, code: -32700 });
      expect(await errorOf(await postInit(alice, JSON.stringify({ hello: 1 })))).toMatchObject({
        status: 400,
        code: -32700,
        message: /JSON-RPC/,
      });
    });

    it("refuses an unsupported MCP-Protocol-Version after initialize, naming the supported ones", async () => {
      const res = await postInit({ ...alice, "mcp-protocol-version": "1999-01-01" }, JSON.stringify(listTools(1)));
      const err = await errorOf(res);
      expect(err).toMatchObject({ status: 400, code: -32000 });
      expect(err.message).toContain("1999-01-01");
      expect(err.message).toContain(LATEST_PROTOCOL_VERSION);
    });

    it("answers 202 with no body to notifications only", async () => {
      const res = await postInit(versioned, JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }));
      expect(res.status).toBe(202);
      expect(await res.text()).toBe("");
    });

    it("refuses every JSON-RPC batch (an array body) with 400 -32700, as the SDK refuses a non-message, and runs nothing", async () => {
      const before = runs.startCalls.length;
      const start = {
        jsonrpc: "2.0",
        id: 7,
        method: "tools/call",
        params: {
          name: "start_coding_agent",
          arguments: { project_id: "demo", provider_id: "fake", idempotency_key: "batch-1", prompt: "hi" },
        },
      };
      const bodies = [
        [listTools(1)],
        [listTools(2), listTools(1)],
        [start],
        [{ jsonrpc: "2.0", method: "notifications/initialized" }],
        [JSON.parse(initBody())],
        [],
        Array.from({ length: 101 }, (_, i) => listTools(i)),
      ];
      for (const body of bodies) {
        const headers = Array.isArray(body) && body[0]?.method === "initialize" ? alice : versioned;
        const err = await errorOf(await postInit(headers, JSON.stringify(body)));
        expect(err, JSON.stringify(body).slice(0, 80)).toEqual({
          status: 400,
          code: -32700,
          message: "Parse error: Invalid JSON-RPC message",
        });
      }
      expect(runs.startCalls.length).toBe(before);
    });

    it("answers a request for an unknown method with a JSON-RPC error on 200", async () => {
      const res = await postInit(versioned, JSON.stringify({ jsonrpc: "2.0", id: 5, method: "nope/nothing" }));
      expect(res.status).toBe(200);
      expect(((await res.json()) as { id: number; error: { code: number } }).error.code).toBe(-32601);
    });

    it("refuses an over-limit body sent without Content-Length (chunked) with 413", async () => {
      const chunks = new ReadableStream<Uint8Array>({
        start(controller) {
          for (let i = 0; i < 20; i++) controller.enqueue(new TextEncoder().encode("x".repeat(16 * 1024)));
          controller.close();
        },
      });
      const res = await fetch(url, {
        method: "POST",
        headers: { ...alice, "content-type": "application/json", accept: "application/json, text/event-stream" },
        body: chunks,
        duplex: "half",
      } as RequestInit);
      expect(res.status).toBe(413);
      expect(((await res.json()) as { error: { message: string } }).error.message).toContain(String(256 * 1024));
    });
  });
});
