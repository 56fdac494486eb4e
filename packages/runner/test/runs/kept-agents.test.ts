/**
 * `[acp] keep_agent_alive_secs` on the Runner (design §17, runs/kept-agents.ts), over the real fake agent and the
 * real dispatch store: the kept agent's process group stays on its run's row until the follow-up's row names it;
 * a start that needs the slot stops the kept agent (never a refusal) and the follow-up goes cold; close() stops
 * every kept agent. The ledger's `initialize` and `prompt` lines carry the agent's pid.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { FAKE_AGENT_BIN, type LedgerLine, poll, readLedger } from "../../../../scripts/test-support/index.js";
import { parseConfig } from "../../src/config/config.js";
import { readDiagnostics } from "../../src/runs/diagnostics.js";
import type { RunManager } from "../../src/runs/manager.js";
import type { DispatchStore } from "../../src/store/types.js";
import { makeWorkspace, newManager, runToEnd, startRequest, type Workspace } from "../support/harness.js";

/** Bound of the polls for a process to be gone (a loaded machine). */
const GONE_WAIT_MS = 30_000;

const workspaces: Workspace[] = [];
const managers: RunManager[] = [];
afterEach(async () => {
  for (const m of managers.splice(0)) await m.close();
  for (const ws of workspaces.splice(0)) ws.cleanup();
});

function setup(maxConcurrentRuns: number): { ws: Workspace; manager: RunManager; store: DispatchStore } {
  const ws = makeWorkspace();
  workspaces.push(ws);
  const sessions = join(ws.dir, "sessions");
  const text = [
    "[runner]",
    `state_dir = ${JSON.stringify(join(ws.dir, "state"))}`,
    "[[projects]]",
    'id = "demo"',
    `root = ${JSON.stringify(ws.projectRoot)}`,
    "allow_patch = true",
    "[acp]",
    "agents_share_runner_user = true",
    `max_concurrent_runs = ${maxConcurrentRuns}`,
    "cancel_grace_secs = 5",
    "keep_agent_alive_secs = 600",
    "[[acp.agents]]",
    'id = "fake"',
    `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
    `args = ${JSON.stringify(["--ledger", ws.ledger, "--continuation", "both", "--session-dir", sessions, "--ledger-initialize"])}`,
    'continuation = "both"',
    "[acp.agents.env_from_env]",
    'PATH = "PATH"',
    "",
  ].join("\n");
  const file = join(ws.dir, "runner.toml");
  writeFileSync(file, text);
  const { manager, store } = newManager(parseConfig(readFileSync(file, "utf8"), file), {
    diagnosticsDir: join(ws.dir, "diagnostics"),
  });
  managers.push(manager);
  return { ws, manager, store };
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function gone(pid: number, what: string): Promise<void> {
  await poll(async () => !alive(pid), { timeoutMs: GONE_WAIT_MS, intervalMs: 50, what });
}

/** The ledger lines after the first `mark`, and the pid of their one prompt. */
function turn(ws: Workspace, mark: number): { lines: LedgerLine[]; pid: number } {
  const lines = readLedger(ws.ledger).slice(mark);
  const prompts = lines.filter((l) => l.event === "prompt");
  expect(prompts).toHaveLength(1);
  return { lines, pid: prompts[0]?.pid as number };
}

describe("kept agents on the Runner", () => {
  it("the kept agent's group stays on its run's row until the follow-up's row names it; the follow-up prompts it", async () => {
    const { ws, manager, store } = setup(4);
    const one = await runToEnd(manager, "scenario: hello\nnonce: row-1");
    const first = turn(ws, 0);
    expect(one.run.state).toBe("completed");
    // Settled, and still alive: its identity is on the run's row, so a restart's reaper would find it.
    expect(alive(first.pid)).toBe(true);
    expect(store.get(one.run.run_id)?.child_pgid).toBe(first.pid);

    const mark = readLedger(ws.ledger).length;
    const two = await runToEnd(manager, "scenario: recall", { continue_run_id: one.run.run_id });
    expect(two.events.filter((e) => e.kind === "agent_message").map((e) => e.text)).toEqual(["recall: nonce: row-1"]);
    const second = turn(ws, mark);
    expect(second.pid).toBe(first.pid);
    expect(second.lines.map((l) => l.event)).toEqual(["prompt"]);
    // The group moved to the follow-up's row (kept again, it completed too); the parent's row names none now.
    expect(store.get(two.run.run_id)?.child_pgid).toBe(first.pid);
    expect(store.get(one.run.run_id)?.child_pgid).toBeNull();
  });

  it("a run whose agent is kept has its diagnostics file like any other: its turn's stage and timings, no exit", async () => {
    const { ws, manager } = setup(4);
    const one = await runToEnd(manager, "scenario: hello");
    const pid = turn(ws, 0).pid;
    expect(alive(pid)).toBe(true);
    const diagnostics = readDiagnostics(join(ws.dir, "diagnostics"), one.run.run_id);
    expect(diagnostics).toMatchObject({
      run_id: one.run.run_id,
      state: "completed",
      stage: "prompt",
      exit_code: null,
      exit_signal: null,
    });
    expect(diagnostics?.timings_ms.initialize).toBeGreaterThan(0);
  });

  it("a start that needs the slot stops the kept agent (no refusal); its follow-up then goes cold", async () => {
    const { ws, manager, store } = setup(2);
    const one = await runToEnd(manager, "scenario: hello\nnonce: slot-1");
    const kept = turn(ws, 0).pid;
    expect(alive(kept)).toBe(true);

    // One run going (1 slot) and one agent kept: the Runner is full, so the next start stops the kept agent.
    const slow = startRequest(manager, "scenario: slow interval_ms=100 count=600");
    expect((await manager.start(slow)).ok).toBe(true);
    const other = startRequest(manager, "scenario: hello\nnonce: slot-2");
    const started = await manager.start(other);
    expect(started.ok).toBe(true);
    await gone(kept, "the kept agent to be stopped for the slot");
    await manager.whenSettled(other.run_id);
    await poll(async () => store.get(one.run.run_id)?.child_pgid === null, {
      timeoutMs: GONE_WAIT_MS,
      intervalMs: 50,
      what: "the stopped agent's group cleared from its run's row",
    });
    await manager.cancel(slow.run_id);
    await manager.whenSettled(slow.run_id);

    const mark = readLedger(ws.ledger).length;
    const two = await runToEnd(manager, "scenario: recall", { continue_run_id: one.run.run_id });
    expect(two.events.filter((e) => e.kind === "agent_message").map((e) => e.text)).toEqual(["recall: nonce: slot-1"]);
    const cold = turn(ws, mark);
    expect(cold.pid).not.toBe(kept);
    expect(cold.lines.filter((l) => l.event !== "prompt").map((l) => l.event)).toEqual([
      "initialize",
      "session_resume",
    ]);
  });

  it("a start answered without admitting a run (a retry, a refusal) stops no kept agent, even on a full Runner", async () => {
    const { ws, manager } = setup(2);
    const one = await runToEnd(manager, "scenario: hello\nnonce: retry-1");
    const kept = turn(ws, 0).pid;
    const slow = startRequest(manager, "scenario: slow interval_ms=100 count=600");
    expect((await manager.start(slow)).ok).toBe(true);
    // Its prompt in the ledger before the follow-up's turn is read from there.
    await poll(async () => readLedger(ws.ledger).filter((l) => l.event === "prompt").length === 2, {
      timeoutMs: GONE_WAIT_MS,
      intervalMs: 50,
      what: "the slow run prompted",
    });

    // Full (one run going, one agent kept): a retry of the running start, and a start the Runner refuses.
    expect(await manager.start(slow)).toMatchObject({ ok: true, created: false });
    const refused = await manager.start({ ...startRequest(manager, "scenario: hello"), project_id: "no-such-project" });
    expect(refused.ok ? "admitted" : refused.code).toBe("unknown_project");

    // The follow-up finds its agent still kept: the same process, prompted without a new initialize.
    const mark = readLedger(ws.ledger).length;
    const two = await runToEnd(manager, "scenario: recall", { continue_run_id: one.run.run_id });
    expect(two.events.filter((e) => e.kind === "agent_message").map((e) => e.text)).toEqual(["recall: nonce: retry-1"]);
    const warm = turn(ws, mark);
    expect(warm.pid).toBe(kept);
    expect(warm.lines.map((l) => l.event)).toEqual(["prompt"]);
    await manager.cancel(slow.run_id);
    await manager.whenSettled(slow.run_id);
  });

  it("close() stops every kept agent", async () => {
    const { ws, manager, store } = setup(4);
    const one = await runToEnd(manager, "scenario: hello");
    const pid = turn(ws, 0).pid;
    expect(alive(pid)).toBe(true);
    expect(store.get(one.run.run_id)?.child_pgid).toBe(pid);
    await manager.close();
    await gone(pid, "the kept agent to be stopped at close");
  });
});
