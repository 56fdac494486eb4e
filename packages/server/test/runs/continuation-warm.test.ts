/**
 * Issue 42 (design §17): warm follow-ups, `[acp] keep_agent_alive_secs`, whole stack — a real Server, a real
 * Runner, the fake agent persisting its sessions and writing a ledger line (with its pid) for every `initialize`
 * and `session/prompt`. A follow-up within the time prompts the parent's live agent (same pid, no initialize, no
 * session/resume); when the time ends the agent is gone and a follow-up goes cold; a fresh run never takes a kept
 * agent; kill -9 of the Runner while an agent is kept has it reaped at the next start, and the chain goes on cold.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  type LedgerLine,
  poll,
  readLedger,
} from "../../../../scripts/test-support/index.js";
import { ProcStack } from "../support/proc-stack.js";
import { runTurn } from "../support/turns.js";

let s: ProcStack | undefined;
let sessions: string | undefined;
afterEach(async () => {
  await s?.stop();
  s = undefined;
  if (sessions) rmSync(sessions, { recursive: true, force: true });
});

async function stack(keepSecs: number): Promise<ProcStack> {
  sessions = mkdtempSync(join(tmpdir(), "wc-fake-sessions-"));
  s = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    server: "child",
    agentArgs: ["--continuation", "both", "--session-dir", sessions, "--ledger-initialize"],
    agentToml: 'continuation = "both"',
    acpTable: `keep_agent_alive_secs = ${keepSecs}`,
  }).init();
  await s.startRunner("r1");
  return s;
}

/** The ledger lines written since `mark` lines. */
function since(st: ProcStack, mark: number): LedgerLine[] {
  return readLedger(st.ledgerFile("r1")).slice(mark);
}

function mark(st: ProcStack): number {
  return readLedger(st.ledgerFile("r1")).length;
}

/** The pid of the one `prompt` line among `lines`. */
function promptPid(lines: LedgerLine[]): number {
  const prompts = lines.filter((l) => l.event === "prompt");
  expect(prompts).toHaveLength(1);
  return prompts[0]?.pid as number;
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
  await poll(async () => !alive(pid), { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what });
}

describe("warm follow-ups: keep_agent_alive_secs", () => {
  it("a follow-up within the time prompts the parent's live agent: same pid, no initialize, no session/resume; a fresh run never takes it", async () => {
    const st = await stack(120);
    const alice = await st.mcp("alice");
    const m0 = mark(st);
    const one = await runTurn(alice, "w1", "scenario: hello\nnonce: warm-1");
    expect(one.last.state).toBe("completed");
    const first = since(st, m0);
    const pid = promptPid(first);
    expect(first.filter((l) => l.event === "initialize")).toEqual([{ event: "initialize", pid }]);
    // The run has ended, and its agent is kept.
    expect(alive(pid)).toBe(true);

    // A fresh run (no continue_run_id) spawns its own agent.
    const m1 = mark(st);
    const fresh = await runTurn(alice, "w-fresh", "scenario: recall");
    expect(fresh.text).toBe("recall: nothing");
    const freshLines = since(st, m1);
    expect(promptPid(freshLines)).not.toBe(pid);
    expect(freshLines.filter((l) => l.event === "initialize")).toHaveLength(1);

    const m2 = mark(st);
    const two = await runTurn(alice, "w2", "scenario: recall\nnonce: warm-2", one.runId);
    expect([two.last.state, two.text, two.last.parent_run_id]).toEqual([
      "completed",
      "recall: nonce: warm-1",
      one.runId,
    ]);
    const second = since(st, m2);
    expect(promptPid(second)).toBe(pid);
    expect(second.filter((l) => l.event !== "prompt")).toEqual([]);

    // And again: the chain's third turn is still the same process.
    const m3 = mark(st);
    const three = await runTurn(alice, "w3", "scenario: recall", two.runId);
    expect(three.text).toBe("recall: nonce: warm-2");
    expect(promptPid(since(st, m3))).toBe(pid);
  });

  it("when the time ends the kept agent is gone; a follow-up then goes cold (spawn, initialize, session/resume) and still recalls", async () => {
    const st = await stack(1);
    const alice = await st.mcp("alice");
    const m0 = mark(st);
    const one = await runTurn(alice, "c1", "scenario: hello\nnonce: cold-1");
    const pid = promptPid(since(st, m0));
    await gone(pid, "the kept agent to be stopped at the end of its time");

    const m1 = mark(st);
    const two = await runTurn(alice, "c2", "scenario: recall", one.runId);
    expect(two.text).toBe("recall: nonce: cold-1");
    const lines = since(st, m1);
    const coldPid = promptPid(lines);
    expect(coldPid).not.toBe(pid);
    expect(lines.filter((l) => l.event !== "prompt").map((l) => l.event)).toEqual(["initialize", "session_resume"]);
  });

  it("kill -9 of the Runner while an agent is kept: the agent is gone once the Runner is back (EOF, else the start-up reaper), the follow-up goes cold", async () => {
    const st = await stack(600);
    const alice = await st.mcp("alice");
    const m0 = mark(st);
    const one = await runTurn(alice, "k1", "scenario: hello\nnonce: killed-1");
    const pid = promptPid(since(st, m0));
    expect(alive(pid)).toBe(true);
    await st.killRunner("r1", "SIGKILL");
    await st.startRunner("r1");
    await gone(pid, "the kept agent of the killed Runner to be gone");

    const m1 = mark(st);
    const two = await runTurn(alice, "k2", "scenario: recall", one.runId);
    expect([two.last.state, two.text]).toEqual(["completed", "recall: nonce: killed-1"]);
    const lines = since(st, m1);
    expect(promptPid(lines)).not.toBe(pid);
    expect(lines.filter((l) => l.event !== "prompt").map((l) => l.event)).toEqual(["initialize", "session_resume"]);
  });
});
