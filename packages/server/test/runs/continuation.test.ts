/**
 * Issue 42 (design §17): continuation, whole stack — a real Server, a real Runner, the fake agent persisting
 * its sessions (`--continuation`, `--session-dir`), and a real MCP client over HTTP. `scenario: recall`
 * answers the nonce line of the session's previous prompt, so a resumed session is told from a fresh one.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { ProcStack } from "../support/proc-stack.js";
import { ok, promptsOf, toolError } from "../support/tool-calls.js";
import { followTurn, runTurn } from "../support/turns.js";

const START = "start_coding_agent";

describe("continuation: follow-up turns in the agent's own session", () => {
  let s: ProcStack | undefined;
  let sessions: string | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
    if (sessions) rmSync(sessions, { recursive: true, force: true });
  });

  async function stack(continuation: "both" | "load" | "none", declared = continuation): Promise<ProcStack> {
    sessions = mkdtempSync(join(tmpdir(), "wc-fake-sessions-"));
    s = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      agentArgs: continuation === "none" ? [] : ["--continuation", continuation, "--session-dir", sessions],
      agentToml: `continuation = "${declared}"`,
    }).init();
    await s.startRunner("r1");
    return s;
  }

  it("a chain of three turns resumes the agent's session (recall), observe names parent_run_id and continued_by", async () => {
    const st = await stack("both");
    const alice = await st.mcp("alice");
    const one = await runTurn(alice, "t1", "scenario: hello\nnonce: first-1");
    expect(one.last.state).toBe("completed");
    const two = await runTurn(alice, "t2", "scenario: recall\nnonce: second-2", one.runId);
    expect(two.last.state).toBe("completed");
    expect(two.text).toBe("recall: nonce: first-1");
    const three = await runTurn(alice, "t3", "scenario: recall", two.runId);
    expect(three.text).toBe("recall: nonce: second-2");
    expect(three.last.parent_run_id).toBe(two.runId);

    const first = await ok(alice, "observe_coding_agent", { run_id: one.runId });
    expect(first.continued_by).toBe(two.runId);
    expect(first.parent_run_id).toBeUndefined();
    const middle = await ok(alice, "observe_coding_agent", { run_id: two.runId });
    expect([middle.parent_run_id, middle.continued_by]).toEqual([one.runId, three.runId]);
    // A fresh run (no continue_run_id) remembers nothing.
    const fresh = await runTurn(alice, "t4", "scenario: recall");
    expect(fresh.text).toBe("recall: nothing");
  });

  it("session/load: the replayed history is not the new run's events", async () => {
    const st = await stack("load");
    const alice = await st.mcp("alice");
    const one = await runTurn(alice, "l1", "scenario: hello\nnonce: loaded-1");
    const two = await runTurn(alice, "l2", "scenario: recall", one.runId);
    expect(two.text).toBe("recall: nonce: loaded-1");
    expect(two.text).not.toContain("replayed:");
    // Dropped as the parent's history, not counted as stray updates of this run (the Runner's own record,
    // read once the Runner, which holds its store exclusively, has stopped).
    await st.killRunner("r1", "SIGTERM");
    const db = new Database(join(st.dir, "runner-state-r1", "dispatch.sqlite"), { readonly: true });
    try {
      const row = db.prepare("SELECT ignored_updates FROM runs WHERE run_id = ?").get(two.runId) as {
        ignored_updates: number;
      };
      expect(row.ignored_updates).toBe(0);
    } finally {
      db.close();
    }
  });

  it("refusals start nothing: unknown, another principal's (same answer), a second child (continuation_conflict), not terminal", async () => {
    const st = await stack("both");
    const alice = await st.mcp("alice");
    const bob = await st.mcp("bob");
    const parent = await runTurn(alice, "p1", "scenario: hello\nnonce: p");
    const promptsBefore = st.prompts("r1").length;

    const unknown = await toolError(alice, START, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "u1",
      prompt: "scenario: recall",
      continue_run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa",
    });
    expect(unknown.code).toBe("not_found");
    // Bob gets exactly the answer an unknown run gets.
    const theirs = await toolError(bob, START, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "u1",
      prompt: "scenario: recall",
      continue_run_id: parent.runId,
    });
    expect(theirs.code).toBe("not_found");
    expect(theirs.message).toBe(unknown.message.replace("wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa", parent.runId));

    const child = await runTurn(alice, "c1", "scenario: recall", parent.runId);
    expect(child.text).toBe("recall: nonce: p");
    // The same call again is the same run, no conflict.
    const again = await ok(alice, START, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "c1",
      prompt: "scenario: recall",
      continue_run_id: parent.runId,
    });
    expect([again.run_id, again.replayed]).toEqual([child.runId, true]);
    const second = await toolError(alice, START, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "c2",
      prompt: "scenario: recall",
      continue_run_id: parent.runId,
    });
    expect(second.code).toBe("continuation_conflict");
    expect(second.message).toContain(child.runId);
    // Of all these calls only the one child's prompt reached the agent.
    expect(st.prompts("r1").length - promptsBefore).toBe(1);

    // Not terminal: a slow run continued while it runs.
    const slow = await ok(alice, START, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "s1",
      prompt: "scenario: slow interval_ms=100 count=600",
    });
    const early = await toolError(alice, START, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "s2",
      prompt: "scenario: recall",
      continue_run_id: slow.run_id,
    });
    expect(early.code).toBe("invalid_input");
    expect(early.message).toContain("terminal");
    await ok(alice, "cancel_coding_agent", { run_id: slow.run_id });
  });

  it("an agent that cannot continue: continuation_unsupported naming the provider, nothing started", async () => {
    const st = await stack("none");
    const alice = await st.mcp("alice");
    const parent = await runTurn(alice, "n1", "scenario: hello");
    const refused = await toolError(alice, START, {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "n2",
      prompt: "scenario: recall",
      continue_run_id: parent.runId,
    });
    expect(refused.code).toBe("continuation_unsupported");
    expect(refused.message).toContain("fake (Fake agent)");
    expect(st.prompts("r1")).toHaveLength(1);
  });

  it("an agent declared able to continue whose initialize says otherwise: the child ends failed/not_started, no prompt", async () => {
    const st = await stack("none", "both");
    const alice = await st.mcp("alice");
    const parent = await runTurn(alice, "d1", "scenario: hello");
    const child = await runTurn(alice, "d2", "scenario: recall", parent.runId);
    expect([child.last.state, child.last.execution_state, child.last.failure_kind]).toEqual([
      "failed",
      "not_started",
      "provider_rejected",
    ]);
    expect(child.last.message).toContain("neither session/resume nor session/load");
    expect(st.prompts("r1")).toHaveLength(1);
  });

  it.each(["after_admission", "before_barrier"] as const)(
    "a chain survives kill -9 of the Runner during the child's setup (%s): the child ends not_started, its prompt never sent, and continuing it resumes the conversation",
    async (failpoint) => {
      const st = await stack("both");
      const alice = await st.mcp("alice");
      const parent = await runTurn(alice, `${failpoint}-p`, "scenario: hello\nnonce: before-crash");
      await st.killRunner("r1", "SIGKILL");
      await st.startRunner("r1", [], { WEBCODEX_FAILPOINT: failpoint });
      const childPrompt = `scenario: hello\nnonce: crashed-child-${failpoint}`;
      const started = await ok(alice, START, {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: `${failpoint}-c`,
        prompt: childPrompt,
        continue_run_id: parent.runId,
      });
      expect(await st.runnerExit("r1")).toEqual({ code: null, signal: "SIGKILL" });
      await st.startRunner("r1");
      const child = await followTurn(alice, started.run_id as string);
      // Setup never crossed the dispatch barrier: certain that nothing was sent, so not_started.
      expect([child.last.state, child.last.execution_state, child.last.failure_kind]).toEqual([
        "failed",
        "not_started",
        "runner_restarted",
      ]);
      expect(promptsOf(st.prompts("r1"), childPrompt)).toHaveLength(0);
      expect(child.last.parent_run_id).toBe(parent.runId);
      // The child holds its parent's ACP session from admission on: continuing it takes the conversation up.
      const next = await runTurn(alice, `${failpoint}-n`, "scenario: recall", started.run_id as string);
      expect(next.last.state).toBe("completed");
      expect(next.text).toBe("recall: nonce: before-crash");
    },
  );

  it("a chain survives kill -9 of the Runner just after the child's prompt was written: the child is lost, dispatched once, and can be continued", async () => {
    const st = await stack("both");
    const alice = await st.mcp("alice");
    const parent = await runTurn(alice, "w-p", "scenario: hello\nnonce: before-crash");
    await st.killRunner("r1", "SIGKILL");
    await st.startRunner("r1", [], { WEBCODEX_FAILPOINT: "after_prompt_write" });
    const childPrompt = "scenario: hello\nnonce: written-child";
    const childArgs = {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "w-c",
      prompt: childPrompt,
      continue_run_id: parent.runId,
    };
    const started = await ok(alice, START, childArgs);
    expect(await st.runnerExit("r1")).toEqual({ code: null, signal: "SIGKILL" });
    await poll(() => promptsOf(st.prompts("r1"), childPrompt).length === 1, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "the child's prompt in the agent's ledger",
    });
    await st.startRunner("r1");
    const child = await followTurn(alice, started.run_id as string);
    expect([child.last.state, child.last.execution_state]).toEqual(["lost", "outcome_unknown"]);
    // The same call again is the same run, never a second dispatch.
    const again = await ok(alice, START, childArgs);
    expect([again.run_id, again.replayed]).toEqual([started.run_id, true]);
    expect(promptsOf(st.prompts("r1"), childPrompt)).toHaveLength(1);
    // What the lost turn left in the agent's session is unknown; the session itself goes on (a fresh one
    // would recall nothing).
    const next = await runTurn(alice, "w-n", "scenario: recall", started.run_id as string);
    expect(next.last.state).toBe("completed");
    expect(next.text).toMatch(/^recall: nonce: (written-child|before-crash)$/);
  });

  it("a chain survives kill -9 of the Runner between turns (the session id is in the dispatch store)", async () => {
    const st = await stack("both");
    const alice = await st.mcp("alice");
    const one = await runTurn(alice, "k1", "scenario: hello\nnonce: before-kill");
    await st.killRunner("r1", "SIGKILL");
    await st.startRunner("r1");
    const two = await runTurn(alice, "k2", "scenario: recall", one.runId);
    expect(two.text).toBe("recall: nonce: before-kill");
  });
});
