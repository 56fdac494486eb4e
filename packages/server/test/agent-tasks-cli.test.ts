/**
 * Issue 14: `webcodex task …` (the CLI binary, over MCP) against a real
 * Server, Runner and fake agent: create → attempt → run → follow → show →
 * close, each printing the ids a host must keep.
 */
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { REPO_ROOT, type Stack, startStack } from "./support/stack.js";
import { promptsOf } from "./support/tool-calls.js";

const CLI_BIN = join(REPO_ROOT, "packages/cli/bin/webcodex.js");
const exec = promisify(execFile);

let stack: Stack;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  stack = await startStack({
    principals: [{ id: "alice", scopes: ["coding_agent:run", "project:write", "project:read"], projects: ["demo"] }],
  });
  env = {
    ...process.env,
    WEBCODEX_URL: stack.mcpUrl.href,
    WEBCODEX_TOKEN: stack.issueToken("alice", ["coding_agent:run", "project:write", "project:read"], ["demo"]),
    NO_COLOR: "1",
  };
}, 60_000);

afterAll(async () => {
  await stack?.stop();
}, 60_000);

async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await exec(process.execPath, [CLI_BIN, ...args], { env, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

async function json(args: string[]): Promise<Record<string, unknown>> {
  const r = await cli([...args, "--json"]);
  expect(r.code, r.stderr + r.stdout).toBe(0);
  return JSON.parse(r.stdout.trim().split("\n").at(-1) ?? "{}") as Record<string, unknown>;
}

describe("webcodex task (CLI over MCP)", () => {
  it("creates, claims, runs, shows and closes a task, printing the ids a host keeps", async () => {
    const instruction = `scenario: hello text="cli-task-${process.pid}"`;
    const created = await json([
      "task",
      "create",
      "--project",
      "demo",
      "--title",
      "cli",
      "--key",
      "cli-k1",
      instruction,
    ]);
    expect(created).toMatchObject({ type: "task_created", replayed: false, key: "cli-k1" });
    const taskId = created.task_id as string;
    expect(taskId).toMatch(/^wc_task_/);
    const again = await cli(["task", "create", "--project", "demo", "--title", "cli", "--key", "cli-k1", instruction]);
    expect(again.stdout).toContain(`task ${taskId} already existed (same key)`);

    const text = await cli(["task", "attempt", taskId, "--assignee", "cli-host", "--lease", "600"]);
    expect(text.code).toBe(0);
    const ref = /attempt_ref: (\S+)/.exec(text.stdout)?.[1] ?? "";
    expect(ref).toMatch(/^wcatt1\./);
    expect(text.stdout).toMatch(/fence 1 · generation 1/);

    const run = await json(["task", "run", "--project", "demo", "--provider", "fake", "--ref", ref]);
    expect(run).toMatchObject({ type: "task_run", task_id: taskId, replayed: false });
    const runId = run.run_id as string;
    const follow = await cli(["observe", runId, "--follow"]);
    expect(follow.code).toBe(0);
    const replay = await cli(["task", "run", "--project", "demo", "--provider", "fake", "--ref", ref]);
    expect(replay.stdout).toContain(`run ${runId} completed (the attempt's existing run)`);

    const shown = await cli(["task", "show", taskId]);
    expect(shown.stdout).toContain(`task ${taskId} · open`);
    expect(shown.stdout).toContain(`run ${runId} · completed · end_turn`);
    const reconciled = await json(["task", "reconcile", taskId]);
    expect(reconciled).toMatchObject({
      type: "task_reconciled",
      attempt: { run: { run_id: runId, state: "completed" } },
    });

    const closed = await cli(["task", "close", taskId, "--outcome", "succeeded"]);
    expect(closed.stdout).toContain(`task ${taskId} closed: succeeded`);
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(1);
  });

  it("reports a stale claim with the Server's code and exit 1", async () => {
    const created = await json(["task", "create", "--project", "demo", "scenario: hello"]);
    const args = ["task", "run", "--project", "demo", "--provider", "fake", "--ref", "wcatt1.AAAA.BBBB"];
    const r = await cli([...args, "--json"]);
    expect(r.code).toBe(1);
    expect(JSON.parse(r.stdout.trim())).toMatchObject({ type: "error", code: "stale_claim" });
    const textual = await cli(args);
    expect(textual.stderr).toContain("attempt_ref is not a valid attempt_ref");
    expect(textual.stderr).toContain("webcodex task show TASK_ID");
    expect(created.task_id).toBeDefined();
    const usage = await cli(["task", "close", created.task_id as string, "--outcome", "great"]);
    expect(usage.code).toBe(2);
    expect(usage.stderr).toContain("--outcome must be one of");
  });
});
