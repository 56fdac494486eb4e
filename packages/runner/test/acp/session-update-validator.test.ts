/**
 * The generated session/update validators (acp/session-update-validator.ts) are never more lenient than the
 * SDK's own parse and never change what the turn receives: whatever they accept, the SDK accepts and hands to
 * its handler deep-equal to the input. Checked against the SDK through its public client
 * (`client().onNotification("session/update")`), for the updates the fake agent's scenarios write and for
 * fuzzed updates; and end to end, the Runner's connection delivers exactly the sequence a bare SDK client
 * delivers (same accepted updates, same values, same order).
 */
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { type AnyMessage, client, ndJsonStream, type SessionNotification } from "@agentclientprotocol/sdk";
import fc from "fast-check";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { FAKE_AGENT_BIN } from "../../../../scripts/test-support/index.js";
import { AcpClientConnection } from "../../src/acp/session.js";
import { isAvailable, sessionUpdateValidators } from "../../src/acp/session-update-validator.js";
import type { AgentChild } from "../../src/process/spawn.js";
import { makeWorkspace } from "../support/harness.js";

const loaded = await sessionUpdateValidators;
if (!isAvailable(loaded)) throw new Error(`the generated validators did not load: ${loaded.reason} (${loaded.detail})`);
const validators = loaded;

/** Fuzzed updates per property run, and in the end-to-end stream. */
const FUZZ_RUNS = 3000;
const STREAM_UPDATES = 1500;
/** Upper bound on one fake agent scenario run. */
const SCENARIO_TIMEOUT_MS = 20_000;

/** Every `sessionUpdate` variant of ACP v1, with rich valid examples (optional fields, nested unions, `_meta`). */
const text = { type: "text", text: "hello", annotations: { audience: ["user"], priority: 0.5, lastModified: "x" } };
const SEEDS: Record<string, unknown>[] = [
  { sessionUpdate: "user_message_chunk", content: text, messageId: "m1" },
  { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "a" }, _meta: { k: [1, { v: null }] } },
  { sessionUpdate: "agent_message_chunk", content: { type: "image", data: "aGk=", mimeType: "image/png", uri: null } },
  { sessionUpdate: "agent_thought_chunk", content: { type: "audio", data: "aGk=", mimeType: "audio/wav" } },
  {
    sessionUpdate: "agent_message_chunk",
    content: { type: "resource_link", name: "a", uri: "file:///a", size: 12, title: "t", description: null },
  },
  {
    sessionUpdate: "agent_thought_chunk",
    content: { type: "resource", resource: { uri: "file:///a", text: "x", mimeType: "text/plain" } },
  },
  { sessionUpdate: "user_message_chunk", content: { type: "resource", resource: { uri: "file:///b", blob: "aGk=" } } },
  {
    sessionUpdate: "tool_call",
    toolCallId: "t1",
    title: "Edit",
    kind: "edit",
    status: "pending",
    name: "edit_file",
    content: [
      { type: "diff", path: "/p/a.ts", oldText: "a", newText: "b" },
      { type: "content", content: { type: "text", text: "ok" } },
      { type: "terminal", terminalId: "term-1" },
    ],
    locations: [{ path: "/p/a.ts", line: 3 }, { path: "/p/b.ts" }],
    rawInput: { command: ["ls", "-la"], n: 1 },
    rawOutput: "done",
  },
  {
    sessionUpdate: "tool_call_update",
    toolCallId: "t1",
    status: "completed",
    kind: null,
    title: "Edited",
    content: null,
    locations: [{ path: "/p/a.ts", line: null }],
  },
  {
    sessionUpdate: "plan",
    entries: [
      { content: "step", priority: "high", status: "pending" },
      { content: "two", priority: "low", status: "completed" },
    ],
  },
  {
    sessionUpdate: "available_commands_update",
    availableCommands: [
      { name: "init", description: "d", input: { hint: "h" } },
      { name: "web", description: "", input: null },
    ],
  },
  { sessionUpdate: "current_mode_update", currentModeId: "code" },
  {
    sessionUpdate: "config_option_update",
    configOptions: [
      {
        type: "select",
        id: "model",
        name: "Model",
        category: "model",
        currentValue: "a",
        options: [{ value: "a", name: "A" }],
      },
      {
        type: "select",
        id: "effort",
        name: "Effort",
        description: null,
        currentValue: "h",
        options: [{ group: "g", name: "G", options: [{ value: "h", name: "High" }] }],
      },
      { type: "boolean", id: "fast", name: "Fast", currentValue: true, category: "custom" },
    ],
  },
  { sessionUpdate: "session_info_update", title: "A title", updatedAt: "2026-01-01T00:00:00Z" },
  { sessionUpdate: "usage_update", used: 10, size: 100, cost: { amount: 0.25, currency: "USD" } },
  { sessionUpdate: "notice", severity: "warning", title: "Heads up", description: "d" },
  { sessionUpdate: "compaction_update", compactionId: "c1", status: "completed", summary: [text], error: null },
  { sessionUpdate: "compaction_summary_chunk", compactionId: "c1", content: { type: "text", text: "s" } },
];

const notification = (update: unknown): Record<string, unknown> => ({ sessionId: "s1", update });

/** An object whose own key is `__proto__` (as JSON.parse makes it), with `value` under it. */
const protoKeyed = (value: unknown): unknown => JSON.parse(`{"__proto__":${JSON.stringify(value) ?? "null"}}`);

type Path = (string | number)[];
function pathsOf(value: unknown, at: Path = []): Path[] {
  const out: Path[] = [at];
  if (Array.isArray(value)) {
    for (const [i, v] of value.entries()) out.push(...pathsOf(v, [...at, i]));
  } else if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) out.push(...pathsOf(v, [...at, k]));
  }
  return out;
}

/** Edge values that sit on the SDK's salvage and range boundaries. */
const EDGE_VALUES: unknown[] = [
  null,
  "",
  "other",
  0,
  -1,
  1.5,
  4294967295,
  4294967296,
  2 ** 53 + 2,
  true,
  [],
  {},
  [null],
  { type: "bogus" },
  protoKeyed(1),
];

type Mutation = { at: number; op: "delete" | "set" | "add" | "edge" | "proto" | "append"; value: unknown };
const mutation: fc.Arbitrary<Mutation> = fc.record({
  at: fc.nat(),
  op: fc.constantFrom("delete", "set", "add", "edge", "proto", "append"),
  value: fc.oneof(fc.jsonValue({ maxDepth: 2 }), fc.constantFrom(...EDGE_VALUES)),
});

function mutate(seed: unknown, mutations: Mutation[]): unknown {
  let root = structuredClone(seed);
  for (const { at, op, value: shared } of mutations) {
    // Values may be shared between runs (EDGE_VALUES): never insert, then mutate, the same object twice.
    const m = { at, op, value: structuredClone(shared) };
    const paths = pathsOf(root);
    const path = paths[m.at % paths.length] ?? [];
    if (path.length === 0) {
      if (m.op === "set" || m.op === "edge") root = m.value;
      continue;
    }
    const parent = path.slice(0, -1).reduce<unknown>((v, k) => (v as Record<string, unknown>)[k], root) as Record<
      string | number,
      unknown
    >;
    const key = path[path.length - 1] as string | number;
    const target = parent[key];
    if (m.op === "delete") {
      if (Array.isArray(parent)) parent.splice(key as number, 1);
      else delete parent[key];
    } else if (m.op === "set" || m.op === "edge") parent[key] = m.value;
    else if (m.op === "add" && target !== null && typeof target === "object" && !Array.isArray(target)) {
      (target as Record<string, unknown>)[`x${m.at % 7}`] = m.value;
    } else if (m.op === "proto" && target !== null && typeof target === "object" && !Array.isArray(target)) {
      Object.defineProperty(target, "__proto__", {
        value: m.value,
        enumerable: true,
        writable: true,
        configurable: true,
      });
    } else if (m.op === "append" && Array.isArray(target)) target.push(m.value);
  }
  return root;
}

/** A session/update params value: a mutated seed, a random update of a known variant, or any JSON value. */
const fuzzedParams: fc.Arbitrary<unknown> = fc
  .oneof(
    { weight: 6, arbitrary: fc.tuple(fc.constantFrom(...SEEDS), fc.array(mutation, { maxLength: 3 })) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.constantFrom(...validators.variants), fc.dictionary(fc.string({ maxLength: 12 }), fc.jsonValue()))
        .map(([sessionUpdate, rest]) => [{ ...rest, sessionUpdate }, []] as const),
    },
    { weight: 1, arbitrary: fc.jsonValue().map((v) => [v, []] as const) },
  )
  .map(([seed, mutations]) => {
    const mutated = mutate(notification(seed), [...mutations]);
    return mutated;
  });

/** The SDK's own parse through its public client: the value its handler receives, or `rejected`. */
function sdkParse(): (params: unknown) => Promise<{ delivered: SessionNotification } | "rejected"> {
  let input!: ReadableStreamDefaultController<AnyMessage>;
  const readable = new ReadableStream<AnyMessage>({
    start(controller) {
      input = controller;
    },
  });
  const got: SessionNotification[] = [];
  client({ name: "reference" })
    .onNotification("session/update", (ctx) => {
      got.push(ctx.params);
    })
    .connect({ readable, writable: new WritableStream<AnyMessage>() });
  return async (params) => {
    const before = got.length;
    input.enqueue({ jsonrpc: "2.0", method: "session/update", params } as AnyMessage);
    // The SDK handles a notification in microtasks: one macrotask later it was delivered or rejected.
    await new Promise((resolve) => setImmediate(resolve));
    return got.length > before ? { delivered: got[got.length - 1] as SessionNotification } : "rejected";
  };
}

/** Asserts the contract for one params value; returns whether the generated validator accepted it. */
async function check(parse: ReturnType<typeof sdkParse>, params: unknown): Promise<boolean> {
  const sdk = await parse(structuredClone(params));
  const fast = validators.accepts(params);
  if (fast) {
    expect(sdk, JSON.stringify(params)).not.toBe("rejected");
    expect((sdk as { delivered: unknown }).delivered).toStrictEqual(params);
  }
  return fast;
}

/** Runs one fake agent scenario over raw ndjson and returns every session/update params it wrote. */
async function scenarioUpdates(prompt: string): Promise<unknown[]> {
  const ws = makeWorkspace();
  const agent = spawn(process.execPath, [FAKE_AGENT_BIN], { cwd: ws.projectRoot, stdio: ["pipe", "pipe", "ignore"] });
  const send = (message: unknown) => agent.stdin.write(`${JSON.stringify(message)}\n`);
  const updates: unknown[] = [];
  const done = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`scenario did not finish: ${prompt}`)), SCENARIO_TIMEOUT_MS);
    createInterface({ input: agent.stdout }).on("line", (line) => {
      const message = JSON.parse(line) as { id?: number; method?: string; params?: unknown; result?: unknown };
      if (message.method === "session/update") updates.push(message.params);
      else if (message.method === "session/request_permission") {
        send({ jsonrpc: "2.0", id: message.id, result: { outcome: { outcome: "cancelled" } } });
      } else if (message.method !== undefined && message.id !== undefined) {
        send({ jsonrpc: "2.0", id: message.id, error: { code: -32601, message: "Method not found" } });
      } else if (message.id === 1) {
        send({ jsonrpc: "2.0", id: 2, method: "session/new", params: { cwd: ws.projectRoot, mcpServers: [] } });
      } else if (message.id === 2) {
        const sessionId = (message.result as { sessionId: string }).sessionId;
        send({
          jsonrpc: "2.0",
          id: 3,
          method: "session/prompt",
          params: { sessionId, prompt: [{ type: "text", text: prompt }] },
        });
      } else if (message.id === 3) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1, clientCapabilities: {} } });
  try {
    await done;
  } finally {
    agent.stdin.end();
    agent.kill();
    ws.cleanup();
  }
  return updates;
}

/** The fake agent's scenarios that write session/updates. */
const SCENARIO_PROMPTS = [
  "scenario: hello",
  "scenario: tools",
  "scenario: burst count=40 kind=tool",
  "scenario: burst count=40 kind=message",
  "scenario: permission",
  "scenario: agent_state",
  "scenario: ignored_updates",
  "scenario: escapes",
  "scenario: fs_request",
];

beforeEach(() => {
  // The SDK reports each update it rejects on console.error.
  vi.spyOn(console, "error").mockImplementation(() => {});
});
afterEach(() => {
  vi.restoreAllMocks();
});

describe("generated session/update validators", () => {
  it("cover every variant of the SDK's exported schema", () => {
    expect([...validators.variants].sort()).toEqual([...new Set(SEEDS.map((s) => s.sessionUpdate as string))].sort());
  });

  it("accept every update the fake agent's scenarios write, which the SDK delivers unchanged", async () => {
    const parse = sdkParse();
    let total = 0;
    for (const prompt of SCENARIO_PROMPTS) {
      const updates = await scenarioUpdates(prompt);
      expect(updates.length, prompt).toBeGreaterThan(0);
      for (const params of updates) {
        expect(await check(parse, params), JSON.stringify(params)).toBe(true);
        total++;
      }
    }
    expect(total).toBeGreaterThan(100);
  }, 120_000);

  it("accept nothing the SDK would reject or change: every field of every seed deleted, or set to each edge value", async () => {
    const parse = sdkParse();
    let accepted = 0;
    let checked = 0;
    for (const seed of SEEDS) {
      const paths = pathsOf(notification(seed));
      for (let at = 0; at < paths.length; at++) {
        const edits: Mutation[] = [
          { at, op: "delete", value: null },
          { at, op: "add", value: 1 },
          { at, op: "proto", value: {} },
          ...EDGE_VALUES.map((value): Mutation => ({ at, op: "edge", value })),
        ];
        for (const edit of edits) {
          if (await check(parse, mutate(notification(seed), [edit]))) accepted++;
          checked++;
        }
      }
    }
    expect(accepted).toBeGreaterThan(checked / 20);
  }, 120_000);

  it("accept every rich seed, and accept nothing the SDK would reject or change (fuzzed)", async () => {
    const parse = sdkParse();
    for (const seed of SEEDS) expect(await check(parse, notification(seed)), JSON.stringify(seed)).toBe(true);
    let accepted = 0;
    let runs = 0;
    await fc.assert(
      fc.asyncProperty(fuzzedParams, async (params) => {
        runs++;
        if (await check(parse, params)) accepted++;
      }),
      { numRuns: FUZZ_RUNS },
    );
    // The fuzz reaches both sides of the boundary.
    expect(accepted).toBeGreaterThan(runs / 10);
    expect(accepted).toBeLessThan(runs - runs / 10);
  }, 120_000);
});

/** An AgentChild over in-memory streams, `lines` written to its stdout at once. */
function childWriting(lines: string[]): AgentChild {
  const encoder = new TextEncoder();
  const stdout = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const line of lines) controller.enqueue(encoder.encode(`${line}\n`));
    },
  });
  return {
    pid: 0,
    pgid: 0,
    startTime: null,
    stdin: new WritableStream<Uint8Array>(),
    stdout,
    exited: new Promise(() => {}),
    exit: null,
    stderrBytes: 0,
    stderrTail: () => "",
    terminateTree: async () => ({ escalation: "eof", survivors: 0 }),
  };
}

describe("the Runner's connection", () => {
  it("delivers exactly the sequence a bare SDK client delivers, mixing direct and SDK-path updates", async () => {
    const params = fc.sample(fuzzedParams, { numRuns: STREAM_UPDATES, seed: 26 });
    const lines = params.map((p) => JSON.stringify({ jsonrpc: "2.0", method: "session/update", params: p }));
    // A marker update last: once it arrived, every earlier one has been delivered or rejected.
    const marker = notification({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: "end" } });
    lines.push(JSON.stringify({ jsonrpc: "2.0", method: "session/update", params: marker }));
    const untilMarker = (seen: SessionNotification[]) => (n: SessionNotification) => {
      seen.push(n);
      return n.update.sessionUpdate === "agent_message_chunk" && (n.update.content as { text?: string }).text === "end";
    };

    const viaRunner: SessionNotification[] = [];
    const runnerDone = new Promise<void>((resolve) => {
      const last = untilMarker(viaRunner);
      const conn = new AcpClientConnection(childWriting(lines), {
        onSessionUpdate: (n) => {
          if (last(n)) {
            conn.close();
            resolve();
          }
        },
        onPermissionRequest: async () => ({ outcome: { outcome: "cancelled" } }),
        onUnsupportedRequest: () => {},
      });
    });
    await runnerDone;

    const viaSdk: SessionNotification[] = [];
    const sdkChild = childWriting(lines);
    await new Promise<void>((resolve) => {
      const last = untilMarker(viaSdk);
      const connection = client({ name: "reference" })
        .onNotification("session/update", (ctx) => {
          if (last(ctx.params)) {
            connection.close();
            resolve();
          }
        })
        .connect(ndJsonStream(sdkChild.stdin, sdkChild.stdout));
    });

    const direct = params.filter((p) => validators.accepts(JSON.parse(JSON.stringify(p)))).length;
    expect(direct).toBeGreaterThan(STREAM_UPDATES / 10);
    expect(viaSdk.length - 1).toBeGreaterThan(direct); // some updates took the SDK's path (salvaged)
    expect(viaRunner).toStrictEqual(viaSdk);
  });
});
