/**
 * Issue 44 item 3: the agent's ACP `usage_update` (context used/size, cost) reaches observe on both MCP
 * eras, the task results (the Tasks extension's and reconcile_agent_task_coding_run's), and the Server's
 * record (numbers only), against a real Server, a real Runner daemon and the fake agent's `tools` scenario
 * (usage_update used=1234 size=200000 cost 0.0042 USD). A prompt canary never appears in any usage output.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Client as ModernClient, StreamableHTTPClientTransport as ModernTransport } from "@modelcontextprotocol/client";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI_BIN, DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { browserLaunchOptions } from "../support/browser.js";
import { consoleLogin } from "../support/console-login.js";
import { type Stack, startStack } from "../support/stack.js";
import { observeToEnd, ok, type Structured, TERMINAL } from "../support/tool-calls.js";

const ALL = ["coding_agent:run", "project:write", "project:read", "runtime:read", "runtime:write"] as const;
const MODERN = "2026-07-28";
const PROMPT_CANARY = canary("usage-prompt");
const EXPECTED = { used_tokens: 1234, context_size: 200000, cost_amount: 0.0042, cost_currency: "USD" };

let stack: Stack;
let legacy: Client;
let modern: ModernClient;
let token: string;

beforeAll(async () => {
  stack = await startStack({
    principals: [
      { id: "alice", scopes: [...ALL], projects: ["demo"] },
      { id: "ops", scopes: ["operator:read"], projects: [] },
    ],
    projects: [{ id: "demo", allow_patch: true }],
    acp: { max_concurrent_runs: 8 },
  });
  token = await stack.issueToken("alice", [...ALL], ["demo"]);
  legacy = await stack.connect(token);
  modern = new ModernClient(
    { name: "webcodex-test-2026", version: "0" },
    { versionNegotiation: { mode: { pin: MODERN } } },
  );
  await modern.connect(
    new ModernTransport(stack.mcpUrl, { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
  );
});

afterAll(async () => {
  await modern?.close();
  await stack?.stop();
});

let counter = 0;
const unique = (label: string) => `${label}-${process.pid}-${++counter}`;
const prompt = () => `scenario: tools\n${PROMPT_CANARY} ${unique("p")}`;

function expectNoCanary(value: unknown): void {
  expect(JSON.stringify(value)).not.toContain(PROMPT_CANARY);
}

async function modernObserveToEnd(runId: string): Promise<Structured> {
  let after: string | undefined;
  for (let i = 0; i < 200; i++) {
    const r = (await modern.callTool(
      {
        name: "observe_coding_agent",
        arguments: { run_id: runId, wait_secs: 5, ...(after ? { after_observation_token: after } : {}) },
      },
      { timeout: 60_000 },
    )) as { isError?: boolean; structuredContent?: Structured };
    expect(r.isError).toBeFalsy();
    const o = r.structuredContent as Structured;
    after = o.observation_token as string;
    if (TERMINAL.has(o.state as string) && !o.has_more) return o;
  }
  throw new Error(`run ${runId} did not end`);
}

async function rawPost(message: Record<string, unknown>, method: string, name: string) {
  const res = await fetch(stack.mcpUrl, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${token}`,
      Accept: "application/json, text/event-stream",
      "Content-Type": "application/json",
      "MCP-Protocol-Version": MODERN,
      "Mcp-Method": method,
      "Mcp-Name": name,
    },
    body: JSON.stringify({ jsonrpc: "2.0", ...message }),
  });
  return (await res.json()) as { result?: Record<string, unknown> };
}

const tasksMeta = () => ({
  "io.modelcontextprotocol/protocolVersion": MODERN,
  "io.modelcontextprotocol/clientInfo": { name: "raw", version: "0" },
  "io.modelcontextprotocol/clientCapabilities": { extensions: { "io.modelcontextprotocol/tasks": {} } },
});

describe("run usage (ACP usage_update) through the whole stack", () => {
  it("observe reports the run's latest usage on both eras, after the end and after the Runner restarts; the record keeps the numbers", async () => {
    const started = await ok(legacy, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: unique("usage"),
      prompt: prompt(),
    });
    const runId = started.run_id as string;
    const end = await observeToEnd(legacy, runId);
    expect(end.state).toBe("completed");
    expect(end.usage).toEqual(EXPECTED);
    expectNoCanary(end.usage);
    const modernEnd = await modernObserveToEnd(runId);
    expect(modernEnd.usage).toEqual(EXPECTED);

    const rows = await stack.rows<Record<string, unknown>>(
      "SELECT usage_used_tokens, usage_context_size, usage_cost_amount, usage_cost_currency FROM admission_records WHERE run_id = ?",
      [runId],
    );
    expect(
      rows.map((r) =>
        Object.fromEntries(
          Object.entries(r).map(([k, v]) => [k, typeof v === "string" && k !== "usage_cost_currency" ? Number(v) : v]),
        ),
      ),
    ).toEqual([
      { usage_used_tokens: 1234, usage_context_size: 200000, usage_cost_amount: 0.0042, usage_cost_currency: "USD" },
    ]);

    // A restarted Runner knows the run only from its store (no usage there): the Server's record still has it.
    await stack.stopRunner();
    await stack.startRunner();
    const baseline = await ok(legacy, "observe_coding_agent", { run_id: runId });
    expect(baseline.state).toBe("completed");
    expect(baseline.usage).toEqual(EXPECTED);
  }, 120_000);

  it("a run without usage_update has no usage field", async () => {
    const started = await ok(legacy, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: unique("none"),
      prompt: `scenario: hello\n${PROMPT_CANARY}`,
    });
    const end = await observeToEnd(legacy, started.run_id as string);
    expect(end.state).toBe("completed");
    expect(end).not.toHaveProperty("usage");
  });

  it("the Tasks extension's completed result carries the usage", async () => {
    const created =
      (
        await rawPost(
          {
            id: unique("t"),
            method: "tools/call",
            params: {
              name: "start_coding_agent",
              arguments: { project_id: "demo", provider_id: "fake", idempotency_key: unique("task"), prompt: prompt() },
              _meta: tasksMeta(),
            },
          },
          "tools/call",
          "start_coding_agent",
        )
      ).result ?? {};
    const taskId = created.taskId as string;
    expect(taskId).toEqual(expect.any(String));
    const done = await poll(
      async () => {
        const got = (
          await rawPost(
            { id: unique("g"), method: "tasks/get", params: { taskId, _meta: tasksMeta() } },
            "tasks/get",
            taskId,
          )
        ).result;
        return got?.status === "completed" ? got : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the task completed" },
    );
    const result = done.result as { structuredContent: Structured; content: { text: string }[] };
    expect(result.structuredContent.usage).toEqual(EXPECTED);
    expect(JSON.parse(result.content[0]?.text ?? "")).toEqual(result.structuredContent);
    expectNoCanary(result.structuredContent.usage);
  });

  it("reconcile_agent_task_coding_run's run outcome carries the usage", async () => {
    const instruction = prompt();
    const task = await ok(legacy, "create_agent_task", {
      project_id: "demo",
      instruction,
      idempotency_key: unique("agent-task"),
      title: "usage",
    });
    const claim = await ok(legacy, "start_agent_task_attempt", { task_id: task.task_id, assignee: "host-1" });
    const run = await ok(legacy, "start_agent_task_coding_run", {
      project_id: "demo",
      provider_id: "fake",
      attempt_ref: claim.attempt_ref,
    });
    expect((await observeToEnd(legacy, run.run_id as string)).state).toBe("completed");
    const rec = await ok(legacy, "reconcile_agent_task_coding_run", {
      task_id: task.task_id,
      attempt_id: claim.attempt_id,
    });
    const outcome = (rec.attempt as Structured).run as Structured;
    expect(outcome).toMatchObject({ run_id: run.run_id, state: "completed", usage: EXPECTED });
    expectNoCanary(outcome.usage);
  });

  it("the CLI's closing line shows context and cost (text), and the JSON summary carries the usage", async () => {
    const exec = promisify(execFile);
    const env = { ...process.env, WEBCODEX_URL: stack.mcpUrl.href, WEBCODEX_TOKEN: token, NO_COLOR: "1" };
    const args = ["run", "--project", "demo", "--provider", "fake", "--key", unique("cli"), prompt()];
    const text = await exec(process.execPath, [CLI_BIN, ...args], { env, timeout: 60_000 });
    const closing = text.stdout.split("\n").find((l) => l.includes("completed · stop reason"));
    expect(closing).toContain(" · context 1.2k/200k · $0.0042 · ");
    expectNoCanary(closing);
    const json = await exec(
      process.execPath,
      [CLI_BIN, ...args.slice(0, -3), "--key", unique("cli"), prompt(), "--json"],
      {
        env,
        timeout: 60_000,
      },
    );
    const summary = JSON.parse(json.stdout.trim().split("\n").at(-1) ?? "{}") as Structured;
    expect(summary).toMatchObject({ type: "summary", state: "completed", usage: EXPECTED });
    expectNoCanary(summary.usage);
  }, 120_000);

  it("the console snapshot shows each run's usage and the reported cost per principal and day, without the prompt", async () => {
    const origin = stack.mcpUrl.origin;
    const opsKey = await stack.issueToken("ops", ["operator:read"], []);
    const session = await consoleLogin(origin, opsKey);
    expect(session.cookie).not.toBeNull();
    const res = await fetch(`${origin}/console/api/snapshot`, { headers: { cookie: session.cookie ?? "" } });
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(text).not.toContain(PROMPT_CANARY);
    const snap = JSON.parse(text) as { runs: Structured[]; costs: Structured[] };
    const withCost = snap.runs.filter((r) => r.usage !== null);
    expect(withCost.length).toBeGreaterThanOrEqual(5);
    for (const r of withCost) expect(r.usage).toEqual(EXPECTED);
    expect(snap.runs.some((r) => r.usage === null)).toBe(true); // the hello run reported none
    const today = new Date().toISOString().slice(0, 10);
    const mine = snap.costs.filter((c) => c.principal_id === "alice");
    expect(mine.length).toBe(1);
    expect(mine[0]).toMatchObject({ principal_id: "alice", currency: "USD", runs: withCost.length });
    expect([today, new Date(Date.now() - 86_400_000).toISOString().slice(0, 10)]).toContain(mine[0]?.day);
    expect(mine[0]?.amount as number).toBeCloseTo(0.0042 * withCost.length, 10);

    // The page shows them: a run's usage cell and alice's row of the cost table.
    const browser = await chromium.launch(await browserLaunchOptions());
    try {
      const page = await (await browser.newContext()).newPage();
      await page.goto(`${origin}/console`);
      await page.fill("#key", opsKey);
      await Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
      const run = withCost[0]?.run_id as string;
      await page.waitForSelector(`#runs tr[data-run="${run}"]`);
      expect(await page.locator(`#runs tr[data-run="${run}"] td`).last().textContent()).toBe(
        "context 1.2K/200K · 0.0042 USD",
      );
      const costRow = page.locator("#costs tbody tr", { hasText: "alice" });
      await costRow.waitFor();
      expect(await costRow.locator("td").allTextContents()).toEqual([
        mine[0]?.day,
        "alice",
        `${(0.0042 * withCost.length).toFixed(4)} USD`,
        String(withCost.length),
      ]);
      expect(await page.content()).not.toContain(PROMPT_CANARY);
    } finally {
      await browser.close();
    }
  }, 120_000);
});
