/**
 * Issue 39 §5: per-principal bounds that hold under races, through a real 2026-07-28 MCP client over HTTP
 * against the in-process stack (real Runner, fake agent; on PostgreSQL in the PostgreSQL pass).
 *
 * - Many concurrent `subscriptions/listen` of one principal: at most LISTEN_MAX_PER_PRINCIPAL open, the rest
 *   refused by name; the bound is free again once they end.
 * - A listen holds one slot of the principal's waiting-observe bound: listens and waiting observes together
 *   never pass it.
 * - A task id spelled non-canonically (the MAC's last base64url character with its unused bits set) is
 *   refused with the field named, on a listen and on tasks/get.
 */
import { setMaxListeners } from "node:events";
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { poll } from "../../../../scripts/test-support/index.js";
import { LISTEN_MAX_PER_PRINCIPAL } from "../../src/mcp/task-listen.js";
import { DEFAULT_MAX_WAITING_OBSERVES } from "../../src/runs/observe-limits.js";
import { type Stack, startStack } from "../support/stack.js";

const ALL = ["coding_agent:run", "project:write", "project:read", "runtime:read", "runtime:write"] as const;
const MODERN = "2026-07-28";
const TASKS = { extensions: { "io.modelcontextprotocol/tasks": {} } };
/** Concurrent listens (and observes) one principal sends at once: well past both bounds. */
const RACERS = 24;
/** A run that ticks once, then waits this long: nothing new for any waiting observe while the test runs. */
const QUIET_PROMPT = "scenario: slow interval_ms=600000 count=2";

let stack: Stack;
let aliceToken: string;
const clients: ModernClient[] = [];
let counter = 0;
const unique = (label: string) => `${label}-${process.pid}-${++counter}`;

async function connect(token: string): Promise<ModernClient> {
  const client = new ModernClient(
    { name: "caps-races", version: "0" },
    { versionNegotiation: { mode: { pin: MODERN } }, capabilities: TASKS },
  );
  await client.connect(
    new ModernTransport(stack.mcpUrl, { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
  );
  clients.push(client);
  return client;
}

function tasksMeta(): Record<string, unknown> {
  return {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": { name: "raw", version: "0" },
    "io.modelcontextprotocol/clientCapabilities": TASKS,
  };
}

async function rawPost(message: Record<string, unknown>, method: string, name?: string) {
  const res = await fetch(stack.mcpUrl, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${aliceToken}`,
      Accept: "application/json, text/event-stream",
      "Content-Type": "application/json",
      "MCP-Protocol-Version": MODERN,
      "Mcp-Method": method,
      ...(name !== undefined ? { "Mcp-Name": name } : {}),
    },
    body: JSON.stringify({ jsonrpc: "2.0", ...message }),
  });
  return (await res.json()) as { result?: Record<string, unknown>; error?: { code: number; message: string } };
}

/** A task-backed start of a quiet run: its task id, run id and the start's observation token. */
async function startQuietTask(): Promise<{ taskId: string; runId: string }> {
  const key = unique("quiet");
  const answer = await rawPost(
    {
      id: key,
      method: "tools/call",
      params: {
        name: "start_coding_agent",
        arguments: { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt: QUIET_PROMPT },
        _meta: tasksMeta(),
      },
    },
    "tools/call",
    "start_coding_agent",
  );
  const result = answer.result ?? {};
  const run = (result._meta as Record<string, { run_id: string }>)["dev.webcodex/run"];
  if (typeof result.taskId !== "string" || run === undefined) throw new Error(`no task: ${JSON.stringify(answer)}`);
  return { taskId: result.taskId, runId: run.run_id };
}

/** The observation token after the quiet run's first tick: a wait with it has nothing new for minutes. */
async function quietToken(client: ModernClient, runId: string): Promise<string> {
  let token = "";
  await poll(
    async () => {
      const r = (await client.callTool({ name: "observe_coding_agent", arguments: { run_id: runId } })) as {
        structuredContent?: { state: string; events: unknown[]; observation_token: string };
      };
      const s = r.structuredContent;
      if (s?.state !== "running" || s.events.length === 0) return false;
      token = s.observation_token;
      return true;
    },
    { timeoutMs: 60_000, what: "the quiet run's first tick" },
  );
  // Read past everything that is there by now (the tick may have come in more than one answer).
  for (;;) {
    const r = (await client.callTool({
      name: "observe_coding_agent",
      arguments: { run_id: runId, after_observation_token: token },
    })) as { structuredContent?: { events: unknown[]; observation_token: string } };
    token = r.structuredContent?.observation_token ?? token;
    if ((r.structuredContent?.events.length ?? 0) === 0) return token;
  }
}

/** `n` listens at once (each on its own connected client, sent together); the open ones, and the refusals' messages. */
async function listenAll(taskIds: string[], n: number) {
  const racers = await Promise.all(Array.from({ length: n }, () => connect(aliceToken)));
  const settled = await Promise.allSettled(racers.map((client) => client.listen({ taskIds } as never)));
  const open = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
  const refused = settled.flatMap((s) => (s.status === "rejected" ? [String((s.reason as Error).message)] : []));
  return { open, refused };
}

/** Exactly `n` open listens (the Server frees the slots of closed ones when it sees them close). */
async function openListens(taskIds: string[], n: number) {
  let open: Awaited<ReturnType<typeof listenAll>>["open"] = [];
  await poll(
    async () => {
      for (const s of open) await s.close();
      open = (await listenAll(taskIds, n)).open;
      return open.length === n;
    },
    { timeoutMs: 30_000, what: `${n} listens to open` },
  );
  return open;
}

beforeAll(async () => {
  stack = await startStack({
    principals: [{ id: "alice", scopes: [...ALL], projects: ["demo"] }],
    projects: [{ id: "demo", allow_patch: true }],
    acp: { max_concurrent_runs: 8 },
  });
  aliceToken = await stack.issueToken("alice", [...ALL], ["demo"]);
}, 120_000);

afterAll(async () => {
  for (const c of clients) await c.close().catch(() => undefined);
  await stack?.stop();
}, 120_000);

describe("per-principal bounds under races", () => {
  it("lets at most LISTEN_MAX_PER_PRINCIPAL of many concurrent listens open, refuses the rest by name, and frees the bound when they end", async () => {
    const { taskId } = await startQuietTask();
    const { open, refused } = await listenAll([taskId], RACERS);
    expect(open.length).toBe(LISTEN_MAX_PER_PRINCIPAL);
    expect(refused.length).toBe(RACERS - LISTEN_MAX_PER_PRINCIPAL);
    for (const message of refused) {
      expect(message).toContain(`at most ${LISTEN_MAX_PER_PRINCIPAL} open subscriptions/listen streams per principal`);
    }
    for (const s of open) await s.close();
    // Once the Server has seen them close, the bound is whole again.
    let again: Awaited<ReturnType<typeof listenAll>> | undefined;
    await poll(
      async () => {
        for (const s of again?.open ?? []) await s.close();
        again = await listenAll([taskId], LISTEN_MAX_PER_PRINCIPAL);
        return again.open.length === LISTEN_MAX_PER_PRINCIPAL;
      },
      { timeoutMs: 30_000, what: "the listen bound to be free again" },
    );
    for (const s of again?.open ?? []) await s.close();
    await rawPost(
      { id: unique("cancel"), method: "tasks/cancel", params: { taskId, _meta: tasksMeta() } },
      "tasks/cancel",
      taskId,
    );
  }, 180_000);

  it("counts each open listen against the waiting-observe bound", async () => {
    const { taskId, runId } = await startQuietTask();
    const observer = await connect(aliceToken);
    const token = await quietToken(observer, runId);
    const open = await openListens([taskId], LISTEN_MAX_PER_PRINCIPAL);
    // RACERS waiting observes at once: only what the listens left of the bound may wait.
    const room = DEFAULT_MAX_WAITING_OBSERVES - LISTEN_MAX_PER_PRINCIPAL;
    const abort = new AbortController();
    setMaxListeners(RACERS * 2, abort.signal);
    const refusals: string[] = [];
    const waits = Array.from({ length: RACERS }, async () => {
      const r = (await observer.callTool(
        { name: "observe_coding_agent", arguments: { run_id: runId, after_observation_token: token, wait_secs: 30 } },
        { signal: abort.signal, timeout: 120_000 },
      )) as { isError?: boolean; content: { text?: string }[] };
      if (!r.isError) return;
      const { error } = JSON.parse(r.content[0]?.text ?? "{}") as { error?: { code?: string; message?: string } };
      if (error?.code === "too_many_observers") refusals.push(error.message ?? "");
    });
    await poll(async () => refusals.length >= RACERS - room, {
      timeoutMs: 60_000,
      what: "the observes past the bound to be refused",
    });
    expect(refusals.length).toBe(RACERS - room);
    expect(refusals[0]).toContain(`limit ${DEFAULT_MAX_WAITING_OBSERVES}`);
    abort.abort();
    await Promise.allSettled(waits);

    // And the other way round: with the bound full of waiting observes, a listen is refused by name.
    for (const s of open) await s.close();
    const full = new AbortController();
    setMaxListeners(RACERS * 2, full.signal);
    let refusedListen = "";
    // Waiting observes topped up to the whole bound (the aborted ones above are freed once the Server sees them go).
    const held: Promise<unknown>[] = [];
    let waiting = 0;
    const hold = () => {
      waiting += 1;
      const settle = () => {
        waiting -= 1;
      };
      held.push(
        observer
          .callTool(
            {
              name: "observe_coding_agent",
              arguments: { run_id: runId, after_observation_token: token, wait_secs: 30 },
            },
            { signal: full.signal, timeout: 120_000 },
          )
          .then(settle, settle),
      );
    };
    await poll(
      async () => {
        while (waiting < DEFAULT_MAX_WAITING_OBSERVES) hold();
        const { open: more, refused } = await listenAll([taskId], 1);
        for (const s of more) await s.close();
        refusedListen = refused[0] ?? "";
        return refused.length === 1 && refusedListen.includes("Too many waiting observe calls");
      },
      { timeoutMs: 60_000, what: "a listen refused while the observe bound is full" },
    );
    expect(refusedListen).toContain("each listen counts as one");
    full.abort();
    await Promise.allSettled(held);
    await rawPost(
      { id: unique("cancel"), method: "tasks/cancel", params: { taskId, _meta: tasksMeta() } },
      "tasks/cancel",
      taskId,
    );
  }, 180_000);

  it("refuses a task id whose MAC is spelled non-canonically, naming the field, on a listen and on tasks/get", async () => {
    const { taskId } = await startQuietTask();
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const last = alphabet.indexOf(taskId.slice(-1));
    // The last of 22 characters carries 2 bits of the 16-byte MAC; its 4 low bits are unused.
    const spellings = [1, 2, 4, 8, 15].map((flip) => `${taskId.slice(0, -1)}${alphabet[last ^ flip]}`);
    for (const other of spellings)
      expect(Buffer.from(other.slice(-22), "base64url")).toEqual(Buffer.from(taskId.slice(-22), "base64url"));

    const client = await connect(aliceToken);
    const refusal = await client.listen({ taskIds: [taskId, spellings[0]] } as never).then(
      async (s) => {
        await s.close();
        return "opened";
      },
      (err: Error) => err.message,
    );
    expect(refusal).toContain("params.notifications.taskIds[1] is not the canonical spelling of a task id");
    for (const other of spellings) {
      const got = await rawPost(
        { id: unique("get"), method: "tasks/get", params: { taskId: other, _meta: tasksMeta() } },
        "tasks/get",
        other,
      );
      expect(got.error?.code).toBe(-32602);
      expect(got.error?.message).toContain("params.taskId is not the canonical spelling of a task id");
    }
    // The issued spelling still works.
    const issued = await rawPost(
      { id: unique("get"), method: "tasks/get", params: { taskId, _meta: tasksMeta() } },
      "tasks/get",
      taskId,
    );
    expect(issued.result?.taskId).toBe(taskId);
    await rawPost(
      { id: unique("cancel"), method: "tasks/cancel", params: { taskId, _meta: tasksMeta() } },
      "tasks/cancel",
      taskId,
    );
  }, 180_000);
});
