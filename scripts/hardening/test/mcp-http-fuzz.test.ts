/**
 * Issue 16 §2: schema-aware and random arguments for every tool the Server
 * lists, and raw HTTP abuse of /mcp and the OAuth endpoints, against a live
 * `webcodex-server run` child (OAuth enabled) with a real Runner. No answer is
 * a 5xx (the only documented overload answer, 503 past max_connections, is
 * not provoked here), the Server stays up, a rejected call changes no durable
 * state, and every authenticated tools/call leaves exactly one audit row.
 * The same fuzz also goes through access tokens the Server's own OAuth flow
 * issued (registration, consent with coding_agent:run, PKCE, token), through
 * narrower ones (no coding_agent:run; runtime:read only), and through junk,
 * revoked and expired bearers.
 */
import { randomBytes } from "node:crypto";
import { request as httpRequest } from "node:http";
import { connect } from "node:net";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { scopesForTool } from "../../../packages/server/src/oauth/scopes.js";
import { OAUTH_TEST_CLOCK_ENV } from "../../../packages/server/src/oauth/test-clock.js";
import { issueKey, serverCli } from "../../../packages/server/test/support/oauth.js";
import { okValue, ProcStack } from "../../../packages/server/test/support/proc-stack.js";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../test-support/index.js";
import { authorizeAndRedeem, registerClient, revokeToken } from "./support/oauth-flow.js";
import { rssBytes, seed, size } from "./support/profile.js";
import { auditRows, changedTables, runSettled, stateSnapshot } from "./support/server-state.js";

/** Bound on the audit writer flushing the rows a fuzz round expects. */
const AUDIT_ROWS_WAIT_MS = 30_000;

const TOOL_CALLS = size(3_000, 300);
/** Fuzzed calls through OAuth-issued (and junk, revoked) bearers, then through the same tokens once expired. */
const OAUTH_CALLS = size(1_500, 150);
const EXPIRED_CALLS = size(150, 15);
/** Scopes of the access key the OAuth grants are consented with (alice has them all). */
const ALL_SCOPES = ["coding_agent:run", "project:write", "project:read", "runtime:read", "runtime:write"];
const RSS_GROWTH_BOUND = 128 * 1024 * 1024;
const ANSWER_MS = 30_000;
/** How long a run the fuzz really started may take to end and leave its last durable trace. */
const SETTLE_MS = 60_000;

interface JsonSchema {
  type?: string | string[];
  properties?: Record<string, JsonSchema>;
  required?: string[];
  enum?: unknown[];
}

describe("MCP and HTTP fuzz against a live Server", () => {
  let stack: ProcStack;
  let token: string;
  let realRunId = "";
  /** A real task and workflow session, so fuzzed calls on the managed and session tools get past their lookups. */
  let realTaskId = "";
  let realSessionId = "";
  let dbFile: string;

  beforeAll(async () => {
    stack = await new ProcStack({
      server: "child",
      runners: [{ id: "r1", projects: ["p1"] }],
      extraScopes: ["runtime:read", "runtime:write"],
      serverSection: (port) => `public_url = "http://127.0.0.1:${port}"`,
      extraServerToml: "[oauth]\nenabled = true\n",
    }).init();
    await stack.startRunner("r1");
    token = stack.principalTokens.get("alice")!;
    dbFile = join(stack.dir, "server-state", "server.sqlite3");
    realRunId = okValue(
      await stack.start("alice", {
        project_id: "p1",
        provider_id: "fake",
        idempotency_key: "mcp-fuzz-baseline",
        prompt: "scenario: hello",
      }),
    ).run_id;
    await poll(
      async () => {
        const o = await stack.observe("alice", { run_id: realRunId });
        return o.ok && o.value.state === "completed";
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the baseline run to complete" },
    );
    const made = async (name: string, args: Record<string, unknown>) => {
      const answer = await rpc("tools/call", { name, arguments: args });
      const result = (JSON.parse(answer.body) as { result?: { structuredContent?: Record<string, unknown> } }).result;
      if (!result?.structuredContent) throw new Error(`${name}: ${answer.body.slice(0, 300)}`);
      return result.structuredContent;
    };
    realTaskId = String(
      (
        await made("create_agent_task", {
          project_id: "p1",
          instruction: "scenario: hello",
          idempotency_key: "mcp-fuzz-task",
        })
      ).task_id,
    );
    realSessionId = String((await made("create_workflow_session", { project_id: "p1", title: "fuzz" })).session_id);
  }, 120_000);

  afterAll(async () => {
    await stack?.stop();
  });

  interface Answer {
    status: number;
    body: string;
  }

  /** One HTTP request with full control of headers and body (fetch refuses some of what we send). */
  function send(
    method: string,
    path: string,
    headers: Record<string, string | string[]>,
    body?: string | Buffer,
  ): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(
        { host: "127.0.0.1", port: stack.port, method, path, headers, timeout: ANSWER_MS },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }));
          res.on("error", reject);
        },
      );
      req.on("timeout", () => req.destroy(new Error(`${method} ${path}: no answer within ${ANSWER_MS} ms`)));
      req.on("error", (err) => {
        // The Server may answer (413, 401) and close before reading a large body: that is an answer.
        if ((err as NodeJS.ErrnoException).code === "EPIPE" || (err as NodeJS.ErrnoException).code === "ECONNRESET")
          resolve({ status: -1, body: "" });
        else reject(err);
      });
      if (body !== undefined) req.write(body);
      req.end();
    });
  }

  const mcpHeaders = (extra: Record<string, string> = {}) => ({
    authorization: `Bearer ${token}`,
    "content-type": "application/json",
    accept: "application/json, text/event-stream",
    "mcp-protocol-version": "2025-11-25",
    ...extra,
  });

  async function rpc(method: string, params: unknown, id: number | string = 1): Promise<Answer> {
    return send("POST", "/mcp", mcpHeaders(), JSON.stringify({ jsonrpc: "2.0", id, method, params }));
  }

  /** A value for one property: usually of its declared type (edge values included), sometimes of another. */
  function propertyValue(name: string, schema: JsonSchema): fc.Arbitrary<unknown> {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type ?? "string"];
    const ofType = types.map((t): fc.Arbitrary<unknown> => {
      switch (t) {
        case "integer":
        case "number":
          return fc.oneof(
            fc.integer({ min: -5, max: 200_000 }),
            fc.constantFrom(0, 1, 30, 31, -1, 2 ** 53, 1.5, Number.MAX_SAFE_INTEGER),
          );
        case "boolean":
          return fc.boolean();
        case "object":
          return fc.dictionary(fc.string({ maxLength: 10 }), fc.oneof(fc.string({ maxLength: 20 }), fc.boolean()), {
            maxKeys: 4,
          });
        case "array":
          return fc.array(fc.string({ maxLength: 10 }), { maxLength: 4 });
        default:
          return fc.oneof(
            fc.string({ maxLength: 40 }),
            fc.constantFrom("", "p1", "fake", realRunId, "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa", "__proto__"),
            fc.constant(`scenario: hello\n${name}`),
            fc.integer({ min: 1, max: 80 * 1024 }).map((n) => "x".repeat(n)),
          );
      }
    });
    if (schema.enum) ofType.push(fc.constantFrom(...schema.enum));
    // wait_secs: keep real waits short so the fuzz is bounded in time.
    if (name === "wait_secs") return fc.constantFrom(0, 1, -1, 31, 0.5, "2", null);
    // Mostly-valid values for the fields a call needs, so the fuzz reaches past input validation.
    const valid: Record<string, fc.Arbitrary<unknown>> = {
      project_id: fc.constant("p1"),
      provider_id: fc.constant("fake"),
      prompt: fc.constantFrom("scenario: hello", "hello there"),
      run_id: fc.constant(realRunId),
      idempotency_key: fc.stringMatching(/^[a-z0-9-]{1,24}$/),
      task_id: fc.constant(realTaskId),
      session_id: fc.constant(realSessionId),
      workflow_session_id: fc.constant(realSessionId),
      context_session_id: fc.constant(realSessionId),
      assignee: fc.constantFrom("fuzz-host", "other-host"),
    };
    const likely = valid[name];
    if (likely)
      return fc.oneof(
        { weight: 3, arbitrary: likely },
        { weight: 1, arbitrary: fc.oneof(...ofType) },
        { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
      );
    return fc.oneof(
      { weight: 4, arbitrary: fc.oneof(...ofType) },
      { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
    );
  }

  function argumentsFor(schema: JsonSchema): fc.Arbitrary<unknown> {
    const props = schema.properties ?? {};
    const record = fc.record(
      Object.fromEntries(Object.entries(props).map(([k, v]) => [k, propertyValue(k, v)])) as Record<
        string,
        fc.Arbitrary<unknown>
      >,
      { requiredKeys: [] },
    );
    const extra = fc.dictionary(
      fc.constantFrom("executable", "args", "env", "cwd", "session_id", "jsonrpc", "__proto__", "constructor", "x"),
      fc.jsonValue({ maxDepth: 2 }),
      { maxKeys: 2 },
    );
    return fc.oneof(
      { weight: 6, arbitrary: record },
      { weight: 1, arbitrary: fc.tuple(record, extra).map(([a, b]) => ({ ...(a as object), ...b })) },
      { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
    );
  }

  /** Tools as tools/list gives them (through the static token). */
  async function listTools(): Promise<Array<{ name: string; inputSchema: JsonSchema }>> {
    const listed = await rpc("tools/list", {});
    expect(listed.status).toBe(200);
    return (JSON.parse(listed.body) as { result: { tools: Array<{ name: string; inputSchema: JsonSchema }> } }).result
      .tools;
  }

  /** Fuzzed calls: schema-aware arguments for every listed tool, plus random tool names with random arguments. */
  function callArbitrary(tools: Array<{ name: string; inputSchema: JsonSchema }>) {
    return fc.oneof(
      ...tools.map((t) =>
        argumentsFor(t.inputSchema).map((args) => ({ name: t.name, args }) as { name: string; args: unknown }),
      ),
      fc.record({
        // Random names, and names of Object.prototype members (a lookup that is not own-property reaches them).
        name: fc.oneof(
          fc.string({ maxLength: 30 }),
          fc.constantFrom("constructor", "valueOf", "__proto__", "toString", "hasOwnProperty"),
        ),
        args: fc.jsonValue({ maxDepth: 2 }),
      }),
    );
  }

  /** Runs the fuzz really started: their rows keep changing (the Runner reports on them) and are left out. */
  const started = new Set<string>();
  /** Durable state minus the rows of runs the fuzz really started. */
  const state = () => {
    const snap = stateSnapshot(dbFile);
    for (const [table, rows] of Object.entries(snap))
      snap[table] = rows.filter((r) => !started.has(String((r as { run_id?: unknown }).run_id)));
    return snap;
  };

  /**
   * One tools/call through `bearer`, checked: no 5xx, no -32603, a tool error in the `{error: {code, message}}`
   * envelope, and no durable change unless the call succeeded. Returns how it was answered (`ok:<tool>`,
   * `tool_error:<code>`, `rpc_<code>`, `http_<status>`).
   */
  async function checkedCall(bearer: string, name: string, args: unknown, id: number): Promise<string> {
    const before = state();
    const answer = await send(
      "POST",
      "/mcp",
      mcpHeaders({ authorization: `Bearer ${bearer}` }),
      JSON.stringify({ jsonrpc: "2.0", id, method: "tools/call", params: { name, arguments: args } }),
    );
    const what = `${name} ${JSON.stringify(args).slice(0, 200)} → ${answer.status} ${answer.body.slice(0, 300)}`;
    expect(answer.status, what).toBeLessThan(500);
    let key = `http_${answer.status}`;
    if (answer.status === 200) {
      const msg = JSON.parse(answer.body) as {
        result?: {
          isError?: boolean;
          content?: Array<{ text?: string }>;
          structuredContent?: { run_id?: string };
        };
        error?: { code: number };
      };
      // An internal error (-32603) is the JSON-RPC form of a 5xx: never an answer to bad input.
      expect(msg.error?.code, what).not.toBe(-32603);
      if (msg.error) key = `rpc_${msg.error.code}`;
      else if (msg.result?.isError) {
        const text = msg.result.content?.[0]?.text ?? "{}";
        const error = (JSON.parse(text) as { error?: { code?: string; message?: string } }).error;
        expect(error?.code, `${name}: a tool error carries {error: {code, message}}`).toMatch(/^[a-z_]+$/);
        expect(error?.message).toBeTruthy();
        key = `tool_error:${error?.code}`;
      } else {
        key = `ok:${name}`;
        const runId = msg.result?.structuredContent?.run_id;
        if (runId && name.includes("start") && !started.has(runId)) {
          started.add(runId);
          // Its session evidence (a row outside the run's own) lands later: wait, so no later call is blamed.
          await poll(() => runSettled(dbFile, runId), {
            timeoutMs: SETTLE_MS,
            intervalMs: DAEMON_POLL_MS,
            what: `run ${runId} settled`,
          });
        }
      }
    }
    if (!key.startsWith("ok:"))
      expect(changedTables(before, state()), `refused ${what} changed durable state`).toEqual([]);
    return key;
  }

  /** Waits for the audit flush, then: exactly `expected` new mcp_audit rows since `before`. */
  async function expectAuditRows(before: number, expected: number): Promise<void> {
    await poll(() => auditRows(dbFile, "mcp_audit").length - before >= expected, {
      timeoutMs: AUDIT_ROWS_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: `${expected} new mcp_audit rows`,
    });
    expect(auditRows(dbFile, "mcp_audit").length - before, "one mcp_audit row per authenticated call").toBe(expected);
  }

  it(
    `answers ${TOOL_CALLS} fuzzed tool calls for every listed tool without a 5xx, auditing each and changing nothing on refusal`,
    async () => {
      const s = seed();
      console.log(`MCP fuzz seed=${s} calls=${TOOL_CALLS}`);
      const t0 = Date.now();
      const tools = await listTools();
      expect(tools.map((t) => t.name)).toEqual(
        expect.arrayContaining(["start_coding_agent", "observe_coding_agent", "cancel_coding_agent"]),
      );
      const calls = fc.sample(callArbitrary(tools), { numRuns: TOOL_CALLS, seed: s });
      const auditBefore = auditRows(dbFile, "mcp_audit").length;
      const pid = stack.serverChild!.pid!;
      const rssBefore = (await rssBytes(pid))!;
      const statuses = new Map<string, number>();
      let refused = 0;
      // One call at a time, so each refused call's effect on durable state can be checked on its own.
      for (let i = 0; i < calls.length; i++) {
        const { name, args } = calls[i]!;
        const key = await checkedCall(token, name, args, i);
        if (!key.startsWith("ok:")) refused += 1;
        statuses.set(key, (statuses.get(key) ?? 0) + 1);
      }
      console.log(`MCP fuzz answers ${JSON.stringify(Object.fromEntries(statuses))}`);
      const rssAfter = await rssBytes(pid);
      expect(rssAfter, "the Server survived").toBeDefined();
      expect(rssAfter! - rssBefore, "Server RSS growth").toBeLessThan(RSS_GROWTH_BOUND);

      // Every authenticated tools/call is audited (rows are written in batches: wait for the flush).
      await expectAuditRows(auditBefore, calls.length);

      expect(refused).toBeGreaterThan(calls.length / 2);
      const baseline = okValue(await stack.observe("alice", { run_id: realRunId }));
      expect(baseline.state).toBe("completed");
      console.log(
        `MCP fuzz: ${((Date.now() - t0) / 1000).toFixed(1)} s, ${refused} refused calls checked, ${started.size} runs really started`,
      );
    },
    15 * 60_000,
  );

  it(
    "answers raw HTTP abuse of /mcp and the OAuth endpoints without a 5xx and stays up",
    async () => {
      const before = stateSnapshot(dbFile);
      const tenMb = Buffer.alloc(10 * 1024 * 1024, 0x61);
      const validCall = JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "tools/call",
        params: { name: "observe_coding_agent", arguments: { run_id: realRunId } },
      });
      const cases: Array<[string, () => Promise<Answer>]> = [
        ["text/plain body", () => send("POST", "/mcp", mcpHeaders({ "content-type": "text/plain" }), validCall)],
        [
          "no content-type",
          () =>
            send(
              "POST",
              "/mcp",
              { authorization: `Bearer ${token}`, accept: "application/json, text/event-stream" },
              validCall,
            ),
        ],
        [
          "form body",
          () => send("POST", "/mcp", mcpHeaders({ "content-type": "application/x-www-form-urlencoded" }), "a=b"),
        ],
        [
          "multipart body",
          () => send("POST", "/mcp", mcpHeaders({ "content-type": "multipart/form-data; boundary=x" }), "--x--"),
        ],
        [
          "no accept",
          () =>
            send("POST", "/mcp", { authorization: `Bearer ${token}`, "content-type": "application/json" }, validCall),
        ],
        ["10 MB body", () => send("POST", "/mcp", mcpHeaders(), tenMb)],
        ["10 MB body unauthenticated", () => send("POST", "/mcp", { "content-type": "application/json" }, tenMb)],
        ["invalid JSON", () => send("POST", "/mcp", mcpHeaders(), '{"jsonrpc":')],
        ["JSON null", () => send("POST", "/mcp", mcpHeaders(), "null")],
        ["JSON string", () => send("POST", "/mcp", mcpHeaders(), '"hello"')],
        [
          "jsonrpc 1.0",
          () => send("POST", "/mcp", mcpHeaders(), JSON.stringify({ jsonrpc: "1.0", id: 1, method: "tools/list" })),
        ],
        ["no method", () => send("POST", "/mcp", mcpHeaders(), JSON.stringify({ jsonrpc: "2.0", id: 1 }))],
        [
          "object id",
          () =>
            send("POST", "/mcp", mcpHeaders(), JSON.stringify({ jsonrpc: "2.0", id: { a: 1 }, method: "tools/list" })),
        ],
        ["batch", () => send("POST", "/mcp", mcpHeaders(), `[${validCall},${validCall}]`)],
        ["empty batch", () => send("POST", "/mcp", mcpHeaders(), "[]")],
        [
          "unknown method",
          () => send("POST", "/mcp", mcpHeaders(), JSON.stringify({ jsonrpc: "2.0", id: 1, method: "x/y" })),
        ],
        [
          "deep params",
          () =>
            send(
              "POST",
              "/mcp",
              mcpHeaders(),
              `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":${"[".repeat(5000)}${"]".repeat(5000)}}`,
            ),
        ],
        [
          "__proto__ params",
          () =>
            send(
              "POST",
              "/mcp",
              mcpHeaders(),
              '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"observe_coding_agent","arguments":{"__proto__":{"run_id":"x"}}}}',
            ),
        ],
        [
          "no token",
          () =>
            send(
              "POST",
              "/mcp",
              { "content-type": "application/json", accept: "application/json, text/event-stream" },
              validCall,
            ),
        ],
        ["malformed bearer", () => send("POST", "/mcp", mcpHeaders({ authorization: "Bearer" }), validCall)],
        ["basic auth", () => send("POST", "/mcp", mcpHeaders({ authorization: "Basic YTpi" }), validCall)],
        [
          "duplicate authorization",
          () =>
            send("POST", "/mcp", { ...mcpHeaders(), authorization: [`Bearer ${token}`, "Bearer other"] }, validCall),
        ],
        [
          "duplicate content-type",
          () =>
            send("POST", "/mcp", { ...mcpHeaders(), "content-type": ["application/json", "text/plain"] }, validCall),
        ],
        [
          "bad protocol version",
          () => send("POST", "/mcp", mcpHeaders({ "mcp-protocol-version": "1999-01-01" }), validCall),
        ],
        ["foreign origin", () => send("POST", "/mcp", mcpHeaders({ origin: "http://evil.example" }), validCall)],
        ["foreign host", () => send("POST", "/mcp", mcpHeaders({ host: "evil.example" }), validCall)],
        ["GET /mcp", () => send("GET", "/mcp", mcpHeaders())],
        ["DELETE /mcp", () => send("DELETE", "/mcp", mcpHeaders())],
        ["PUT /mcp", () => send("PUT", "/mcp", mcpHeaders(), validCall)],
        ["OPTIONS /mcp", () => send("OPTIONS", "/mcp", { origin: "http://evil.example" })],
        [
          "token junk form",
          () =>
            send("POST", "/token", { "content-type": "application/x-www-form-urlencoded" }, "grant_type=x&code=%ZZ"),
        ],
        [
          "token JSON",
          () => send("POST", "/token", { "content-type": "application/json" }, '{"grant_type":"authorization_code"}'),
        ],
        ["token invalid JSON", () => send("POST", "/token", { "content-type": "application/json" }, "{")],
        ["token 10 MB", () => send("POST", "/token", { "content-type": "application/x-www-form-urlencoded" }, tenMb)],
        [
          "token refresh junk",
          () =>
            send(
              "POST",
              "/token",
              { "content-type": "application/x-www-form-urlencoded" },
              "grant_type=refresh_token&refresh_token=abc&client_id=zz",
            ),
        ],
        [
          "register junk JSON",
          () =>
            send(
              "POST",
              "/register",
              { "content-type": "application/json" },
              '{"redirect_uris":[{"a":1}],"client_name":[1]}',
            ),
        ],
        ["register invalid JSON", () => send("POST", "/register", { "content-type": "application/json" }, "{{")],
        ["register 10 MB", () => send("POST", "/register", { "content-type": "application/json" }, tenMb)],
        ["register text", () => send("POST", "/register", { "content-type": "text/plain" }, "hello")],
        [
          "authorize junk",
          () => send("GET", "/authorize?client_id=%FF&redirect_uri=javascript:alert(1)&response_type=token", {}),
        ],
        ["authorize no params", () => send("GET", "/authorize", {})],
        [
          "authorize POST junk",
          () =>
            send(
              "POST",
              "/authorize",
              { "content-type": "application/x-www-form-urlencoded" },
              "client_id[]=a&client_id[]=b",
            ),
        ],
        [
          "revoke junk",
          () => send("POST", "/revoke", { "content-type": "application/x-www-form-urlencoded" }, "token=%"),
        ],
        ["revoke JSON", () => send("POST", "/revoke", { "content-type": "application/json" }, "[]")],
        [
          "consent junk",
          () =>
            send(
              "POST",
              "/oauth/consent",
              { "content-type": "application/x-www-form-urlencoded" },
              "csrf=x&decision=allow&scope=coding_agent:run",
            ),
        ],
        [
          "consent 10 MB",
          () => send("POST", "/oauth/consent", { "content-type": "application/x-www-form-urlencoded" }, tenMb),
        ],
        ["consent JSON", () => send("POST", "/oauth/consent", { "content-type": "application/json" }, "{}")],
        ["metadata POST", () => send("POST", "/.well-known/oauth-authorization-server", {}, "x")],
        ["PRM suffixed", () => send("GET", "/.well-known/oauth-protected-resource/mcp/../../x", {})],
        ["path traversal", () => send("GET", "/../../etc/passwd", {})],
        ["long path", () => send("GET", `/${"a".repeat(60_000)}`, {})],
      ];
      const results: Record<string, number> = {};
      for (const [name, run] of cases) {
        const answer = await run();
        results[name] = answer.status;
        expect(answer.status, `${name}: ${answer.body.slice(0, 200)}`).toBeLessThan(500);
      }

      // Slow body: a valid call dripped out over ~2 s is still answered.
      const slow = await new Promise<Answer>((resolve, reject) => {
        const req = httpRequest(
          { host: "127.0.0.1", port: stack.port, method: "POST", path: "/mcp", headers: mcpHeaders() },
          (res) => {
            let body = "";
            res.on("data", (c: Buffer) => {
              body += c.toString("utf8");
            });
            res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        req.on("error", reject);
        const bytes = Buffer.from(validCall);
        let i = 0;
        const timer = setInterval(() => {
          req.write(bytes.subarray(i, i + Math.ceil(bytes.length / 10)));
          i += Math.ceil(bytes.length / 10);
          if (i >= bytes.length) {
            clearInterval(timer);
            req.end();
          }
        }, 200);
      });
      expect(slow.status).toBe(200);
      results["slow body"] = slow.status;

      // Header flood and a half-sent request on a raw socket: answered (431/400) or closed, never a 5xx.
      for (const [name, head] of [
        [
          "header flood",
          `POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n${Array.from({ length: 4000 }, (_, i) => `X-Flood-${i}: ${"v".repeat(20)}\r\n`).join("")}\r\n`,
        ],
        ["garbage request line", "HELLO WORLD\r\n\r\n"],
        ["bad content-length", "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n"],
        [
          "conflicting lengths",
          "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ],
      ] as const) {
        const statusLine = await new Promise<string>((resolve) => {
          const sock = connect(stack.port, "127.0.0.1");
          let got = "";
          sock.on("data", (c) => {
            got += c.toString("latin1");
          });
          sock.on("error", () => resolve(got));
          sock.on("close", () => resolve(got));
          sock.setTimeout(ANSWER_MS, () => sock.destroy());
          sock.write(head);
        });
        const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine)?.[1] ?? 0);
        results[name] = status;
        expect(status, `${name}: ${statusLine.slice(0, 100)}`).toBeLessThan(500);
      }
      console.log(`HTTP abuse answers ${JSON.stringify(results)}`);

      // The Server is up and serving, and nothing durable changed.
      const health = await send("GET", "/healthz", {});
      expect(health.status).toBe(200);
      expect(changedTables(before, stateSnapshot(dbFile))).toEqual([]);
      expect(okValue(await stack.observe("alice", { run_id: realRunId })).state).toBe("completed");
    },
    5 * 60_000,
  );

  it(
    `answers ${OAUTH_CALLS} fuzzed tool calls through OAuth-issued, narrower-scoped, junk and revoked bearers (and ${EXPIRED_CALLS} through expired ones): refusals change nothing, every authenticated call is audited`,
    async () => {
      const s = seed();
      console.log(`MCP OAuth fuzz seed=${s} calls=${OAUTH_CALLS} expired=${EXPIRED_CALLS}`);
      const t0 = Date.now();
      const origin = `http://127.0.0.1:${stack.port}`;
      // The operator issues alice an access key; each grant is a client registered through /register.
      const key = await issueKey(stack.serverConfigFile, "alice", ALL_SCOPES, ["p1"]);
      const provision = (clientId: string) =>
        serverCli(["oauth", "clients", "allow-coding-agent-run", clientId, "--config", stack.serverConfigFile]);
      const grant = async (name: string, scope: string, opts: { provisioned: boolean; codingAgentRun: boolean }) => {
        const clientId = await registerClient(origin, `hardening fuzz ${name}`);
        if (opts.provisioned) await provision(clientId);
        return authorizeAndRedeem(origin, { clientId, key, scope, codingAgentRun: opts.codingAgentRun });
      };
      const full = await grant("full", ALL_SCOPES.join(" "), { provisioned: true, codingAgentRun: true });
      // Provisioned, but the person leaves the coding_agent:run line unticked.
      const noRun = await grant("no-run", ALL_SCOPES.join(" "), { provisioned: true, codingAgentRun: false });
      const readOnly = await grant("runtime-read", "runtime:read", { provisioned: false, codingAgentRun: false });
      const revoked = await grant("revoked", ALL_SCOPES.join(" "), { provisioned: true, codingAgentRun: true });
      expect(await revokeToken(origin, revoked.clientId, revoked.access)).toBe(200);
      const scopesOf = (scope: string) => new Set(scope.split(" ").filter((x) => x !== ""));
      expect([...scopesOf(full.scope)].sort()).toEqual([...ALL_SCOPES].sort());
      expect([...scopesOf(noRun.scope)].sort()).toEqual(ALL_SCOPES.filter((x) => x !== "coding_agent:run").sort());
      expect(readOnly.scope).toBe("runtime:read");

      interface Bearer {
        name: string;
        token: string;
        /** The token's scopes when the Server accepts it; null: it must be answered 401. */
        scopes: Set<string> | null;
      }
      const tampered = `${full.access.slice(0, -1)}${full.access.endsWith("A") ? "B" : "A"}`;
      const bearers: Array<{ weight: number; bearer: Bearer }> = [
        { weight: 4, bearer: { name: "oauth:full", token: full.access, scopes: scopesOf(full.scope) } },
        { weight: 3, bearer: { name: "oauth:no-run", token: noRun.access, scopes: scopesOf(noRun.scope) } },
        { weight: 3, bearer: { name: "oauth:runtime-read", token: readOnly.access, scopes: scopesOf(readOnly.scope) } },
        { weight: 1, bearer: { name: "revoked", token: revoked.access, scopes: null } },
        { weight: 1, bearer: { name: "junk:tampered", token: tampered, scopes: null } },
        { weight: 1, bearer: { name: "junk:refresh-as-access", token: full.refresh, scopes: null } },
        {
          weight: 1,
          bearer: { name: "junk:random", token: `wcoa_${randomBytes(32).toString("base64url")}`, scopes: null },
        },
      ];
      const tools = await listTools();
      const calls = fc.sample(
        fc.tuple(
          fc.oneof(...bearers.map((b) => ({ weight: b.weight, arbitrary: fc.constant(b.bearer) }))),
          callArbitrary(tools),
        ),
        { numRuns: OAUTH_CALLS, seed: s },
      );
      const auditBefore = auditRows(dbFile, "mcp_audit").length;
      let authenticated = 0;
      const statuses = new Map<string, number>();
      for (let i = 0; i < calls.length; i++) {
        const [bearer, { name, args }] = calls[i]!;
        const answer = await checkedCall(bearer.token, name, args, i);
        const needed = scopesForTool(name);
        if (bearer.scopes === null) {
          expect(answer, `${bearer.name} ${name}`).toBe("http_401");
        } else {
          authenticated += 1;
          // A token without a scope the tool needs is refused before the tool runs (403 insufficient_scope).
          if (needed.some((x) => !bearer.scopes!.has(x))) expect(answer, `${bearer.name} ${name}`).toBe("http_403");
          else expect(answer, `${bearer.name} ${name}`).not.toBe("http_403");
        }
        const tally = `${bearer.name} ${answer}`;
        statuses.set(tally, (statuses.get(tally) ?? 0) + 1);
      }
      console.log(`MCP OAuth fuzz answers ${JSON.stringify(Object.fromEntries([...statuses].sort()))}`);
      await expectAuditRows(auditBefore, authenticated);

      // Past the access tokens' lifetime (the test-only OAuth clock, after a restart) every one of them is 401.
      await stack.killServer("SIGTERM");
      stack.opts.serverEnv = { [OAUTH_TEST_CLOCK_ENV]: String(2 * 86_400_000) };
      await stack.startServer();
      stack.opts.serverEnv = {};
      const expiredBefore = auditRows(dbFile, "mcp_audit").length;
      const expired = fc.sample(
        fc.tuple(fc.constantFrom(full.access, noRun.access, readOnly.access), callArbitrary(tools)),
        { numRuns: EXPIRED_CALLS, seed: s + 1 },
      );
      for (const [i, [bearer, { name, args }]] of expired.entries())
        expect(await checkedCall(bearer, name, args, i), `expired token, ${name}`).toBe("http_401");
      await expectAuditRows(expiredBefore, 0);
      expect(okValue(await stack.observe("alice", { run_id: realRunId })).state).toBe("completed");
      console.log(
        `MCP OAuth fuzz: ${((Date.now() - t0) / 1000).toFixed(1)} s, ${authenticated} authenticated calls audited`,
      );
    },
    15 * 60_000,
  );
});
