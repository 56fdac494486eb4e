/**
 * Issue 42 (design §17): `continue_run_id` on the managed path's task-run tool (start_agent_task_coding_run) and
 * through MCP Tasks, whole stack — a real Server child, a real Runner, the fake agent persisting its sessions,
 * the SDK's client (2025-11-25) and raw 2026-07-28 requests declaring the Tasks extension. The checks and the
 * one-child link are the run core's admission (runs/continuation.ts), the same as start_coding_agent's. The
 * CLI binary's `webcodex run --continue`, and a chain in a `worktree` project (observe and the changes tool).
 */
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterEach, describe, expect, it } from "vitest";
import { CLI_BIN, DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { type ModernAnswer, postModern } from "../support/modern-mcp.js";
import { ProcStack } from "../support/proc-stack.js";
import { startStack } from "../support/stack.js";
import { ok, promptsOf, type Structured, toolError } from "../support/tool-calls.js";
import { followTurn, runTurn } from "../support/turns.js";

const TASK_RUN = "start_agent_task_coding_run";

let s: ProcStack | undefined;
let sessions: string | undefined;
afterEach(async () => {
  await s?.stop();
  s = undefined;
  if (sessions) rmSync(sessions, { recursive: true, force: true });
});

async function stack(): Promise<ProcStack> {
  sessions = mkdtempSync(join(tmpdir(), "wc-fake-sessions-"));
  s = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    server: "child",
    agentArgs: ["--continuation", "both", "--session-dir", sessions],
    agentToml: 'continuation = "both"',
  }).init();
  await s.startRunner("r1");
  return s;
}

/** A task whose instruction is `instruction`, claimed by host-1: its attempt_ref. */
async function claimedTask(client: Client, key: string, instruction: string): Promise<string> {
  return (await claimed(client, key, instruction)).ref;
}

/** The same, with the task's id. */
async function claimed(client: Client, key: string, instruction: string): Promise<{ ref: string; taskId: string }> {
  const task = await ok(client, "create_agent_task", { project_id: "demo", instruction, idempotency_key: key });
  const attempt = await ok(client, "start_agent_task_attempt", { task_id: task.task_id, assignee: "host-1" });
  return { ref: attempt.attempt_ref as string, taskId: task.task_id as string };
}

/** The attempt's run outcome as `reconcile_agent_task_coding_run` answers it. */
async function reconcile(client: Client, taskId: string): Promise<Structured> {
  const answer = await ok(client, "reconcile_agent_task_coding_run", { task_id: taskId });
  return (answer.attempt as { run: Structured }).run;
}

function taskRun(attemptRef: string, continueRunId?: string): Structured {
  return {
    project_id: "demo",
    provider_id: "fake",
    attempt_ref: attemptRef,
    ...(continueRunId === undefined ? {} : { continue_run_id: continueRunId }),
  };
}

describe("continuation on the task-run tool (2025-11-25 era)", () => {
  it("a task's run continues an earlier run's session; replays, and refuses exactly as start_coding_agent", async () => {
    const st = await stack();
    const alice = await st.mcp("alice");
    const bob = await st.mcp("bob");
    const parent = await runTurn(alice, "tp1", "scenario: hello\nnonce: task-parent");

    // Bob's own task, continuing Alice's run: the answer an unknown run gets, nothing started.
    const bobRef = await claimedTask(bob, "bob-task", "scenario: recall");
    const theirs = await toolError(bob, TASK_RUN, taskRun(bobRef, parent.runId));
    expect(theirs.code).toBe("not_found");
    expect(theirs.message).toContain("continue_run_id: no run");

    const ref = await claimedTask(alice, "task-1", "scenario: recall");
    const started = await ok(alice, TASK_RUN, taskRun(ref, parent.runId));
    const child = await followTurn(alice, started.run_id as string);
    expect(child.last.state).toBe("completed");
    expect(child.text).toBe("recall: nonce: task-parent");
    expect(child.last.parent_run_id).toBe(parent.runId);
    const parentNow = await ok(alice, "observe_coding_agent", { run_id: parent.runId });
    expect(parentNow.continued_by).toBe(started.run_id);
    // The reconcile tool names the attempt's run's chain as observe does.
    const taskId = started.task_id as string;
    const reconciled = await reconcile(alice, taskId);
    expect([reconciled.run_id, reconciled.parent_run_id, reconciled.continued_by]).toEqual([
      started.run_id,
      parent.runId,
      undefined,
    ]);
    // The same claim again is the same run: no conflict with itself.
    const again = await ok(alice, TASK_RUN, taskRun(ref, parent.runId));
    expect([again.run_id, again.replayed]).toEqual([started.run_id, true]);

    // A second task continuing the same parent: continuation_conflict naming the child.
    const ref2 = await claimedTask(alice, "task-2", "scenario: recall");
    const second = await toolError(alice, TASK_RUN, taskRun(ref2, parent.runId));
    expect(second.code).toBe("continuation_conflict");
    expect(second.message).toContain(started.run_id as string);
    // base_ref with continue_run_id: the follow-up continues from its parent's workspace; refused before anything.
    const based = await toolError(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "based",
      prompt: "scenario: recall",
      base_ref: "main",
      continue_run_id: started.run_id,
    });
    expect([based.code, based.recovery_kind]).toEqual(["invalid_input", "fix_input"]);
    expect(based.message).toContain("base_ref cannot be given with continue_run_id");
    // A parent that is not terminal yet.
    const slow = await ok(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "slow",
      prompt: "scenario: slow interval_ms=100 count=600",
    });
    const early = await toolError(alice, TASK_RUN, taskRun(ref2, slow.run_id as string));
    expect([early.code, early.recovery_kind]).toEqual(["invalid_input", "wait"]);
    expect(early.message).toContain("terminal");
    await ok(alice, "cancel_coding_agent", { run_id: slow.run_id });
    // Nothing of the refusals was recorded against the attempt: it still starts a fresh run, which remembers nothing.
    const fresh = await ok(alice, TASK_RUN, taskRun(ref2));
    expect((await followTurn(alice, fresh.run_id as string)).text).toBe("recall: nothing");
    // The instruction reached the agent twice (the child, the fresh run); none of the refused calls did.
    expect(promptsOf(st.prompts("r1"), "scenario: recall")).toHaveLength(2);
    // Once the task's run is continued, reconcile names its child too.
    const grandchild = await ok(alice, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "grandchild",
      prompt: "scenario: hello",
      continue_run_id: started.run_id,
    });
    expect((await reconcile(alice, taskId)).continued_by).toBe(grandchild.run_id);
    await followTurn(alice, grandchild.run_id as string);
  }, 180_000);
});

describe("continuation through MCP Tasks (2026-07-28 era)", () => {
  async function post(st: ProcStack, method: string, params: Record<string, unknown>, name: string) {
    const res = await postModern(st.port, st.principalTokens.get("alice") ?? "", method, params, {
      name,
      clientName: "continuation-test",
    });
    expect(res.status).toBe(200);
    return (await res.json()) as ModernAnswer;
  }

  async function startTask(st: ProcStack, tool: string, args: Record<string, unknown>): Promise<string> {
    const answer = await post(st, "tools/call", { name: tool, arguments: args }, tool);
    expect(answer.result).toMatchObject({ resultType: "task", status: "working" });
    return answer.result?.taskId as string;
  }

  /** tasks/get until the task is no longer working; its result's structured content. */
  async function taskResult(st: ProcStack, taskId: string): Promise<Structured> {
    let task: Record<string, unknown> = {};
    await poll(
      async () => {
        task = (await post(st, "tasks/get", { taskId }, taskId)).result ?? {};
        return task.status !== "working";
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: `task ${taskId} to end` },
    );
    expect(task.status).toBe("completed");
    return (task.result as { structuredContent: Structured }).structuredContent;
  }

  it("the task-run tool and start_coding_agent as tasks: the task results name parent_run_id and continued_by", async () => {
    const st = await stack();
    const alice = await st.mcp("alice");
    const first = await startTask(st, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "m1",
      prompt: "scenario: hello\nnonce: modern-1",
    });
    const one = await taskResult(st, first);
    expect(one.parent_run_id).toBeUndefined();
    expect(one.continued_by).toBeUndefined();

    const modern = await claimed(alice, "modern-task", "scenario: recall\nnonce: modern-2");
    const second = await startTask(st, TASK_RUN, taskRun(modern.ref, one.run_id as string));
    const two = await taskResult(st, second);
    expect(two.parent_run_id).toBe(one.run_id);
    expect((await followTurn(alice, two.run_id as string)).text).toBe("recall: nonce: modern-1");
    expect((await taskResult(st, first)).continued_by).toBe(two.run_id);

    const third = await startTask(st, "start_coding_agent", {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "m3",
      prompt: "scenario: recall",
      continue_run_id: two.run_id,
    });
    const three = await taskResult(st, third);
    expect([three.parent_run_id, (await taskResult(st, second)).continued_by]).toEqual([two.run_id, three.run_id]);
    expect((await followTurn(alice, three.run_id as string)).text).toBe("recall: nonce: modern-2");
    // The reconcile tool (a plain tool in this era too) names the task's run's chain both ways.
    const reconciled = await post(
      st,
      "tools/call",
      { name: "reconcile_agent_task_coding_run", arguments: { task_id: modern.taskId } },
      "reconcile_agent_task_coding_run",
    );
    const content = reconciled.result?.structuredContent as { attempt?: { run?: Structured } } | undefined;
    const run = content?.attempt?.run ?? {};
    expect([run.run_id, run.parent_run_id, run.continued_by]).toEqual([two.run_id, one.run_id, three.run_id]);

    // A refusal is the tool's own error, no task: a second child of the first run.
    const refused = await post(
      st,
      "tools/call",
      {
        name: "start_coding_agent",
        arguments: {
          project_id: "demo",
          provider_id: "fake",
          idempotency_key: "m4",
          prompt: "scenario: recall",
          continue_run_id: one.run_id,
        },
      },
      "start_coding_agent",
    );
    expect(refused.result?.isError).toBe(true);
    const text = ((refused.result?.content ?? []) as { text: string }[])[0]?.text ?? "";
    expect((JSON.parse(text) as { error: { code: string } }).error.code).toBe("continuation_conflict");
  }, 180_000);
});

describe("webcodex run --continue and task run --continue (the CLI binary over MCP)", () => {
  const exec = promisify(execFile);
  /** Bound on one CLI command (start and follow one turn). */
  const CLI_TIMEOUT_MS = 90_000;

  async function cli(st: ProcStack, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
    const env = {
      ...process.env,
      WEBCODEX_URL: `http://127.0.0.1:${st.port}/mcp`,
      WEBCODEX_TOKEN: st.principalTokens.get("alice") ?? "",
      NO_COLOR: "1",
    };
    try {
      const { stdout, stderr } = await exec(process.execPath, [CLI_BIN, ...args], { env, timeout: CLI_TIMEOUT_MS });
      return { code: 0, stdout, stderr };
    } catch (err) {
      const e = err as { code: number; stdout: string; stderr: string };
      return { code: e.code, stdout: e.stdout, stderr: e.stderr };
    }
  }

  it("continues a run named by its task id, refuses a second follow-up of the same run, and a task's run continues the chain", async () => {
    const st = await stack();
    const on = ["--project", "demo", "--provider", "fake"];
    const first = await cli(st, ["run", ...on, "--key", "cli-1", "--json", "scenario: hello\nnonce: cli-first"]);
    expect(first.code, first.stderr).toBe(0);
    const started = JSON.parse(first.stdout.split("\n")[0] ?? "{}") as { run_id: string; task_id: string };
    expect(started.task_id).toMatch(/^wc_task_/);

    const second = await cli(st, [
      "run",
      ...on,
      "--key",
      "cli-2",
      "--continue",
      started.task_id,
      "scenario: recall\nnonce: cli-second",
    ]);
    expect(second.code, second.stderr).toBe(0);
    expect(second.stdout).toContain(`continues ${started.run_id}`);
    expect(second.stdout).toContain("recall: nonce: cli-first");

    const third = await cli(st, ["run", ...on, "--key", "cli-3", "--json", "--continue", started.run_id, "x"]);
    expect(third.code).toBe(1);
    expect(third.stdout + third.stderr).toMatch(/"code":"continuation_conflict"/);

    // `webcodex task run --continue RUN_ID`: a task's run takes the conversation up from the second turn.
    const last = (r: { stdout: string }) => JSON.parse(r.stdout.trim().split("\n").at(-1) ?? "{}") as Structured;
    const secondRun = /▸ run (wc_agent_run_[a-z2-7]{26})/.exec(second.stdout)?.[1];
    const task = last(
      await cli(st, ["task", "create", "--project", "demo", "--key", "tk", "--json", "scenario: recall"]),
    );
    const claimed = last(await cli(st, ["task", "attempt", String(task.task_id), "--assignee", "h", "--json"]));
    const taskRun = await cli(st, [
      "task",
      "run",
      ...on,
      "--ref",
      String(claimed.attempt_ref),
      "--json",
      "--continue",
      "x",
    ]);
    expect(taskRun.code).toBe(2);
    const ran = last(
      await cli(st, [
        "task",
        "run",
        ...on,
        "--ref",
        String(claimed.attempt_ref),
        "--json",
        "--continue",
        secondRun ?? "",
      ]),
    );
    const followed = await cli(st, ["observe", String(ran.run_id), "--follow"]);
    expect(followed.code, followed.stderr).toBe(0);
    expect(followed.stdout).toContain("recall: nonce: cli-second");
  }, 180_000);
});

describe("continuation in a worktree project (whole stack)", () => {
  it("the follow-up works on its parent's branch from its parent's head; observe and get_coding_agent_changes show its turn", async () => {
    sessions = mkdtempSync(join(tmpdir(), "wc-fake-sessions-"));
    const scopes = ["coding_agent:run", "project:write", "project:read", "runtime:read"] as const;
    const st = await startStack({
      principals: [{ id: "alice", scopes: [...scopes], projects: ["demo"] }],
      projects: [{ id: "demo", allow_patch: true, workspace: "worktree" }],
      agentArgs: ["--continuation", "both", "--session-dir", sessions],
      agentToml: 'continuation = "both"',
    });
    try {
      const alice = await st.connect(await st.issueToken("alice", [...scopes], ["demo"]));
      const one = await runTurn(alice, "wt-1", "scenario: edit_file path=a.txt text=one\nnonce: wt-1");
      const ws1 = one.last.workspace as { branch: string; head_commit: string };
      expect(ws1.head_commit).toMatch(/^[0-9a-f]{40}$/);
      const two = await runTurn(alice, "wt-2", "scenario: edit_file path=b.txt text=two\nnonce: wt-2", one.runId);
      expect(two.last.state).toBe("completed");
      expect(two.last.workspace).toMatchObject({ mode: "worktree", branch: ws1.branch, base_commit: ws1.head_commit });
      const changes = await ok(alice, "get_coding_agent_changes", { run_id: two.runId });
      expect((changes.files as Structured[]).map((f) => `${f.status} ${f.path}`)).toEqual(["added b.txt"]);
      const three = await runTurn(alice, "wt-3", "scenario: recall", two.runId);
      expect(three.text).toBe("recall: nonce: wt-2");
      expect(three.last.workspace).toMatchObject({
        branch: ws1.branch,
        base_commit: (two.last.workspace as { head_commit: string }).head_commit,
      });
    } finally {
      await st.stop();
    }
  }, 180_000);
});
