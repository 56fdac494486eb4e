/**
 * Issue 14 acceptance: the managed path (AgentTask attempts over the same
 * Run) through the SDK's MCP client against a real Server, a real Runner
 * daemon and the fake ACP agent, whose ledger proves how often a prompt was
 * dispatched. The crash tests (Server kill -9) are in agent-tasks-crash.test.ts.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { type Stack, startStack } from "../support/stack.js";
import { observeToEnd, observeUntil, ok, promptsOf, type Structured, toolError } from "../support/tool-calls.js";

const SCOPES = ["coding_agent:run", "project:write", "project:read"] as const;
const INSTRUCTION_CANARY = canary("task-instruction");

let stack: Stack;
let alice: Client;
let alice2: Client;
let bob: Client;

beforeAll(async () => {
  stack = await startStack({
    principals: [
      { id: "alice", scopes: [...SCOPES], projects: ["demo", "other"] },
      { id: "bob", scopes: [...SCOPES], projects: ["demo", "other"] },
    ],
    projects: [
      { id: "demo", allow_patch: true },
      { id: "other", allow_patch: true },
    ],
    acp: { max_concurrent_runs: 8 },
  });
  const aliceToken = await stack.issueToken("alice", [...SCOPES], ["demo", "other"]);
  alice = await stack.connect(aliceToken);
  alice2 = await stack.connect(aliceToken);
  bob = await stack.connect(await stack.issueToken("bob", [...SCOPES], ["demo", "other"]));
});

afterAll(async () => {
  await stack?.stop();
});

let counter = 0;
const unique = (label: string) => `${label}-${process.pid}-${++counter}`;

async function createTask(client: Client, instruction: string, over: Structured = {}): Promise<Structured> {
  return ok(client, "create_agent_task", {
    project_id: "demo",
    instruction,
    idempotency_key: unique("task"),
    title: "a task",
    ...over,
  });
}

async function attempt(client: Client, taskId: string, over: Structured = {}): Promise<Structured> {
  return ok(client, "start_agent_task_attempt", { task_id: taskId, assignee: "host-1", ...over });
}

function startRun(client: Client, claim: Structured) {
  return ok(client, "start_agent_task_coding_run", { project_id: "demo", provider_id: "fake", ...claim });
}

function tupleOf(a: Structured): Structured {
  return {
    task_id: a.task_id,
    attempt_id: a.attempt_id,
    assignee: a.assignee,
    fence: a.fence,
    controller_generation: a.controller_generation,
  };
}

/** Wait until the wall clock is past an ISO timestamp (a lease's end). */
async function until(iso: unknown): Promise<void> {
  const end = Date.parse(String(iso));
  while (Date.now() <= end + 50) await new Promise((r) => setTimeout(r, Math.max(20, end + 60 - Date.now())));
}

function auditRows(tool: string): Promise<{ run_id: string | null; outcome: string }[]> {
  return stack.rows("SELECT run_id, outcome FROM mcp_audit WHERE tool = ? ORDER BY id", [tool]);
}

/** Bound on the audit writer flushing a call's row. */
const AUDIT_WAIT_MS = 30_000;

async function waitForAudit(tool: string, runId: string): Promise<void> {
  await poll(async () => (await auditRows(tool)).some((r) => r.run_id === runId), {
    timeoutMs: AUDIT_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: `an audit row of ${tool} naming ${runId}`,
  });
}

describe("agent tasks over MCP (real Server, Runner and fake agent)", () => {
  it("lists the five task tools next to the run tools, each with a closed input and an output schema", async () => {
    const { tools } = await alice.listTools();
    const names = tools.map((t) => t.name);
    for (const name of [
      "create_agent_task",
      "start_agent_task_attempt",
      "start_agent_task_coding_run",
      "reconcile_agent_task_coding_run",
      "close_agent_task",
    ]) {
      const tool = tools.find((t) => t.name === name);
      if (!tool) throw new Error(`tools/list lacks ${name}`);
      expect((tool.inputSchema as { additionalProperties?: unknown }).additionalProperties).toBe(false);
      expect(tool.outputSchema?.type).toBe("object");
    }
    expect(names).toContain("start_coding_agent");
    const run = tools.find((t) => t.name === "start_agent_task_coding_run");
    expect(Object.keys(run?.inputSchema.properties ?? {})).not.toContain("prompt");
    expect(Object.keys(run?.inputSchema.properties ?? {})).not.toContain("idempotency_key");
  });

  it("happy path: create → attempt → run → observe to completed → reconcile records the run outcome, the task stays open", async () => {
    const instruction = `scenario: hello text="${unique("happy")}"`;
    const task = await createTask(alice, instruction);
    expect(task.task_id).toMatch(/^wc_task_[a-z2-7]{26}$/);
    expect(task).toMatchObject({ project_id: "demo", state: "open", replayed: false });
    expect(task.instruction_bytes).toBe(Buffer.byteLength(instruction));
    const claim = await attempt(alice, task.task_id as string);
    expect(claim).toMatchObject({ task_id: task.task_id, fence: 1, controller_generation: 1, renewed: false });
    expect(claim.attempt_id).toMatch(/^wc_attempt_[a-z2-7]{26}$/);
    expect(claim.attempt_ref).toMatch(/^wcatt1\./);

    const run = await startRun(alice, { attempt_ref: claim.attempt_ref });
    expect(run).toMatchObject({ task_id: task.task_id, attempt_id: claim.attempt_id, replayed: false });
    const end = await observeToEnd(alice, run.run_id as string);
    expect(end.state).toBe("completed");

    const rec = await ok(alice, "reconcile_agent_task_coding_run", {
      task_id: task.task_id,
      attempt_id: claim.attempt_id,
    });
    expect(rec.task).toMatchObject({ task_id: task.task_id, state: "open", current_attempt_id: claim.attempt_id });
    expect((rec.task as Structured).outcome).toBeUndefined();
    expect(rec.attempt).toMatchObject({
      attempt_id: claim.attempt_id,
      state: "active",
      run: { run_id: run.run_id, state: "completed", execution_state: "completed", stop_reason: "end_turn" },
    });
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(1);

    const closed = await ok(alice, "close_agent_task", { task_id: task.task_id, outcome: "succeeded" });
    expect(closed).toMatchObject({ already_closed: false, task: { state: "closed", outcome: "succeeded" } });
    const again = await ok(alice, "close_agent_task", { task_id: task.task_id, outcome: "succeeded" });
    expect(again.already_closed).toBe(true);
    expect((await toolError(alice, "close_agent_task", { task_id: task.task_id, outcome: "failed" })).code).toBe(
      "claim_conflict",
    );
    const refused = await toolError(alice, "start_agent_task_attempt", { task_id: task.task_id, assignee: "h" });
    expect(refused.code).toBe("claim_conflict");
  });

  it("create_agent_task is idempotent by key and refuses the same key with a changed instruction", async () => {
    const key = unique("idem");
    const first = await createTask(alice, "scenario: hello", { idempotency_key: key });
    const second = await createTask(alice, "scenario: hello", { idempotency_key: key });
    expect(second).toMatchObject({ task_id: first.task_id, replayed: true });
    const conflict = await toolError(alice, "create_agent_task", {
      project_id: "demo",
      instruction: "scenario: hello text=changed",
      idempotency_key: key,
      title: "a task",
    });
    expect(conflict.code).toBe("idempotency_conflict");
  });

  it("a repeated start with the same claim (ref, then tuple) returns the original run and dispatches one prompt", async () => {
    const instruction = `scenario: hello text="${unique("double")}"`;
    const task = await createTask(alice, instruction);
    const claim = await attempt(alice, task.task_id as string);
    const first = await startRun(alice, { attempt_ref: claim.attempt_ref });
    const second = await startRun(alice, { attempt_ref: claim.attempt_ref });
    const third = await startRun(alice, tupleOf(claim));
    expect(second).toMatchObject({ run_id: first.run_id, replayed: true });
    expect(third).toMatchObject({ run_id: first.run_id, replayed: true });
    await observeToEnd(alice, first.run_id as string);
    const fourth = await startRun(alice, { attempt_ref: claim.attempt_ref });
    expect(fourth).toMatchObject({ run_id: first.run_id, replayed: true, state: "completed" });
    // Other inputs under the same bound attempt are a conflict, never a second run.
    const changed = await toolError(alice, "start_agent_task_coding_run", {
      project_id: "demo",
      provider_id: "fake",
      attempt_ref: claim.attempt_ref,
      config: { model: "other" },
    });
    expect(changed.code).toBe("idempotency_conflict");
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(1);
  });

  it("concurrent starts from two clients with the same claim start one run", async () => {
    const instruction = `scenario: hello text="${unique("concurrent")}"`;
    const task = await createTask(alice, instruction);
    const claim = await attempt(alice, task.task_id as string);
    const results = await Promise.all([
      startRun(alice, { attempt_ref: claim.attempt_ref }),
      startRun(alice2, tupleOf(claim)),
      startRun(alice2, { attempt_ref: claim.attempt_ref }),
    ]);
    expect(new Set(results.map((r) => r.run_id)).size).toBe(1);
    expect(results.filter((r) => r.replayed === false)).toHaveLength(1);
    await observeToEnd(alice, results[0]?.run_id as string);
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(1);
  });

  it("refuses an expired lease, a stale fence, a wrong generation, a forged or cross-task claim before dispatch", async () => {
    const instruction = `scenario: hello text="${unique("stale")}"`;
    const task = await createTask(alice, instruction);
    const other = await createTask(alice, `scenario: hello text="${unique("other-task")}"`);
    const first = await attempt(alice, task.task_id as string, { lease_secs: 2 });
    await until(first.lease_expires_at);
    const expired = await toolError(alice, "start_agent_task_coding_run", {
      project_id: "demo",
      provider_id: "fake",
      attempt_ref: first.attempt_ref,
    });
    expect(expired.code).toBe("stale_claim");
    expect(expired.message).toMatch(/lease .* expired/);

    const second = await attempt(alice, task.task_id as string, { assignee: "host-2" });
    expect(second.fence).toBe(2);
    const refusals: [string, Structured][] = [
      ["stale fence (old ref)", { attempt_ref: first.attempt_ref }],
      ["stale fence (tuple)", { ...tupleOf(second), fence: 1 }],
      ["wrong generation", { ...tupleOf(second), controller_generation: 2 }],
      ["wrong assignee", { ...tupleOf(second), assignee: "host-1" }],
      [
        "forged ref",
        {
          attempt_ref: `${String(second.attempt_ref).slice(0, -2)}${String(second.attempt_ref).endsWith("AA") ? "BB" : "AA"}`,
        },
      ],
      ["cross-task tuple", { ...tupleOf(second), task_id: other.task_id }],
      ["another project", { attempt_ref: second.attempt_ref, project_id: "other" }],
    ];
    for (const [label, claim] of refusals) {
      const e = await toolError(alice, "start_agent_task_coding_run", {
        project_id: "demo",
        provider_id: "fake",
        ...claim,
      });
      expect(["stale_claim", "not_found", "invalid_input"], `${label}: ${e.code} ${e.message}`).toContain(e.code);
      if (label.startsWith("stale") || label === "wrong generation" || label === "forged ref") {
        expect(e.code, label).toBe("stale_claim");
      }
    }
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(0);
    // The current claim still works, and once.
    const run = await startRun(alice, { attempt_ref: second.attempt_ref });
    await observeToEnd(alice, run.run_id as string);
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(1);
  });

  it("renewing a live lease keeps the claim; re-taking an expired one bumps the generation and stales the old ref", async () => {
    const task = await createTask(alice, `scenario: hello text="${unique("renew")}"`);
    const claim = await attempt(alice, task.task_id as string, { lease_secs: 2 });
    const renewed = await attempt(alice, task.task_id as string, {
      lease_secs: 2,
      renew_attempt_ref: claim.attempt_ref,
    });
    expect(renewed).toMatchObject({
      attempt_id: claim.attempt_id,
      attempt_ref: claim.attempt_ref,
      controller_generation: 1,
      renewed: true,
    });
    expect(Date.parse(renewed.lease_expires_at as string)).toBeGreaterThanOrEqual(
      Date.parse(claim.lease_expires_at as string),
    );
    const other = await toolError(alice, "start_agent_task_attempt", { task_id: task.task_id, assignee: "host-2" });
    expect(other.code).toBe("claim_conflict");
    await until(renewed.lease_expires_at);
    const retaken = await attempt(alice, task.task_id as string, { renew_attempt_ref: claim.attempt_ref });
    expect(retaken).toMatchObject({ attempt_id: claim.attempt_id, controller_generation: 2, renewed: true });
    expect(retaken.attempt_ref).not.toBe(claim.attempt_ref);
    const stale = await toolError(alice, "start_agent_task_coding_run", {
      project_id: "demo",
      provider_id: "fake",
      attempt_ref: claim.attempt_ref,
    });
    expect(stale.code).toBe("stale_claim");
    const run = await startRun(alice, { attempt_ref: retaken.attempt_ref });
    expect((await observeToEnd(alice, run.run_id as string)).state).toBe("completed");
  });

  it("refuses a new attempt while the earlier attempt's run is running after its lease expired, until the run ends", async () => {
    const task = await createTask(alice, `scenario: slow interval_ms=100 count=600\n${unique("x")}`);
    const claim = await attempt(alice, task.task_id as string, { lease_secs: 3 });
    const run = await startRun(alice, { attempt_ref: claim.attempt_ref });
    await observeUntil(alice, run.run_id as string, (o) => o.state === "running");
    await until(claim.lease_expires_at);
    const refused = await toolError(alice, "start_agent_task_attempt", { task_id: task.task_id, assignee: "host-2" });
    expect(refused.code).toBe("claim_conflict");
    expect(refused.message).toContain(run.run_id as string);
    // Reconcile works after lease expiry and shows the run still running.
    const rec = await ok(alice, "reconcile_agent_task_coding_run", { task_id: task.task_id });
    expect(rec.attempt).toMatchObject({ lease_live: false, run: { run_id: run.run_id, state: "running" } });
    expect((await toolError(alice, "close_agent_task", { task_id: task.task_id, outcome: "abandoned" })).code).toBe(
      "claim_conflict",
    );
    await ok(alice, "cancel_coding_agent", { run_id: run.run_id });
    expect((await observeToEnd(alice, run.run_id as string)).state).toBe("cancelled");
    const next = await attempt(alice, task.task_id as string, { assignee: "host-2" });
    expect(next.fence).toBe(2);
  });

  it("a lost run blocks new attempts until it is explicitly superseded, and the supersede is audited", async () => {
    const instruction = `scenario: crash_before_response\n${unique("lost")}`;
    const task = await createTask(alice, instruction);
    const claim = await attempt(alice, task.task_id as string, { lease_secs: 2 });
    const run = await startRun(alice, { attempt_ref: claim.attempt_ref });
    expect((await observeToEnd(alice, run.run_id as string)).state).toBe("lost");
    await until(claim.lease_expires_at);
    const refused = await toolError(alice, "start_agent_task_attempt", { task_id: task.task_id, assignee: "host-2" });
    expect(refused.code).toBe("claim_conflict");
    expect(refused.message).toContain(`supersede_uncertain_run: "${run.run_id}"`);
    const wrong = await toolError(alice, "start_agent_task_attempt", {
      task_id: task.task_id,
      assignee: "host-2",
      supersede_uncertain_run: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa",
    });
    expect(wrong.code).toBe("invalid_input");
    const next = await attempt(alice, task.task_id as string, {
      assignee: "host-2",
      supersede_uncertain_run: run.run_id,
    });
    expect(next).toMatchObject({ fence: 2, superseded_run_id: run.run_id });
    await waitForAudit("start_agent_task_attempt", run.run_id as string);
    expect(
      (await auditRows("start_agent_task_attempt")).filter((r) => r.run_id === run.run_id && r.outcome === "ok"),
    ).toHaveLength(1);
    const rec = await ok(alice, "reconcile_agent_task_coding_run", {
      task_id: task.task_id,
      attempt_id: claim.attempt_id,
    });
    expect(rec.attempt).toMatchObject({ state: "superseded", run: { run_id: run.run_id, state: "lost" } });
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(1);
  });

  it("another principal with the same scopes sees nothing under the task", async () => {
    const instruction = `scenario: hello text="${unique("owned")}"`;
    const key = unique("shared-key");
    const task = await createTask(alice, instruction, { idempotency_key: key });
    const claim = await attempt(alice, task.task_id as string);
    const run = await startRun(alice, { attempt_ref: claim.attempt_ref });
    const calls: [string, Structured][] = [
      ["start_agent_task_attempt", { task_id: task.task_id, assignee: "bob" }],
      ["start_agent_task_coding_run", { project_id: "demo", provider_id: "fake", attempt_ref: claim.attempt_ref }],
      ["start_agent_task_coding_run", { project_id: "demo", provider_id: "fake", ...tupleOf(claim) }],
      ["reconcile_agent_task_coding_run", { task_id: task.task_id }],
      ["close_agent_task", { task_id: task.task_id, outcome: "abandoned" }],
      ["observe_coding_agent", { run_id: run.run_id }],
    ];
    for (const [tool, args] of calls) {
      const e = await toolError(bob, tool, args);
      expect(e.code, tool).toBe("not_found");
    }
    const bobs = await createTask(bob, instruction, { idempotency_key: key });
    expect(bobs.task_id).not.toBe(task.task_id);
    expect(bobs.replayed).toBe(false);
    await observeToEnd(alice, run.run_id as string);
    expect(promptsOf(stack.ledger(), instruction)).toHaveLength(1);
  });

  it("refuses a prompt or idempotency_key on the task run start, and a mix of ref and tuple, naming the field", async () => {
    const task = await createTask(alice, "scenario: hello");
    const claim = await attempt(alice, task.task_id as string);
    const base = { project_id: "demo", provider_id: "fake", attempt_ref: claim.attempt_ref };
    const prompt = await toolError(alice, "start_agent_task_coding_run", { ...base, prompt: "x" });
    expect(prompt).toMatchObject({ code: "invalid_input" });
    expect(prompt.message).toContain("'prompt'");
    const key = await toolError(alice, "start_agent_task_coding_run", { ...base, idempotency_key: "k" });
    expect(key.message).toContain("'idempotency_key'");
    const mixed = await toolError(alice, "start_agent_task_coding_run", { ...base, fence: 1 });
    expect(mixed.message).toContain("attempt_ref");
    const partial = await toolError(alice, "start_agent_task_coding_run", {
      project_id: "demo",
      provider_id: "fake",
      task_id: task.task_id,
    });
    expect(partial.message).toContain("missing attempt_id");
  });

  it("audit rows of the task tools carry task and attempt ids, sizes and outcomes, never the instruction", async () => {
    const instruction = `scenario: hello text="${INSTRUCTION_CANARY}-audit"`;
    const task = await createTask(alice, instruction);
    const claim = await attempt(alice, task.task_id as string);
    const run = await startRun(alice, { attempt_ref: claim.attempt_ref });
    await observeToEnd(alice, run.run_id as string);
    await ok(alice, "reconcile_agent_task_coding_run", { task_id: task.task_id });
    await waitForAudit("start_agent_task_coding_run", run.run_id as string);
    type Row = { tool: string; run_id: string | null; task_id: string | null; attempt_id: string | null };
    const rows = await poll(
      async () => {
        const all = await stack.rows<Row & Record<string, unknown>>(
          "SELECT * FROM mcp_audit WHERE task_id = ? ORDER BY id",
          [task.task_id as string],
        );
        return all.some((r) => r.tool === "reconcile_agent_task_coding_run") && all;
      },
      { timeoutMs: AUDIT_WAIT_MS, intervalMs: 50, what: "the reconcile call audited" },
    );
    expect(rows.map((r) => [r.tool, r.attempt_id, r.outcome])).toEqual([
      ["create_agent_task", null, "ok"],
      ["start_agent_task_attempt", claim.attempt_id, "ok"],
      ["start_agent_task_coding_run", claim.attempt_id, "ok"],
      ["reconcile_agent_task_coding_run", claim.attempt_id, "ok"],
    ]);
    expect(rows[2]).toMatchObject({ run_id: run.run_id, session_id: null });
    for (const r of rows) {
      expect(r.input_bytes).toBeGreaterThan(0);
      expect(r.output_bytes).toBeGreaterThan(0);
    }
    expect(JSON.stringify(rows)).not.toContain(INSTRUCTION_CANARY);
    // A refused call names the ids it was given (pattern-checked), with its error code.
    const unknownAttempt = `wc_attempt_${"a".repeat(26)}`;
    const refused = await toolError(alice, "reconcile_agent_task_coding_run", {
      task_id: task.task_id,
      attempt_id: unknownAttempt,
    });
    expect(refused.code).toBe("not_found");
    const refusedRow = async () =>
      (
        await stack.rows("SELECT task_id, attempt_id, outcome FROM mcp_audit WHERE attempt_id = ?", [unknownAttempt])
      )[0];
    expect(
      await poll(refusedRow, { timeoutMs: AUDIT_WAIT_MS, intervalMs: 50, what: "the refused call audited" }),
    ).toEqual({ task_id: task.task_id, attempt_id: unknownAttempt, outcome: "not_found" });
  });

  it("never writes the instruction to the Server log or the audit table", async () => {
    const instruction = `scenario: hello text="${INSTRUCTION_CANARY}"`;
    const task = await createTask(alice, instruction);
    const claim = await attempt(alice, task.task_id as string);
    const run = await startRun(alice, { attempt_ref: claim.attempt_ref });
    await observeToEnd(alice, run.run_id as string);
    await ok(alice, "reconcile_agent_task_coding_run", { task_id: task.task_id });
    await waitForAudit("start_agent_task_coding_run", run.run_id as string);
    expect(stack.serverLog()).not.toContain(INSTRUCTION_CANARY);
    const audit = JSON.stringify(await stack.rows("SELECT * FROM mcp_audit"));
    expect(audit).not.toContain(INSTRUCTION_CANARY);
    expect(audit).toContain(run.run_id as string);
  });
});
