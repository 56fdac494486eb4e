/**
 * Issue 6 acceptance: the SDK's Client over StreamableHTTPClientTransport
 * against a real Server (in-process, real HTTP), a real Runner daemon child
 * process and the fake ACP agent. No mocks of our own components.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { promisify } from "node:util";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { Client as SdkClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { MAX_PROMPT_BYTES, type RunEvent } from "@webcodex/protocol";
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { DAEMON_WAIT_MS, poll, SERVER_BIN } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { AUDIT_FLUSH_INTERVAL_MS } from "../../src/mcp/audit.js";
import { type Stack, startStack } from "../support/stack.js";

const run = promisify(execFile);

const ALL_BUT_RUN = ["project:read", "project:write", "runtime:read", "job:run", "mcp:local"] as const;
const PROMPT_CANARY = canary("prompt");
const MESSAGE_CANARY = canary("agent-message");
const KEY_CANARY = canary("idempotency-key");

let stack: Stack;
let alice: Client;
let bob: Client;
let aliceToken: string;

beforeAll(async () => {
  stack = await startStack({
    principals: [
      { id: "alice", scopes: ["coding_agent:run", "project:write", "project:read"], projects: ["demo"] },
      { id: "bob", scopes: ["coding_agent:run", "project:write"], projects: ["demo"] },
      { id: "carol", scopes: ["project:read"], projects: ["secret"] },
      { id: "ops", scopes: [...ALL_BUT_RUN], projects: ["demo"] },
    ],
    projects: [
      { id: "demo", allow_patch: true },
      { id: "secret", allow_patch: true },
    ],
    acp: { max_concurrent_runs: 8 },
  });
  aliceToken = await stack.issueToken("alice", ["coding_agent:run", "project:write", "project:read"], ["demo"]);
  alice = await stack.connect(aliceToken);
  bob = await stack.connect(await stack.issueToken("bob", ["coding_agent:run", "project:write"], ["demo"]));
});

afterAll(async () => {
  await stack?.stop();
});

type Structured = Record<string, unknown>;
interface ApiErr {
  code: string;
  message: string;
  recovery_kind: string;
}

async function call(client: Client, name: string, args: Record<string, unknown>) {
  return client.callTool({ name, arguments: args }, undefined, { timeout: 60_000 });
}

async function ok(client: Client, name: string, args: Record<string, unknown>): Promise<Structured> {
  const result = await call(client, name, args);
  const text = (result.content as { type: string; text: string }[])[0]?.text ?? "";
  if (result.isError) throw new Error(`${name} failed: ${text}`);
  expect(JSON.parse(text)).toEqual(result.structuredContent);
  return result.structuredContent as Structured;
}

async function err(client: Client, name: string, args: Record<string, unknown>): Promise<ApiErr> {
  const result = await call(client, name, args);
  expect(result.isError).toBe(true);
  expect(result.structuredContent).toBeUndefined();
  const text = (result.content as { type: string; text: string }[])[0]?.text ?? "";
  const parsed = JSON.parse(text) as { error: ApiErr };
  expect(Object.keys(parsed)).toEqual(["error"]);
  return parsed.error;
}

const TERMINAL = new Set(["completed", "failed", "cancelled", "lost"]);

interface Observed {
  last: Structured;
  events: RunEvent[];
  states: string[];
  token: string;
}

/** Observe with tokens (wait_secs) until `until(state)` holds; collects only-new events. */
async function observeUntil(
  client: Client,
  runId: string,
  token: string,
  until: (o: Structured, events: RunEvent[]) => boolean,
  maxCalls = 200,
): Promise<Observed> {
  const events: RunEvent[] = [];
  const states: string[] = [];
  let current = token;
  for (let i = 0; i < maxCalls; i++) {
    const o = await ok(client, "observe_coding_agent", {
      run_id: runId,
      after_observation_token: current,
      wait_secs: 5,
    });
    events.push(...(o.events as RunEvent[]));
    states.push(o.state as string);
    current = o.observation_token as string;
    if (until(o, events) && !o.has_more) return { last: o, events, states, token: current };
  }
  throw new Error(`run ${runId} did not reach the expected state; states seen: ${states.join(",")}`);
}

/**
 * Waits until the run has ended. A test that starts a run ends it or waits for it: the Runner allows
 * `max_concurrent_runs` at once, and runs left going by one test would fill it for the next on a loaded machine.
 */
async function ended(client: Client, started: Structured): Promise<void> {
  await observeUntil(client, started.run_id as string, started.observation_token as string, (x) =>
    TERMINAL.has(x.state as string),
  );
}

function expectOnlyNewInOrder(events: RunEvent[]): void {
  const seqs = events.map((e) => e.seq);
  expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
  expect(new Set(seqs).size).toBe(seqs.length);
  expect(seqs[0]).toBe(1);
  expect(seqs.at(-1)).toBe(seqs.length);
}

let keyCounter = 0;
const key = (label: string) => `${label}-${process.pid}-${++keyCounter}`;

/**
 * The fake agent's ledger from the line where it received `prompt` (matched by its sha256): that agent's pid
 * and every line after it. Tests in this file run one after another, so what follows is this run's.
 */
function ledgerFrom(ledger: Record<string, unknown>[], prompt: string) {
  const sha = createHash("sha256").update(prompt, "utf8").digest("hex");
  const i = ledger.findIndex((l) => l.event === "prompt" && l.prompt_sha256 === sha);
  if (i < 0) throw new Error("the prompt never reached the agent");
  return { pid: ledger[i]?.pid, after: ledger.slice(i + 1) };
}

async function start(client: Client, prompt: string, over: Record<string, unknown> = {}) {
  return ok(client, "start_coding_agent", {
    project_id: "demo",
    provider_id: "fake",
    idempotency_key: key("start"),
    prompt,
    ...over,
  });
}

describe("MCP tools against the real Server, Runner and fake agent", () => {
  it("lists the run, agent-task, workflow-session and webhook tools, each with closed input and an output schema", async () => {
    const { tools } = await alice.listTools();
    expect(tools.map((t) => t.name).sort()).toEqual([
      "add_webhook_subscription",
      "apply_coding_agent_changes",
      "cancel_coding_agent",
      "close_agent_task",
      "create_agent_task",
      "create_workflow_session",
      "get_coding_agent_changes",
      "list_webhook_subscriptions",
      "observe_coding_agent",
      "read_workflow_session",
      "reconcile_agent_task_coding_run",
      "remove_webhook_subscription",
      "start_agent_task_attempt",
      "start_agent_task_coding_run",
      "start_coding_agent",
      "update_workflow_session",
    ]);
    for (const tool of tools) {
      expect(tool.inputSchema).toMatchObject({ type: "object", additionalProperties: false });
      expect(tool.outputSchema).toMatchObject({ type: "object" });
    }
  });

  it("shows each caller only its own projects, with runner status and sanitized providers", async () => {
    const read = async (client: Client) => {
      const res = await client.readResource({ uri: "webcodex://projects" });
      return (res.contents[0] as { text: string }).text;
    };
    const text = await read(alice);
    expect(JSON.parse(text)).toEqual({
      projects: [
        {
          project_id: "demo",
          runner_online: true,
          allow_patch: true,
          agents_share_runner_user: true,
          providers: [{ provider_id: "fake", name: "Fake agent", allowed_config_options: ["model"] }],
        },
      ],
    });
    expect(text).not.toContain(stack.dir);
    expect(text).not.toContain("fake-acp-agent");
    const carol = await stack.connect(await stack.issueToken("carol", ["project:read"], ["secret"]));
    expect(JSON.parse(await read(carol)).projects.map((p: { project_id: string }) => p.project_id)).toEqual(["secret"]);
  });

  it("runs start → observe with tokens to completion, each event delivered once and in order", async () => {
    const prompt = `scenario: hello text="${MESSAGE_CANARY} is a fine greeting"\n${PROMPT_CANARY}`;
    const started = await start(alice, prompt, { idempotency_key: `${KEY_CANARY}-1` });
    expect(started).toMatchObject({ replayed: false });
    expect(started.run_id).toMatch(/^wc_agent_run_[a-z2-7]{26}$/);
    const done = await observeUntil(alice, started.run_id as string, started.observation_token as string, (o) =>
      TERMINAL.has(o.state as string),
    );
    expect(done.last).toMatchObject({ state: "completed", execution_state: "completed", stop_reason: "end_turn" });
    expectOnlyNewInOrder(done.events);
    const text = done.events
      .filter((e) => e.kind === "agent_message")
      .map((e) => (e as { text: string }).text)
      .join("");
    expect(text).toContain(MESSAGE_CANARY);
    expect(done.events.at(-1)?.kind).toBe("terminal");
    // Observing again after the end returns the terminal state with no events.
    const again = await ok(alice, "observe_coding_agent", {
      run_id: started.run_id,
      after_observation_token: done.token,
    });
    expect(again).toMatchObject({ state: "completed", events: [], has_more: false });
    // Same key, same inputs: the same run, not a second dispatch.
    const replay = await start(alice, prompt, { idempotency_key: `${KEY_CANARY}-1` });
    expect(replay).toMatchObject({ run_id: started.run_id, replayed: true, state: "completed" });
    const sha = createHash("sha256").update(prompt, "utf8").digest("hex");
    expect(stack.ledger().filter((l) => l.event === "prompt" && l.prompt_sha256 === sha)).toHaveLength(1);
  });

  it("delivers every event kind within the advertised output schema (the SDK client validates it)", async () => {
    const started = await start(alice, "scenario: tools");
    const done = await observeUntil(alice, started.run_id as string, started.observation_token as string, (o) =>
      TERMINAL.has(o.state as string),
    );
    expect(done.last.state).toBe("completed");
    const kinds = new Set(done.events.map((e) => e.kind));
    for (const k of ["plan", "tool_activity", "file_change", "terminal_activity", "reasoning", "usage", "terminal"]) {
      expect(kinds.has(k as RunEvent["kind"])).toBe(true);
    }
    const paths = done.events.filter((e) => e.kind === "file_change").map((e) => (e as { path: string }).path);
    for (const p of paths) expect(p.startsWith("/")).toBe(false);
  });

  it("cancels a run mid-stream: it ends cancelled and a second cancel reports already_terminal", async () => {
    const started = await start(alice, "scenario: slow interval_ms=100 count=600");
    const runId = started.run_id as string;
    const streaming = await observeUntil(
      alice,
      runId,
      started.observation_token as string,
      (o, events) => o.state === "running" && events.some((e) => e.kind === "agent_message"),
    );
    const cancel = await ok(alice, "cancel_coding_agent", { run_id: runId });
    expect(cancel).toMatchObject({ run_id: runId, cancel_requested: true, already_terminal: false });
    const done = await observeUntil(alice, runId, streaming.token, (o) => TERMINAL.has(o.state as string));
    expect(done.last).toMatchObject({ state: "cancelled", stop_reason: "cancelled" });
    expectOnlyNewInOrder([...streaming.events, ...done.events]);
    const second = await ok(alice, "cancel_coding_agent", { run_id: runId });
    expect(second).toMatchObject({ state: "cancelled", already_terminal: true });
  });

  it("shows waiting_permission, never allows, and ends with the correlated result after cancel", async () => {
    // permission_timeout_secs is the default (minutes): only the cancel can end this wait.
    const prompt = `scenario: permission\n${key("perm-cancel")}`;
    const started = await start(alice, prompt);
    const runId = started.run_id as string;
    const waiting = await observeUntil(
      alice,
      runId,
      started.observation_token as string,
      (o) => o.state === "waiting_permission",
    );
    expect(waiting.events.some((e) => e.kind === "permission_request")).toBe(true);
    await ok(alice, "cancel_coding_agent", { run_id: runId });
    const done = await observeUntil(alice, runId, waiting.token, (o) => TERMINAL.has(o.state as string));
    expect(done.last).toMatchObject({ state: "cancelled", stop_reason: "cancelled" });
    expect(done.last.message).not.toContain("permission deadline");
    // The agent got session/cancel, and its one permission request was answered cancelled — never allowed.
    // The Runner answers the permission `cancelled` just before it sends session/cancel, and the agent may end
    // its turn on that answer before it logs the notification: wait for the line rather than read once.
    const { pid, after } = await poll(
      () => {
        const found = ledgerFrom(stack.ledger(), prompt);
        return found.after.some((l) => l.event === "cancel" && l.pid === found.pid) ? found : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, what: "the agent's ledger line for session/cancel" },
    );
    expect(after.filter((l) => l.event === "cancel" && l.pid === pid)).toHaveLength(1);
    expect(after.filter((l) => l.event === "permission_outcome")).toEqual([
      { event: "permission_outcome", outcome: "cancelled" },
    ]);
  });

  it("answers a permission request 'cancelled' at its deadline and reports the correlated end", async () => {
    // Its own stack: a 2 s permission deadline would race the cancel test above.
    const short = await startStack({
      principals: [{ id: "alice", scopes: ["coding_agent:run", "project:write"], projects: ["demo"] }],
      acp: { permission_timeout_secs: 2 },
    });
    try {
      const client = await short.connect(
        await short.issueToken("alice", ["coding_agent:run", "project:write"], ["demo"]),
      );
      const prompt = `scenario: permission\n${key("perm-deadline")}`;
      const started = await start(client, prompt);
      const done = await observeUntil(client, started.run_id as string, started.observation_token as string, (o) =>
        TERMINAL.has(o.state as string),
      );
      expect(done.states).toContain("waiting_permission");
      expect(done.last).toMatchObject({ state: "cancelled", stop_reason: "cancelled" });
      expect(done.last.message).toContain("permission deadline");
      // Nobody cancelled the run: the deadline answered the request cancelled, and the agent ended the turn.
      const { pid, after } = ledgerFrom(short.ledger(), prompt);
      expect(after.filter((l) => l.event === "cancel" && l.pid === pid)).toEqual([]);
      expect(after.filter((l) => l.event === "permission_outcome")).toEqual([
        { event: "permission_outcome", outcome: "cancelled" },
      ]);
    } finally {
      await short.stop();
    }
  });

  it.each([["project:write"], ["job:run"], ["mcp:local"], ["runtime:read"], [...ALL_BUT_RUN]])(
    "a token with only %s cannot start, observe or cancel",
    async (...scopes) => {
      const flat = scopes.flat() as (typeof ALL_BUT_RUN)[number][];
      const client = await stack.connect(await stack.issueToken("ops", flat, ["demo"], false));
      const target = await start(alice, "scenario: hello");
      const e1 = await err(client, "start_coding_agent", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: key("ops"),
        prompt: "scenario: hello",
      });
      const e2 = await err(client, "observe_coding_agent", { run_id: target.run_id });
      const e3 = await err(client, "cancel_coding_agent", { run_id: target.run_id });
      for (const e of [e1, e2, e3]) expect(e.code).toBe("forbidden");
      await ended(alice, target);
    },
  );

  it("principal B cannot observe or cancel A's run and cannot tell it exists", async () => {
    const started = await start(alice, "scenario: slow interval_ms=200 count=50");
    const runId = started.run_id as string;
    const unknownId = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
    const onA = await err(bob, "observe_coding_agent", { run_id: runId });
    const onNothing = await err(bob, "observe_coding_agent", { run_id: unknownId });
    expect(onA.code).toBe("not_found");
    expect(onA).toEqual({ ...onNothing, message: onNothing.message.replaceAll(unknownId, runId) });
    const cancelA = await err(bob, "cancel_coding_agent", { run_id: runId });
    const cancelNothing = await err(bob, "cancel_coding_agent", { run_id: unknownId });
    expect(cancelA.code).toBe("not_found");
    expect(cancelA).toEqual({ ...cancelNothing, message: cancelNothing.message.replaceAll(unknownId, runId) });
    // B's observe with A's own token is no better.
    const withToken = await err(bob, "observe_coding_agent", {
      run_id: runId,
      after_observation_token: started.observation_token,
    });
    expect(withToken.code).toBe("not_found");
    // The run is untouched by B's cancel.
    const o = await ok(alice, "observe_coding_agent", { run_id: runId });
    expect(o.state).not.toBe("cancelled");
    await ok(alice, "cancel_coding_agent", { run_id: runId });
    await observeUntil(alice, runId, o.observation_token as string, (x) => TERMINAL.has(x.state as string));
  });

  it("rejects forged, tampered and cross-run observation tokens", async () => {
    const a = await start(alice, "scenario: hello");
    const b = await start(alice, "scenario: hello");
    const tokenA = a.observation_token as string;
    const mid = Math.floor(tokenA.length / 2);
    const tampered = tokenA.slice(0, mid) + (tokenA[mid] === "A" ? "B" : "A") + tokenA.slice(mid + 1);
    for (const bad of ["forged-token", tampered, `${tokenA}x`]) {
      const e = await err(alice, "observe_coding_agent", { run_id: a.run_id, after_observation_token: bad });
      expect(e.code).toBe("invalid_observation_token");
    }
    const cross = await err(alice, "observe_coding_agent", { run_id: b.run_id, after_observation_token: tokenA });
    expect(cross.code).toBe("invalid_observation_token");
    await ended(alice, a);
    await ended(alice, b);
  });

  it.each(["executable", "args", "env", "cwd", "transport", "session_id", "method", "id", "jsonrpc"])(
    "rejects the forbidden key %s by name",
    async (forbidden) => {
      const e = await err(alice, "start_coding_agent", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: key("forbidden"),
        prompt: "scenario: hello",
        [forbidden]: "x",
      });
      expect(e).toMatchObject({ code: "invalid_input", recovery_kind: "fix_input" });
      expect(e.message).toContain(`'${forbidden}'`);
    },
  );

  it("rejects an oversized prompt before anything is stored", async () => {
    const count = async () => (await stack.rows<{ n: number }>("SELECT COUNT(*) AS n FROM admission_records"))[0]?.n;
    const before = await count();
    const k = key("oversized");
    const oversized = `${PROMPT_CANARY}${"x".repeat(MAX_PROMPT_BYTES)}`;
    const e = await err(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: k,
      prompt: oversized,
    });
    expect(e.code).toBe("invalid_input");
    expect(e.message).toContain("prompt");
    expect(await count()).toBe(before);
    const sha = createHash("sha256").update(oversized, "utf8").digest("hex");
    expect(stack.ledger().some((l) => l.prompt_sha256 === sha)).toBe(false);
    // Nothing was recorded under that key: the same key now starts a fresh run.
    const fresh = await start(alice, "scenario: hello", { idempotency_key: k });
    expect(fresh.replayed).toBe(false);
    await ended(alice, fresh);
  });

  it("answers an unknown provider with the providers the project's Runner advertises", async () => {
    const result = await call(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "nope",
      idempotency_key: key("provider"),
      prompt: "scenario: hello",
    });
    const e = JSON.parse((result.content as { text: string }[])[0]!.text).error;
    expect(e.code).toBe("provider_unavailable");
    expect(e.message).toContain("fake (Fake agent)");
    expect(e.available_providers).toEqual([{ provider_id: "fake", name: "Fake agent" }]);
  });

  it("issues tokens only through an explicit opt-in on the CLI, printing the token once", async () => {
    const base = ["token", "issue", "--config", stack.serverConfigFile, "--principal", "alice", "--project", "demo"];
    const refused = await run(process.execPath, [SERVER_BIN, ...base, "--scope", "coding_agent:run"]).catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect((refused as { code: number }).code).toBe(1);
    expect((refused as { stderr: string }).stderr).toContain("--allow-coding-agent-run");
    const issued = await run(process.execPath, [
      SERVER_BIN,
      ...base,
      "--scope",
      "coding_agent:run",
      "--scope",
      "project:write",
      "--allow-coding-agent-run",
    ]);
    const token = issued.stdout.trim();
    expect(token).toMatch(/^wct_/);
    const client = await stack.connect(token);
    const started = await start(client, "scenario: hello");
    expect(started).toMatchObject({ replayed: false, state: "starting" });
    // The token acts as alice: her own run, visible to her other token.
    expect((await ok(alice, "observe_coding_agent", { run_id: started.run_id })).run_id).toBe(started.run_id);
    await ended(alice, started);
  });

  it("passes the happy path through the stdio bridge", async () => {
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [SERVER_BIN, "mcp-stdio", "--url", stack.mcpUrl.href, "--token-env", "WC_TEST_TOKEN"],
      env: { ...(process.env as Record<string, string>), WC_TEST_TOKEN: aliceToken },
      stderr: "pipe",
    });
    const client = new SdkClient({ name: "stdio-test", version: "0" });
    await client.connect(transport);
    try {
      const { tools } = await client.listTools();
      expect(tools.map((t) => t.name)).toContain("start_agent_task_coding_run");
      expect(tools).toHaveLength(16);
      const res = await client.readResource({ uri: "webcodex://projects" });
      expect(JSON.parse((res.contents[0] as { text: string }).text).projects[0].project_id).toBe("demo");
      const started = await ok(client, "start_coding_agent", {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: key("stdio"),
        prompt: "scenario: hello",
      });
      const done = await observeUntil(client, started.run_id as string, started.observation_token as string, (o) =>
        TERMINAL.has(o.state as string),
      );
      expect(done.last.state).toBe("completed");
      expectOnlyNewInOrder(done.events);
      const e = await err(client, "cancel_coding_agent", { run_id: started.run_id, env: {} });
      expect(e.message).toContain("'env'");
    } finally {
      await client.close();
    }
  });

  it("keeps audit rows per call, and no prompt or agent-message canary in any Server DB byte", async () => {
    // Everything this test inspects, it makes itself: a canary run to completion, a cancel, a refused
    // observe by another principal, an oversized prompt and a resource read.
    const prompt = `scenario: hello text="${MESSAGE_CANARY} audited"\n${PROMPT_CANARY}`;
    const started = await start(alice, prompt, { idempotency_key: `${KEY_CANARY}-${key("audit")}` });
    const done = await observeUntil(alice, started.run_id as string, started.observation_token as string, (o) =>
      TERMINAL.has(o.state as string),
    );
    const said = done.events.map((e) => (e.kind === "agent_message" ? e.text : "")).join("");
    expect(said).toContain(MESSAGE_CANARY); // streamed in chunks: one event may hold only part of it
    await ok(alice, "cancel_coding_agent", { run_id: started.run_id });
    expect((await err(bob, "observe_coding_agent", { run_id: started.run_id })).code).toBe("not_found");
    const oversized = await err(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: key("audit-oversized"),
      prompt: `${PROMPT_CANARY}${"x".repeat(MAX_PROMPT_BYTES)}`,
    });
    expect(oversized.code).toBe("invalid_input");
    await alice.readResource({ uri: "webcodex://projects" });

    // Audit rows are written in batches (every AUDIT_FLUSH_INTERVAL_MS): wait until this test's rows are in.
    type Row = { principal_id: string; tool: string; run_id: string | null; outcome: string; input_bytes: number };
    const rows = () => stack.rows<Row>("SELECT principal_id, tool, run_id, outcome, input_bytes FROM mcp_audit");
    const mine = (r: Row) => r.run_id === started.run_id;
    const expectations: [string, (r: Row) => boolean][] = [
      ...["start_coding_agent", "observe_coding_agent", "cancel_coding_agent"].map(
        (t) =>
          [`alice ${t}`, (r: Row) => mine(r) && r.tool === t && r.principal_id === "alice"] as [
            string,
            (r: Row) => boolean,
          ],
      ),
      ["bob not_found", (r) => mine(r) && r.principal_id === "bob" && r.outcome === "not_found"],
      ["oversized invalid_input", (r) => r.outcome === "invalid_input" && r.input_bytes > MAX_PROMPT_BYTES],
      ["alice resource read", (r) => r.tool === "resource:projects" && r.principal_id === "alice"],
    ];
    const missing = async () => {
      const all = await rows();
      return expectations.filter(([, want]) => !all.some(want)).map(([name]) => name);
    };
    // On a timeout the expect below names the rows still missing.
    await poll(async () => (await missing()).length === 0, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: AUDIT_FLUSH_INTERVAL_MS,
    }).catch(() => undefined);
    expect(await missing()).toEqual([]);

    const bytes = await stack.stateText();
    expect(bytes).toContain("mcp_audit");
    expect(bytes).toContain(started.run_id as string); // the scan does see row contents
    for (const canary of [PROMPT_CANARY, MESSAGE_CANARY, KEY_CANARY, aliceToken]) expect(bytes).not.toContain(canary);
    // Nor in the Server's debug log or the Runner's output.
    const logs = stack.serverLog() + stack.runnerLog();
    expect(stack.serverLog()).toContain('"msg":"tool call"');
    for (const canary of [PROMPT_CANARY, MESSAGE_CANARY, KEY_CANARY, aliceToken]) expect(logs).not.toContain(canary);
  });

  it("reports the Runner offline in the resource and refuses new starts while it is down", async () => {
    await stack.stopRunner();
    onTestFinished(() => stack.startRunner()); // later tests (in any order) find the Runner online again
    const res = await alice.readResource({ uri: "webcodex://projects" });
    expect(JSON.parse((res.contents[0] as { text: string }).text).projects).toEqual([
      { project_id: "demo", runner_online: false, allow_patch: false, agents_share_runner_user: null, providers: [] },
    ]);
    const e = await err(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: key("offline"),
      prompt: "scenario: hello",
    });
    expect(e).toMatchObject({ code: "runner_unavailable", recovery_kind: "retry_same" });
  });
});
