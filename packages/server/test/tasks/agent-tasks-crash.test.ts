/**
 * Issue 14: the Server is SIGKILLed (test-only failpoint WEBCODEX_SERVER_FAILPOINT
 * in the Server child's environment, then a real kill -9 of itself) between the
 * Attempt→Run binding and `run.start`, and after `run.start`. After a restart the
 * same start call and reconcile meet the original Run, and the fake agent's
 * ledger shows the instruction dispatched exactly once. Real processes: a
 * `webcodex-server run` child, a Runner daemon, the fake agent, an SDK MCP client.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll, SERVER_BIN } from "../../../../scripts/test-support/index.js";
import { SERVER_FAILPOINT_ENV } from "../../src/failpoints.js";
import { ProcStack } from "../support/proc-stack.js";
import { callTool, observeToEnd, ok, promptsOf, type Structured } from "../support/tool-calls.js";

/** Bound on the Runner coming back online after the Server child restarted. */
const RECONNECT_WAIT_MS = 30_000;

const run = promisify(execFile);

let stack: ProcStack | null = null;
const clients: Client[] = [];

afterEach(async () => {
  for (const c of clients.splice(0)) await c.close().catch(() => {});
  await stack?.stop();
  stack = null;
});

async function issueToken(s: ProcStack, extraScopes: string[] = []): Promise<string> {
  const { stdout } = await run(process.execPath, [
    SERVER_BIN,
    "token",
    "issue",
    "--config",
    s.serverConfigFile,
    "--principal",
    "alice",
    "--scope",
    "coding_agent:run",
    "--scope",
    "project:write",
    "--project",
    "demo",
    "--allow-coding-agent-run",
    ...extraScopes.flatMap((scope) => ["--scope", scope]),
  ]);
  return stdout.trim();
}

async function connect(s: ProcStack, token: string): Promise<Client> {
  const client = new Client({ name: "webcodex-crash-test", version: "0" });
  await client.connect(
    new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${s.port}/mcp`), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    }),
  );
  clients.push(client);
  return client;
}

async function runnerOnline(s: ProcStack): Promise<void> {
  await poll(async () => (await s.projects("alice")).some((p) => p.runner_online), {
    timeoutMs: RECONNECT_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: "the Runner back online",
  });
}

async function restartServer(s: ProcStack): Promise<void> {
  const child = s.serverChild;
  await poll(() => child === null || child.exitCode !== null || child.signalCode !== null, {
    timeoutMs: DAEMON_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: "the Server to kill itself",
  });
  expect(child?.signalCode).toBe("SIGKILL");
  await s.killServer();
  // At info level the new Server logs the Runner's accepted hello, which the wait below looks for.
  s.opts.serverEnv = { WEBCODEX_LOG_LEVEL: "info" };
  await s.startServer();
  await runnerOnline(s);
  // On PostgreSQL the killed Server's link lease stays live for up to two heartbeats, and the projects view
  // counts its holder online meanwhile; a start then is refused runner_unavailable (retry_same), truthfully.
  // This test is about the replay, so it waits until the Runner's hello reached the new Server.
  await poll(() => (s.logs.get("server") ?? "").includes("runner hello accepted"), {
    timeoutMs: RECONNECT_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: () => `the Runner's link on the restarted Server; its log: ${(s.logs.get("server") ?? "").slice(-3000)}`,
  });
}

describe.each([
  ["task_after_binding", false],
  ["task_after_run_start", true],
] as const)("Server kill -9 at %s", (failpoint, replayedAfterRestart) => {
  it("the same start call and reconcile meet the original run after a restart; one ledger prompt", async () => {
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      serverEnv: { [SERVER_FAILPOINT_ENV]: failpoint },
    }).init();
    await stack.startRunner("r1");
    const token = await issueToken(stack);
    const instruction = `scenario: hello text="crash-${failpoint}-${process.pid}"`;
    const before = await connect(stack, token);
    const task = await ok(before, "create_agent_task", {
      project_id: "demo",
      instruction,
      idempotency_key: `crash-${failpoint}`,
    });
    const claim = await ok(before, "start_agent_task_attempt", { task_id: task.task_id, assignee: "host" });
    const startArgs = { project_id: "demo", provider_id: "fake", attempt_ref: claim.attempt_ref };
    // The Server dies inside this call: no answer reaches the host.
    await expect(callTool(before, "start_agent_task_coding_run", startArgs)).rejects.toThrow();
    await restartServer(stack);

    const after = await connect(stack, token);
    const started = await ok(after, "start_agent_task_coding_run", startArgs);
    expect(started).toMatchObject({ task_id: task.task_id, attempt_id: claim.attempt_id });
    expect(started.replayed).toBe(replayedAfterRestart);
    const again = await ok(after, "start_agent_task_coding_run", startArgs);
    expect(again).toMatchObject({ run_id: started.run_id, replayed: true });
    expect((await observeToEnd(after, started.run_id as string)).state).toBe("completed");
    const rec = await ok(after, "reconcile_agent_task_coding_run", { task_id: task.task_id });
    expect(rec.attempt).toMatchObject({ run: { run_id: started.run_id, state: "completed" } });
    expect(promptsOf(stack.prompts("r1") as Structured[], instruction)).toHaveLength(1);

    // Reopened database, fresh runtime (a plain kill -9 and restart): reconcile meets the same run.
    await stack.killServer("SIGKILL");
    await stack.startServer();
    await runnerOnline(stack);
    const fresh = await connect(stack, token);
    const rec2 = await ok(fresh, "reconcile_agent_task_coding_run", {
      task_id: task.task_id,
      attempt_id: claim.attempt_id,
    });
    expect(rec2.attempt).toMatchObject({ run: { run_id: started.run_id, state: "completed" } });
    const replay = await ok(fresh, "start_agent_task_coding_run", startArgs);
    expect(replay).toMatchObject({ run_id: started.run_id, replayed: true, state: "completed" });
    expect(promptsOf(stack.prompts("r1") as Structured[], instruction)).toHaveLength(1);
  }, 90_000);
});

describe("Server kill -9 with workflow sessions", () => {
  it("keeps sessions, their handoff and their evidence across a restart", async () => {
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      extraScopes: ["runtime:read", "runtime:write"],
    }).init();
    await stack.startRunner("r1");
    const token = await issueToken(stack, ["runtime:read", "runtime:write"]);
    const before = await connect(stack, token);
    const session = await ok(before, "create_workflow_session", { project_id: "demo", title: "kept" });
    await ok(before, "update_workflow_session", { session_id: session.session_id, handoff: "the handoff", goal: "g" });
    const started = await ok(before, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "session-restart",
      prompt: "scenario: hello",
      workflow_session_id: session.session_id,
    });
    await observeToEnd(before, started.run_id as string);
    await poll(
      async () => {
        const r = await ok(before, "read_workflow_session", { session_id: session.session_id });
        return (r.evidence as Structured[]).some((e) => e.kind === "coding_agent_terminal");
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the terminal evidence entry" },
    );
    const kept = await ok(before, "read_workflow_session", { session_id: session.session_id });
    await stack.killServer("SIGKILL");
    await stack.startServer();
    const after = await connect(stack, token);
    const read = await ok(after, "read_workflow_session", { session_id: session.session_id });
    expect(read).toEqual(kept);
    expect(read).toMatchObject({ handoff: "the handoff", handoff_version: 1, goal: "g" });
    expect((read.evidence as Structured[]).map((e) => e.kind)).toEqual([
      "coding_agent_started",
      "coding_agent_terminal",
    ]);
  }, 90_000);
});

describe("Server kill -9 between the recorded intent and run.start (start_after_intent)", () => {
  it("the coding_agent_started entry is durable before dispatch: there after a restart without any replay", async () => {
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      extraScopes: ["runtime:read", "runtime:write"],
      serverEnv: { [SERVER_FAILPOINT_ENV]: "start_after_intent" },
    }).init();
    await stack.startRunner("r1");
    const token = await issueToken(stack, ["runtime:read", "runtime:write"]);
    const before = await connect(stack, token);
    const session = await ok(before, "create_workflow_session", { project_id: "demo", title: "durable link" });
    const prompt = `scenario: hello text="link-${process.pid}"`;
    const startArgs = {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "link-before-dispatch",
      prompt,
      workflow_session_id: session.session_id,
    };
    await expect(callTool(before, "start_coding_agent", startArgs)).rejects.toThrow();
    await restartServer(stack);

    // No replay yet: the link and its started entry were committed with the intent; the restart closed
    // the never-sent intent and the recorder wrote its terminal entry.
    const after = await connect(stack, token);
    const read = await ok(after, "read_workflow_session", { session_id: session.session_id });
    const entries = read.evidence as Structured[];
    expect(entries.map((e) => e.kind)).toEqual(["coding_agent_started", "coding_agent_terminal"]);
    const runId = entries[0]?.run_id;
    expect(entries[0]).toMatchObject({ provider_id: "fake", state: "starting", execution_state: "not_started" });
    expect(entries[1]).toMatchObject({ run_id: runId, state: "failed", failure_kind: "never_admitted" });
    expect(promptsOf(stack.prompts("r1") as Structured[], prompt)).toHaveLength(0);

    // The same call re-admits (nothing was ever sent): one dispatch, recorded once; a replay adds nothing.
    const started = await ok(after, "start_coding_agent", startArgs);
    expect(started.run_id).toBe(runId);
    expect((await observeToEnd(after, started.run_id as string)).state).toBe("completed");
    await poll(
      async () => {
        const r = await ok(after, "read_workflow_session", { session_id: session.session_id });
        return (r.evidence as Structured[]).length === 4;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the second terminal entry" },
    );
    expect(await ok(after, "start_coding_agent", startArgs)).toMatchObject({ run_id: runId, replayed: true });
    const final = await ok(after, "read_workflow_session", { session_id: session.session_id });
    expect((final.evidence as Structured[]).map((e) => e.kind)).toEqual([
      "coding_agent_started",
      "coding_agent_terminal",
      "coding_agent_started",
      "coding_agent_terminal",
    ]);
    expect((final.evidence as Structured[])[3]).toMatchObject({ run_id: runId, state: "completed" });
    expect(promptsOf(stack.prompts("r1") as Structured[], prompt)).toHaveLength(1);
  }, 90_000);
});
