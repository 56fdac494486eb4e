/**
 * Issues 14 and 15: `webcodex task …` and `webcodex session …` / `run
 * --session` / `--context-session` (the CLI binary, over MCP) against a real
 * Server, Runner and fake agent, each printing the ids a host must keep.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI_BIN, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { composeContextPrompt } from "../../src/sessions/service.js";
import { type Stack, startStack } from "../support/stack.js";
import { promptsOf } from "../support/tool-calls.js";

const SCOPES = ["coding_agent:run", "project:write", "project:read", "runtime:read", "runtime:write"] as const;
const exec = promisify(execFile);

let stack: Stack;
let env: NodeJS.ProcessEnv;

beforeAll(async () => {
  stack = await startStack({
    principals: [{ id: "alice", scopes: [...SCOPES], projects: ["demo"] }],
  });
  env = {
    ...process.env,
    WEBCODEX_URL: stack.mcpUrl.href,
    WEBCODEX_TOKEN: await stack.issueToken("alice", [...SCOPES], ["demo"]),
    NO_COLOR: "1",
  };
});

afterAll(async () => {
  await stack?.stop();
});

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

  it("creates, updates and shows a workflow session; run --session records, --context-session quotes the handoff", async () => {
    const created = await json(["session", "create", "--project", "demo", "--title", "cli session"]);
    expect(created).toMatchObject({ type: "session_created", project_id: "demo", version: 1 });
    const sid = created.session_id as string;
    const updated = await cli([
      "session",
      "update",
      sid,
      "--handoff",
      "HANDOFF-cli-1",
      "--goal",
      "green",
      "--expected-version",
      "1",
    ]);
    expect(updated.stdout).toContain(`session ${sid} · version 2 · handoff v1 · goal v1`);
    const stale = await cli(["session", "update", sid, "--goal", "x", "--expected-version", "1", "--json"]);
    expect(stale.code).toBe(1);
    expect(JSON.parse(stale.stdout.trim())).toMatchObject({ type: "error", code: "version_conflict" });

    const recorded = await cli(["run", "--project", "demo", "--provider", "fake", "--session", sid, "scenario: hello"]);
    expect(recorded.code, recorded.stderr).toBe(0);
    const withContext = await cli([
      "run",
      "--project",
      "demo",
      "--provider",
      "fake",
      "--context-session",
      sid,
      "--key",
      "cli-ctx-1",
      "Continue.",
    ]);
    expect(withContext.code, withContext.stderr).toBe(0);
    const quoted = composeContextPrompt(
      { session_id: sid, handoff: "HANDOFF-cli-1", handoff_version: 1, goal: "green", goal_version: 1 },
      "Continue.",
    );
    expect(promptsOf(stack.ledger(), quoted)).toHaveLength(1);
    // Pinned to the version shown (2): it starts; pinned to an older one: refused, nothing sent.
    const pinnedArgs = (version: string, key: string) => [
      "run",
      "--project",
      "demo",
      "--provider",
      "fake",
      "--context-session",
      sid,
      "--context-version",
      version,
      "--key",
      key,
      "Continue.",
    ];
    const prompts = () => stack.ledger().filter((l) => l.event === "prompt").length;
    const pinned = await cli(pinnedArgs("2", "cli-ctx-pinned"));
    expect(pinned.code, pinned.stderr).toBe(0);
    const before = prompts();
    const refused = await cli([...pinnedArgs("1", "cli-ctx-stale"), "--json"]);
    expect(refused.code).toBe(1);
    expect(JSON.parse(refused.stdout.trim())).toMatchObject({ type: "error", code: "context_version_conflict" });
    expect(prompts()).toBe(before);
    const orphan = await cli(["run", "--project", "demo", "--provider", "fake", "--context-version", "2", "go"]);
    expect(orphan.code).toBe(2);
    expect(orphan.stderr).toContain("--context-version pins the version of --context-session");

    const shown = await poll(
      async () => {
        const out = (await cli(["session", "show", sid])).stdout;
        return out.includes("coding_agent_terminal") && out;
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: 100, what: "the session to show the run's end" },
    );
    expect(shown).toContain(`session ${sid} · project demo · cli session · version 2`);
    expect(shown).toContain("handoff (v1):\nHANDOFF-cli-1");
    expect(shown).toMatch(/#1 \S+ coding_agent_started wc_agent_run_\w+/);
    expect(shown).toMatch(/coding_agent_terminal wc_agent_run_\w+ · completed · end_turn/);
    const usage = await cli(["session", "update", sid]);
    expect(usage.code).toBe(2);
    expect(usage.stderr).toContain("give --handoff, --goal or both");
  });
});
