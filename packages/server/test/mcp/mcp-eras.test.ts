/**
 * Issue 27: one /mcp serves a 2025-11-25 client (the v1 SDK) and a 2026-07-28
 * client (the v2 SDK, pinned to 2026-07-28) side by side, against a real
 * Server, a real Runner daemon and the fake ACP agent. Raw POSTs check what
 * the SDK client never sends: missing or mismatched headers, missing `_meta`.
 */
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client";
import {
  createTaskSessionFromClient,
  resultFromTaskOutcome,
  type SerializedTaskReference,
} from "@modelcontextprotocol/ext-tasks/client";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { isTerminalSafe } from "@webcodex/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { type Stack, startStack } from "../support/stack.js";
import { ok, type Structured, TERMINAL } from "../support/tool-calls.js";

const ALL = ["coding_agent:run", "project:write", "project:read", "runtime:read", "runtime:write"] as const;
const MODERN = "2026-07-28";
/** Bound on the audit writer flushing a call's row (a batch every AUDIT_FLUSH_INTERVAL_MS), on a loaded machine. */
const AUDIT_WAIT_MS = 30_000;

let stack: Stack;
let legacy: Client;
let modern: ModernClient;
let aliceToken: string;
let bobToken: string;
const modernClients: ModernClient[] = [];

async function connectModern(token: string, capabilities: Record<string, unknown> = {}): Promise<ModernClient> {
  const client = new ModernClient(
    { name: "webcodex-test-2026", version: "0" },
    { versionNegotiation: { mode: { pin: MODERN } }, capabilities },
  );
  await client.connect(
    new ModernTransport(stack.mcpUrl, { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
  );
  modernClients.push(client);
  return client;
}

beforeAll(async () => {
  stack = await startStack({
    principals: [
      { id: "alice", scopes: [...ALL], projects: ["demo"] },
      { id: "bob", scopes: [...ALL], projects: ["demo"] },
    ],
    projects: [{ id: "demo", allow_patch: true }],
    acp: { max_concurrent_runs: 8 },
  });
  aliceToken = await stack.issueToken("alice", [...ALL], ["demo"]);
  bobToken = await stack.issueToken("bob", [...ALL], ["demo"]);
  legacy = await stack.connect(aliceToken);
  modern = await connectModern(aliceToken);
});

afterAll(async () => {
  for (const c of modernClients) await c.close();
  await stack?.stop();
});

let counter = 0;
const unique = (label: string) => `${label}-${process.pid}-${++counter}`;

type ModernCallResult = { isError?: boolean; content: { type: string; text?: string }[]; structuredContent?: unknown };

async function modernCall(
  client: ModernClient,
  name: string,
  args: Record<string, unknown>,
): Promise<ModernCallResult> {
  return (await client.callTool({ name, arguments: args }, { timeout: 60_000 })) as ModernCallResult;
}

async function modernOk(client: ModernClient, name: string, args: Record<string, unknown>): Promise<Structured> {
  const result = await modernCall(client, name, args);
  const text = result.content[0]?.text ?? "";
  if (result.isError) throw new Error(`${name} failed: ${text}`);
  expect(JSON.parse(text)).toEqual(result.structuredContent);
  return result.structuredContent as Structured;
}

function modernMeta(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": { name: "raw", version: "0" },
    "io.modelcontextprotocol/clientCapabilities": {},
    ...extra,
  };
}

interface RawAnswer {
  status: number;
  body: { id?: unknown; result?: Record<string, unknown>; error?: { code: number; message: string; data?: unknown } };
}

/** One POST with exactly these MCP headers (besides auth, Accept, Content-Type). */
async function rawPost(message: Record<string, unknown>, headers: Record<string, string>, token = aliceToken) {
  const res = await fetch(stack.mcpUrl, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${token}`,
      Accept: "application/json, text/event-stream",
      "Content-Type": "application/json",
      ...headers,
    },
    body: JSON.stringify({ jsonrpc: "2.0", ...message }),
  });
  const text = await res.text();
  return { status: res.status, body: text === "" ? {} : JSON.parse(text) } as RawAnswer;
}

function modernHeaders(method: string, name?: string): Record<string, string> {
  return { "MCP-Protocol-Version": MODERN, "Mcp-Method": method, ...(name !== undefined ? { "Mcp-Name": name } : {}) };
}

describe("one /mcp, two eras", () => {
  it("answers server/discover to a 2026-07-28 client without initialize, and lists with cache hints in a fixed order", async () => {
    const discovered = await rawPost(
      { id: "d1", method: "server/discover", params: { _meta: modernMeta() } },
      modernHeaders("server/discover"),
    );
    expect(discovered.status).toBe(200);
    expect(discovered.body.id).toBe("d1");
    const result = discovered.body.result ?? {};
    expect(result.resultType).toBe("complete");
    expect(result.supportedVersions).toEqual([MODERN]);
    expect(result.capabilities).toMatchObject({ tools: {}, resources: {} });
    expect((result._meta as Record<string, unknown>)["io.modelcontextprotocol/serverInfo"]).toMatchObject({
      name: "webcodex",
    });

    const first = await rawPost(
      { id: 1, method: "tools/list", params: { _meta: modernMeta() } },
      modernHeaders("tools/list"),
    );
    const second = await rawPost(
      { id: 2, method: "tools/list", params: { _meta: modernMeta() } },
      modernHeaders("tools/list"),
    );
    expect(first.body.result).toMatchObject({ resultType: "complete", cacheScope: "public" });
    expect(first.body.result?.ttlMs).toBeGreaterThan(0);
    expect(JSON.stringify(first.body.result)).toBe(JSON.stringify(second.body.result));
    const tools = first.body.result?.tools as { name: string; inputSchema: Record<string, unknown> }[];
    expect(tools[0]?.inputSchema.$schema).toBe("https://json-schema.org/draft/2020-12/schema");

    const resources = await modern.listResources();
    expect(resources.resources.map((r) => r.uri)).toEqual(["webcodex://projects", "ui://webcodex/run"]);
    const read = await rawPost(
      { id: 3, method: "resources/read", params: { uri: "webcodex://projects", _meta: modernMeta() } },
      modernHeaders("resources/read", "webcodex://projects"),
    );
    expect(read.body.result).toMatchObject({ resultType: "complete", cacheScope: "private" });

    // The 2025-11-25 client on the same URL sees exactly what it always did: draft-7 schemas, no 2026 fields.
    const legacyTools = await legacy.listTools();
    expect(legacyTools.tools.map((t) => t.name)).toEqual(tools.map((t) => t.name));
    expect(legacyTools.tools[0]?.inputSchema.$schema).toBe("http://json-schema.org/draft-07/schema#");
    expect(legacyTools).not.toHaveProperty("resultType");
    expect(legacyTools).not.toHaveProperty("ttlMs");
  });

  it("declares the run view (MCP App ui://webcodex/run) on the run tools and serves it, the same on both eras", async () => {
    const viewTools = ["observe_coding_agent", "start_agent_task_coding_run", "start_coding_agent"];
    const lists = {
      legacy: (await legacy.listTools()).tools,
      modern: (await modern.listTools()).tools,
    };
    for (const [era, tools] of Object.entries(lists)) {
      const withView = tools.filter((t) => t._meta !== undefined).map((t) => t.name);
      expect(withView.sort(), era).toEqual(viewTools);
      for (const t of tools.filter((x) => viewTools.includes(x.name)))
        expect(t._meta, `${era} ${t.name}`).toEqual({
          ui: { resourceUri: "ui://webcodex/run" },
          "ui/resourceUri": "ui://webcodex/run",
        });
    }
    const reads = {
      legacy: await legacy.readResource({ uri: "ui://webcodex/run" }),
      modern: await modern.readResource({ uri: "ui://webcodex/run" }),
    };
    for (const [era, read] of Object.entries(reads)) {
      const content = read.contents[0] as { uri: string; mimeType: string; text: string; _meta: unknown };
      expect(content.uri, era).toBe("ui://webcodex/run");
      expect(content.mimeType, era).toBe("text/html;profile=mcp-app");
      expect(content._meta, era).toMatchObject({ ui: { csp: { connectDomains: [], resourceDomains: [] } } });
      expect(content.text, era).toMatch(/^<!doctype html>/);
      // Self-contained: nothing in the document loads from anywhere.
      expect(content.text, era).not.toMatch(/<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=/i);
    }
    const listed = (await legacy.listResources()).resources.find((r) => r.uri === "ui://webcodex/run");
    expect(listed).toMatchObject({ mimeType: "text/html;profile=mcp-app", _meta: { ui: { csp: {} } } });
  });

  it("answers an unknown resource on 2026-07-28 with invalid params naming the URI (SEP-2164)", async () => {
    const uri = `webcodex://${canary("missing-resource")}`;
    const answer = await rawPost(
      { id: 9, method: "resources/read", params: { uri, _meta: modernMeta() } },
      modernHeaders("resources/read", uri),
    );
    expect(answer.status).toBe(200);
    expect(answer.body.error).toMatchObject({ code: -32602, data: { uri } });
  });

  it("refuses missing or mismatched MCP headers and a missing _meta with 400 carrying the request's id, and starts nothing", async () => {
    const key = unique("hdr");
    const args = { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "hello" };
    const call = (id: number) => ({
      id,
      method: "tools/call",
      params: { name: "start_coding_agent", arguments: args, _meta: modernMeta() },
    });
    const cases: [string, RawAnswer][] = [
      [
        "no MCP-Protocol-Version",
        await rawPost(call(11), { "Mcp-Method": "tools/call", "Mcp-Name": "start_coding_agent" }),
      ],
      ["no Mcp-Method", await rawPost(call(12), { "MCP-Protocol-Version": MODERN, "Mcp-Name": "start_coding_agent" })],
      ["no Mcp-Name", await rawPost(call(13), modernHeaders("tools/call"))],
      ["Mcp-Method mismatch", await rawPost(call(14), modernHeaders("tools/list", "start_coding_agent"))],
      ["Mcp-Name mismatch", await rawPost(call(15), modernHeaders("tools/call", "observe_coding_agent"))],
      [
        "version mismatch",
        await rawPost(call(16), {
          ...modernHeaders("tools/call", "start_coding_agent"),
          "MCP-Protocol-Version": "2025-11-25",
        }),
      ],
    ];
    for (const [label, answer] of cases) {
      expect(answer.status, label).toBe(400);
      expect(answer.body.error?.code, label).toBe(-32020);
      expect(typeof answer.body.id, label).toBe("number");
    }
    expect(cases.map(([, a]) => a.body.id)).toEqual([11, 12, 13, 14, 15, 16]);
    expect(cases[2]?.[1].body.error?.message).toContain("Mcp-Name header is absent");
    expect(cases[4]?.[1].body.error?.message).toContain('names "observe_coding_agent"');

    const noMeta = await rawPost(
      { id: 17, method: "tools/call", params: { name: "start_coding_agent", arguments: args } },
      modernHeaders("tools/call", "start_coding_agent"),
    );
    expect(noMeta.status).toBe(400);
    expect(noMeta.body).toMatchObject({ id: 17, error: { code: -32602 } });
    expect(noMeta.body.error?.message).toContain("missing the required per-request envelope key(s): _meta");

    const future = await rawPost(
      {
        id: 18,
        method: "tools/list",
        params: { _meta: modernMeta({ "io.modelcontextprotocol/protocolVersion": "2099-01-01" }) },
      },
      { ...modernHeaders("tools/list"), "MCP-Protocol-Version": "2099-01-01" },
    );
    // Methods 2026-07-28 removed are unknown, whatever the headers say.
    const ping = await rawPost({ id: 19, method: "ping", params: { _meta: modernMeta() } }, {});
    expect(ping.status).toBe(404);
    expect(ping.body).toMatchObject({ id: 19, error: { code: -32601 } });
    expect(future.status).toBe(400);
    expect(future.body).toMatchObject({ id: 18, error: { code: -32022, data: { supported: [MODERN] } } });

    // Nothing was started under that key: the same key with other inputs is not an idempotency conflict.
    const fresh = await modernOk(modern, "start_coding_agent", {
      ...args,
      prompt: "scenario: slow interval_ms=50 count=4",
    });
    expect(fresh.run_id).toEqual(expect.any(String));
  });

  it("runs start → observe → cancel for both clients side by side, each seeing only its own runs", async () => {
    const v1 = await ok(legacy, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: unique("v1"),
      prompt: "scenario: slow interval_ms=100 count=600",
    });
    const v2 = await modernOk(modern, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: unique("v2"),
      prompt: "scenario: slow interval_ms=100 count=600",
    });
    // Same principal, either era: each client observes the other's run.
    const seenByModern = await modernOk(modern, "observe_coding_agent", { run_id: v1.run_id });
    expect(seenByModern.run_id).toBe(v1.run_id);
    const seenByLegacy = await ok(legacy, "observe_coding_agent", { run_id: v2.run_id });
    expect(seenByLegacy.run_id).toBe(v2.run_id);
    // Another principal on 2026-07-28 sees neither.
    const bob = await connectModern(bobToken);
    const foreign = await modernCall(bob, "observe_coding_agent", { run_id: v2.run_id });
    expect(foreign.isError).toBe(true);
    expect(foreign.content[0]?.text).toContain("not_found");

    await modernOk(modern, "cancel_coding_agent", { run_id: v1.run_id });
    await ok(legacy, "cancel_coding_agent", { run_id: v2.run_id });
    for (const runId of [v1.run_id, v2.run_id]) {
      let state = "";
      for (let i = 0; i < 100 && !TERMINAL.has(state); i++) {
        state = (await modernOk(modern, "observe_coding_agent", { run_id: runId, wait_secs: 2 })).state as string;
      }
      expect(state).toBe("cancelled");
    }
  });

  it("takes the 2026-07-28 recorder from _wc.record in the envelope, refuses it everywhere else by name, and a refusal starts and records nothing", async () => {
    // The session is created by the 2025-era client and records a run the 2026 client starts.
    const session = await ok(legacy, "create_workflow_session", { project_id: "demo", title: unique("rec") });
    const sessionId = session.session_id as string;
    const bobModern = await connectModern(bobToken);
    const bobSession = await modernOk(bobModern, "create_workflow_session", { project_id: "demo", title: unique("b") });
    const key = unique("rec-key");
    const args = { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: "hello" };
    const startCall = (id: number, params: Record<string, unknown>, name = "start_coding_agent") =>
      rawPost(
        { id, method: "tools/call", params: { name, arguments: args, _meta: modernMeta(), ...params } },
        modernHeaders("tools/call", name),
      );
    const errorOf = (answer: RawAnswer) => {
      const result = answer.body.result as ModernCallResult;
      expect(result.isError).toBe(true);
      return (JSON.parse(result.content[0]?.text ?? "{}") as { error: { code: string; message: string } }).error;
    };

    const inArguments = errorOf(await startCall(21, { arguments: { ...args, _wc: { record: sessionId } } }));
    expect(inArguments.code).toBe("invalid_input");
    expect(inArguments.message).toContain(
      "arguments._wc: the recorder goes in the tools/call envelope as params._wc.record",
    );
    const rootLevel = errorOf(await startCall(22, { recording_session_id: sessionId }));
    expect(rootLevel.message).toContain("params.recording_session_id: not a recorder selector");
    const oldArgument = errorOf(await startCall(23, { arguments: { ...args, workflow_session_id: sessionId } }));
    expect(oldArgument.message).toContain(
      "arguments.workflow_session_id: on a 2026-07-28 request the recorder is params._wc.record",
    );
    const foreign = errorOf(await startCall(24, { _wc: { record: bobSession.session_id } }));
    expect(foreign.code).toBe("not_found");
    expect(foreign.message).toMatch(/^_wc\.record: /);
    const extraKey = errorOf(await startCall(25, { _wc: { record: sessionId, grant: "all" } }));
    expect(extraKey.message).toContain('params._wc: only "record" is allowed');
    const notAStart = errorOf(
      await rawPost(
        {
          id: 26,
          method: "tools/call",
          params: {
            name: "observe_coding_agent",
            arguments: { run_id: "r" },
            _meta: modernMeta(),
            _wc: { record: sessionId },
          },
        },
        modernHeaders("tools/call", "observe_coding_agent"),
      ),
    );
    expect(notAStart.message).toContain("params._wc.record: this tool starts no run");
    // A 2025-era request keeps workflow_session_id and is told so when it sends the 2026 envelope.
    const legacyEnvelope = await legacy.request(
      {
        method: "tools/call",
        params: { name: "start_coding_agent", arguments: args, _wc: { record: sessionId } } as never,
      },
      (await import("@modelcontextprotocol/sdk/types.js")).CallToolResultSchema,
    );
    expect(legacyEnvelope.isError).toBe(true);
    expect((legacyEnvelope.content[0] as { text: string }).text).toContain(
      "params._wc: the 2026-07-28 envelope; on this 2025-era request name the recorder with arguments.workflow_session_id",
    );

    // None of that started a run or recorded anything: the session is empty, and the key is still free.
    const before = await modernOk(modern, "read_workflow_session", { session_id: sessionId });
    expect(before.evidence).toEqual([]);
    const started = await startCall(27, { _wc: { record: sessionId } });
    const run = started.body.result as ModernCallResult & { structuredContent: Structured; resultType: string };
    expect(run.isError).toBeFalsy();
    expect(run.resultType).toBe("complete");
    const runId = run.structuredContent.run_id as string;
    const evidence = await poll(
      async () => {
        const read = (await ok(legacy, "read_workflow_session", { session_id: sessionId })).evidence as Structured[];
        return read.some((e) => e.kind === "coding_agent_terminal") && read;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: 100, what: "the run's terminal evidence" },
    );
    expect(evidence.map((e) => e.kind)).toEqual(["coding_agent_started", "coding_agent_terminal"]);
    expect(evidence.every((e) => e.run_id === runId)).toBe(true);
    // Bob's session saw nothing.
    const bobRead = await modernOk(bobModern, "read_workflow_session", { session_id: bobSession.session_id });
    expect(bobRead.evidence).toEqual([]);
  });

  describe("runs as Tasks", () => {
    const tasksMeta = () =>
      modernMeta({
        "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } },
      });
    const startTask = (key: string, prompt: string, token = aliceToken) =>
      rawPost(
        {
          id: key,
          method: "tools/call",
          params: {
            name: "start_coding_agent",
            arguments: { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt },
            _meta: tasksMeta(),
          },
        },
        modernHeaders("tools/call", "start_coding_agent"),
        token,
      );
    const taskRequest = (method: string, taskId: string, token = aliceToken) =>
      rawPost({ id: method, method, params: { taskId, _meta: tasksMeta() } }, modernHeaders(method, taskId), token);
    const getUntil = (taskId: string, done: (r: Record<string, unknown>) => boolean) =>
      poll(
        async () => {
          const r = (await taskRequest("tasks/get", taskId)).body.result ?? {};
          return done(r) && r;
        },
        { timeoutMs: DAEMON_WAIT_MS, intervalMs: 100, what: `task ${taskId} to reach the expected status` },
      );

    it("advertises the extension, answers a declaring client's start with a task bound to the run, and a completed task carries the observe-shaped result", async () => {
      const discovered = await rawPost(
        { id: "d", method: "server/discover", params: { _meta: modernMeta() } },
        modernHeaders("server/discover"),
      );
      expect(discovered.body.result?.capabilities).toMatchObject({
        extensions: { "io.modelcontextprotocol/tasks": {} },
      });
      const key = unique("task");
      const created = (await startTask(key, "scenario: hello")).body.result ?? {};
      expect(created).toMatchObject({ resultType: "task", status: "working", ttlMs: null });
      // The start's own output rides along, so a client can follow the run's events.
      const started = (created._meta as Record<string, Structured>)["dev.webcodex/run"];
      expect(started).toMatchObject({
        run_id: expect.any(String),
        replayed: false,
        observation_token: expect.any(String),
      });
      const taskId = created.taskId as string;
      expect(taskId).toMatch(/^wc_task_[a-z2-7]{26}_[A-Za-z0-9_-]{22}$/);
      // Same key, same task.
      expect((await startTask(key, "scenario: hello")).body.result?.taskId).toBe(taskId);

      const done = await getUntil(taskId, (r) => r.status !== "working");
      expect(done).toMatchObject({
        resultType: "complete",
        taskId,
        status: "completed",
        _meta: { "dev.webcodex/run": { run_id: started?.run_id } },
      });
      const result = done.result as { resultType: string; structuredContent: Structured; content: { text: string }[] };
      expect(result.resultType).toBe("complete");
      expect(result.structuredContent).toMatchObject({ state: "completed", execution_state: "completed" });
      expect(JSON.parse(result.content[0]?.text ?? "")).toEqual(result.structuredContent);
      // The run behind the task is the same run observe reports.
      const observed = await modernOk(modern, "observe_coding_agent", { run_id: result.structuredContent.run_id });
      expect(observed.state).toBe("completed");

      // A client without the extension gets the plain tool result, unchanged.
      const plain = await modernOk(modern, "start_coding_agent", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: key,
        prompt: "scenario: hello",
      });
      expect(plain.run_id).toBe(result.structuredContent.run_id);
    });

    it("cancels the run through tasks/cancel, and refuses a foreign or made-up task id without touching the run", async () => {
      const created = (await startTask(unique("cancel"), "scenario: slow interval_ms=100 count=600")).body.result ?? {};
      const taskId = created.taskId as string;
      const runningSeen = await getUntil(taskId, (r) => r.status === "working");
      expect(runningSeen.statusMessage).toMatch(/^run (starting|running)/);

      // Bob presents Alice's task id: unknown to him, for get and cancel alike.
      for (const method of ["tasks/get", "tasks/cancel"]) {
        const foreign = await taskRequest(method, taskId, bobToken);
        expect(foreign.status, method).toBe(200);
        expect(foreign.body.error, method).toMatchObject({ code: -32602 });
        expect(foreign.body.error?.message, method).toContain("Unknown task");
      }
      // A client that did not declare the extension is told which capability the method needs.
      const undeclared = await rawPost(
        { id: 6, method: "tasks/get", params: { taskId, _meta: modernMeta() } },
        modernHeaders("tasks/get", taskId),
      );
      expect(undeclared.status).toBe(400);
      expect(undeclared.body).toMatchObject({
        id: 6,
        error: {
          code: -32021,
          data: { requiredCapabilities: { extensions: { "io.modelcontextprotocol/tasks": {} } } },
        },
      });
      const forged = `${taskId.slice(0, -4)}AAAA`;
      expect((await taskRequest("tasks/get", forged)).body.error?.message).toContain("Unknown task");
      // Header and body must agree on the task id too.
      const mismatched = await rawPost(
        { id: 5, method: "tasks/get", params: { taskId, _meta: tasksMeta() } },
        modernHeaders("tasks/get", forged),
      );
      expect(mismatched.status).toBe(400);
      expect(mismatched.body).toMatchObject({ id: 5, error: { code: -32020 } });
      expect((await getUntil(taskId, () => true)).status).toBe("working");

      const cancelled = await taskRequest("tasks/cancel", taskId);
      expect(cancelled.body.result).toEqual({ resultType: "complete" });
      const end = await getUntil(taskId, (r) => r.status !== "working");
      expect(end).toMatchObject({ status: "cancelled", taskId });
    });

    it("names the last tool step in a task's status message", async () => {
      const created = (await startTask(unique("step"), "scenario: tools")).body.result ?? {};
      const done = await getUntil(created.taskId as string, (r) => r.status !== "working");
      expect(done.status).toBe("completed");
      // scenario: tools ends with the execute step "npm test" completed.
      expect(done.statusMessage).toBe(
        "run completed; execution completed; stop reason end_turn; last tool step execute completed: npm test",
      );
      // A title full of terminal attacks (scenario: escapes) reaches the one-line message without a control character.
      const hostile = (await startTask(unique("step-esc"), "scenario: escapes")).body.result ?? {};
      const end = await getUntil(hostile.taskId as string, (r) => r.status !== "working");
      expect(end.statusMessage).toContain("last tool step");
      const message = String(end.statusMessage);
      expect(isTerminalSafe(message)).toBe(true);
      expect(message).not.toMatch(/[\n\t]/);
    });

    it("audits tasks/get like observe: the run, the outcome, and a foreign id as not_found naming no run", async () => {
      const created = (await startTask(unique("audit"), "scenario: hello")).body.result ?? {};
      const taskId = created.taskId as string;
      const runId = (created._meta as Record<string, Structured>)["dev.webcodex/run"]?.run_id;
      await getUntil(taskId, (r) => r.status !== "working");
      const rows = () =>
        stack.rows<{ principal_id: string; run_id: string | null; outcome: string; output_bytes: number }>(
          "SELECT principal_id, run_id, outcome, output_bytes FROM mcp_audit WHERE tool = 'task:get' ORDER BY id",
        );
      const bobRows = async () => (await rows()).filter((r) => r.principal_id === "bob");
      // An earlier test's foreign tasks/get may have its row already (or still on its way): count from here.
      await poll(async () => (await rows()).some((r) => r.run_id === runId), {
        timeoutMs: AUDIT_WAIT_MS,
        intervalMs: 50,
        what: "alice's tasks/get audited",
      });
      const before = (await bobRows()).length;
      expect((await taskRequest("tasks/get", taskId, bobToken)).body.error?.code).toBe(-32602);
      await poll(async () => (await bobRows()).length > before, {
        timeoutMs: AUDIT_WAIT_MS,
        intervalMs: 50,
        what: "bob's tasks/get audited",
      });
      const mine = (await rows()).filter((r) => r.run_id === runId);
      expect(mine.length).toBeGreaterThan(0);
      expect(mine.every((r) => r.principal_id === "alice" && r.outcome === "ok" && r.output_bytes > 0)).toBe(true);
      expect((await bobRows()).slice(before)).toEqual([
        { principal_id: "bob", run_id: null, outcome: "not_found", output_bytes: 0 },
      ]);
    });

    it("runs start_agent_task_coding_run as a task: tasks/get to the terminal result, and tasks/cancel cancels the run", async () => {
      const claimRun = async (instruction: string) => {
        const task = await modernOk(modern, "create_agent_task", {
          project_id: "demo",
          instruction,
          idempotency_key: unique("agent-task"),
          title: "a task",
        });
        const claim = await modernOk(modern, "start_agent_task_attempt", {
          task_id: task.task_id,
          assignee: "host-1",
        });
        const answer = await rawPost(
          {
            id: unique("atr"),
            method: "tools/call",
            params: {
              name: "start_agent_task_coding_run",
              arguments: { project_id: "demo", provider_id: "fake", attempt_ref: claim.attempt_ref },
              _meta: tasksMeta(),
            },
          },
          modernHeaders("tools/call", "start_agent_task_coding_run"),
        );
        return { task, claim, created: answer.body.result ?? {} };
      };

      const { task, claim, created } = await claimRun("scenario: hello");
      expect(created).toMatchObject({ resultType: "task", status: "working", ttlMs: null });
      const started = (created._meta as Record<string, Structured>)["dev.webcodex/run"];
      expect(started).toMatchObject({
        run_id: expect.any(String),
        task_id: task.task_id,
        attempt_id: claim.attempt_id,
        replayed: false,
      });
      const done = await getUntil(created.taskId as string, (r) => r.status !== "working");
      expect(done).toMatchObject({
        status: "completed",
        taskId: created.taskId,
        _meta: { "dev.webcodex/run": { run_id: started?.run_id } },
      });
      const result = done.result as { resultType: string; structuredContent: Structured; content: { text: string }[] };
      expect(result.resultType).toBe("complete");
      expect(result.structuredContent).toEqual({
        run_id: started?.run_id,
        state: "completed",
        execution_state: "completed",
        stop_reason: "end_turn",
        recovery_kind: "none",
        message: "The agent completed the turn.",
        history_lost: false,
      });
      expect(JSON.parse(result.content[0]?.text ?? "")).toEqual(result.structuredContent);

      const slow = await claimRun("scenario: slow interval_ms=100 count=600");
      const slowTask = slow.created.taskId as string;
      await getUntil(slowTask, (r) => typeof r.statusMessage === "string" && r.statusMessage.startsWith("run running"));
      expect((await taskRequest("tasks/cancel", slowTask, bobToken)).body.error?.message).toContain("Unknown task");
      expect((await taskRequest("tasks/cancel", slowTask)).body.result).toEqual({ resultType: "complete" });
      const end = await getUntil(slowTask, (r) => r.status !== "working");
      expect(end).toMatchObject({ status: "cancelled", taskId: slowTask });
      const runId = (slow.created._meta as Record<string, Structured>)["dev.webcodex/run"]?.run_id;
      expect((await modernOk(modern, "observe_coding_agent", { run_id: runId })).state).toBe("cancelled");
    });

    it("streams status changes of the caller's own tasks through subscriptions/listen, ending once they are terminal", async () => {
      const capabilities = { extensions: { "io.modelcontextprotocol/tasks": {} } };
      const client = await connectModern(aliceToken, capabilities);
      const created = (await startTask(unique("listen"), "scenario: slow interval_ms=100 count=30")).body.result ?? {};
      const taskId = created.taskId as string;
      const foreign = (await startTask(unique("listen-bob"), "scenario: hello", bobToken)).body.result ?? {};
      const seen: Record<string, unknown>[] = [];
      const others: string[] = [];
      client.fallbackNotificationHandler = async (n) => {
        if (n.method === "notifications/tasks") seen.push(n.params as Record<string, unknown>);
        else others.push(n.method);
      };
      // Well formed and canonically spelled (a last character with no unused bits set), but never issued.
      const madeUp = `wc_task_${"a".repeat(26)}_${canary("listen")
        .replace(/[^A-Za-z0-9]/g, "")
        .slice(0, 21)
        .padEnd(21, "A")}A`;
      const subscription = await client.listen({ taskIds: [taskId, foreign.taskId, madeUp] } as never);
      const how = await Promise.race([subscription.closed, new Promise((r) => setTimeout(() => r("timeout"), 30_000))]);
      expect(how).toBe("graceful");
      expect(others).toEqual([]);
      // Only Alice's task: first as it stood, last as completed, with the result tasks/get gives.
      expect(seen.length).toBeGreaterThanOrEqual(2);
      expect(seen.every((t) => t.taskId === taskId)).toBe(true);
      expect(seen[0]?.status).toBe("working");
      const last = seen.at(-1) ?? {};
      expect(last).toMatchObject({
        status: "completed",
        _meta: { "io.modelcontextprotocol/subscriptionId": expect.any(String) },
      });
      const polled = (await taskRequest("tasks/get", taskId)).body.result ?? {};
      expect(last.result).toEqual(polled.result);
      expect(last.statusMessage).toBe(polled.statusMessage);
      // Each notification is a change: no two in a row say the same.
      for (let i = 1; i < seen.length; i++) {
        expect(`${seen[i]?.status}|${seen[i]?.statusMessage}`).not.toBe(
          `${seen[i - 1]?.status}|${seen[i - 1]?.statusMessage}`,
        );
      }
    });

    it("acknowledges only the caller's task ids on a raw listen, refuses a bad filter by field, and a client without the extension by capability", async () => {
      const created = (await startTask(unique("raw-listen"), "scenario: hello")).body.result ?? {};
      const taskId = created.taskId as string;
      await getUntil(taskId, (r) => r.status !== "working");
      const listen = (
        id: string,
        notifications: unknown,
        meta = tasksMeta(),
        token = aliceToken,
        signal?: AbortSignal,
      ) =>
        fetch(stack.mcpUrl, {
          method: "POST",
          ...(signal ? { signal } : {}),
          headers: {
            Authorization: `Bearer ${token}`,
            Accept: "application/json, text/event-stream",
            "Content-Type": "application/json",
            ...modernHeaders("subscriptions/listen"),
          },
          body: JSON.stringify({
            jsonrpc: "2.0",
            id,
            method: "subscriptions/listen",
            params: { notifications, _meta: meta },
          }),
        });
      // Bob asks for Alice's task: acknowledged with nothing, closed at once, nothing about her task sent.
      const bobs = await listen("b1", { taskIds: [taskId] }, tasksMeta(), bobToken);
      expect(bobs.headers.get("content-type")).toBe("text/event-stream");
      const bobText = await bobs.text();
      const bobMessages = bobText
        .split("\n")
        .filter((l) => l.startsWith("data: "))
        .map((l) => JSON.parse(l.slice(6)) as Record<string, unknown>);
      expect(bobMessages).toEqual([
        {
          jsonrpc: "2.0",
          method: "notifications/subscriptions/acknowledged",
          params: { notifications: {}, _meta: { "io.modelcontextprotocol/subscriptionId": "b1" } },
        },
        {
          jsonrpc: "2.0",
          id: "b1",
          result: {
            resultType: "complete",
            _meta: {
              "io.modelcontextprotocol/subscriptionId": "b1",
              "io.modelcontextprotocol/serverInfo": expect.any(Object),
            },
          },
        },
      ]);
      expect(bobText).not.toContain(taskId);
      // Alice gets her terminal task at once, then the closing result.
      const mine = await (await listen("a1", { taskIds: [taskId] })).text();
      expect(mine).toContain('"method":"notifications/tasks"');
      expect(mine).toContain('"status":"completed"');

      const badFilter = (await (await listen("x1", { taskIds: "all" })).json()) as RawAnswer["body"];
      expect(badFilter).toMatchObject({ id: "x1", error: { code: -32602 } });
      expect(badFilter.error?.message).toContain("params.notifications.taskIds: must be an array");
      const tooMany = (await (
        await listen("x2", { taskIds: Array.from({ length: 33 }, (_, i) => `t${i}`) })
      ).json()) as RawAnswer["body"];
      expect(tooMany.error?.message).toContain("at most 32 task ids");
      const undeclared = await (await listen("x3", { taskIds: [taskId] }, modernMeta())).json();
      expect(undeclared).toMatchObject({
        id: "x3",
        error: {
          code: -32021,
          data: { requiredCapabilities: { extensions: { "io.modelcontextprotocol/tasks": {} } } },
        },
      });

      // At most 4 open streams per principal: a fifth is refused by name; closing one makes room.
      const slow =
        (await startTask(unique("listen-cap"), "scenario: slow interval_ms=100 count=600")).body.result ?? {};
      const slowId = slow.taskId as string;
      const aborts = Array.from({ length: 4 }, () => new AbortController());
      const open = await Promise.all(
        aborts.map((a, i) => listen(`cap${i}`, { taskIds: [slowId] }, tasksMeta(), aliceToken, a.signal)),
      );
      expect(open.map((r) => r.headers.get("content-type"))).toEqual(Array(4).fill("text/event-stream"));
      const fifth = (await (await listen("cap4", { taskIds: [slowId] })).json()) as RawAnswer["body"];
      expect(fifth).toMatchObject({ id: "cap4", error: { code: -32603 } });
      expect(fifth.error?.message).toContain("at most 4 open subscriptions/listen streams per principal");
      // Bob is not held to Alice's count.
      const bobAbort = new AbortController();
      const bobOpen = await listen("bob-cap", { taskIds: [slowId] }, tasksMeta(), bobToken, bobAbort.signal);
      expect(bobOpen.headers.get("content-type")).toBe("text/event-stream");
      bobAbort.abort();
      aborts[0]?.abort();
      // The aborted stream's slot is released once the Server saw it close: a retry gets a stream then.
      await poll(
        async () => {
          const r = await listen("cap5", { taskIds: [slowId] }, tasksMeta(), aliceToken, aborts[1]?.signal);
          if (r.headers.get("content-type") === "text/event-stream") return true;
          await r.text();
          return false;
        },
        { timeoutMs: DAEMON_WAIT_MS, intervalMs: 50, what: "a stream again once one was closed" },
      );
      for (const a of aborts) a.abort();
      await taskRequest("tasks/cancel", slowId);
      // Each stream that ended has its audit row.
      const listenRows = () =>
        stack.rows<{ outcome: string; output_bytes: number }>(
          "SELECT outcome, output_bytes FROM mcp_audit WHERE tool = 'task:listen' AND principal_id = 'alice'",
        );
      const audited = (r: { outcome: string; output_bytes: number }) =>
        r.outcome === "too_many_observers" || (r.outcome === "ok" && r.output_bytes > 0);
      // Both rows: the refused fifth stream's and an ended stream's (written when the Server saw it end).
      await poll(async () => new Set((await listenRows()).filter(audited).map((r) => r.outcome)).size === 2, {
        timeoutMs: AUDIT_WAIT_MS,
        intervalMs: 50,
        what: "the listen streams' audit rows",
      });
    });

    it("interoperates with the published Tasks client: a start settles as the run's observe-shaped result, and a later session resumes the task by its reference", async () => {
      const capabilities = { extensions: { "io.modelcontextprotocol/tasks": {} } };
      const client = await connectModern(aliceToken, capabilities);
      const framing = {
        protocolVersion: MODERN,
        clientInfo: { name: "webcodex-test-2026", version: "0" },
        clientCapabilities: capabilities,
      };
      const rawDispatch = async (request: unknown) => {
        // The host coordinator owns JSON-RPC framing: the package hands over method and params only.
        const r = request as { method: string; params?: Record<string, unknown> };
        const name = r.params?.name ?? r.params?.taskId ?? r.params?.uri;
        const answer = await rawPost(
          { id: unique("rpc"), ...(request as Record<string, unknown>) },
          modernHeaders(r.method, typeof name === "string" ? name : undefined),
        );
        return { jsonrpc: "2.0", ...answer.body } as never;
      };
      const session = createTaskSessionFromClient(client as never, {
        endpointId: "webcodex-test",
        rawDispatch,
        v2RequestFraming: framing,
      });
      const execution = await session.callTool(
        "start_coding_agent",
        { project_id: "demo", provider_id: "fake", idempotency_key: unique("ext"), prompt: "scenario: hello" },
        { task: { preference: "require" } },
      );
      expect(execution.kind).toBe("task");
      if (execution.kind !== "task") return;
      let reference: SerializedTaskReference | undefined;
      await execution.handoff((r) => {
        reference = r;
      });
      // Dropped, not closed, like a process that exits: closing a session cancels executions it
      // still lists, handed-off ones included (ext-tasks 0.2.2).
      void session;
      if (reference === undefined) throw new Error("no task reference was handed off");

      const later = createTaskSessionFromClient((await connectModern(aliceToken, capabilities)) as never, {
        endpointId: "webcodex-test",
        rawDispatch,
        v2RequestFraming: framing,
      });
      const resumed = await later.resumeTask(reference);
      const { outcome } = await resumed.settle();
      const result = resultFromTaskOutcome(outcome) as { structuredContent: Structured };
      expect(result.structuredContent).toMatchObject({ state: "completed", execution_state: "completed" });
      await later.close();
    });
  });
});
