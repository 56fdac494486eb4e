/**
 * The crash matrix end to end: for each of the five failpoints, the real
 * `webcodex-server` process, a real `webcodex-runner` daemon that SIGKILLs
 * itself at that dispatch boundary, and the fake agent (its ledger counts the
 * prompts it received). After a Runner restart and reconciliation, a real MCP
 * client (Streamable HTTP, the principal's bearer token) must observe the
 * settled outcome, a retried start must replay the same run, and the prompt
 * must have reached the agent at most once.
 *
 * packages/runner/test/store/crash-matrix.test.ts keeps a tiny in-test Server for
 * what only it can reach: the Runner's `hello` inventory and raw `run.start`
 * replays/conflicts at the frame level, and orphan reaping by the restarted
 * Runner before its hello.
 *
 * The same failpoints with the project in `worktree` mode (issue 41 §3) and an agent that writes a canary into a
 * file of its worktree: after the restart, `get_coding_agent_changes` answers the recorded change through MCP — the
 * file and the canary in its diff exactly when the agent wrote it — and no worktree is left.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, realpathSync } from "node:fs";
import { join } from "node:path";
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { isTerminalState } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  poll,
  processesMentioning,
  readLedger,
} from "../../../../scripts/test-support/index.js";
import type { FailpointName } from "../../../runner/src/failpoints.js";
import { ProcStack } from "../support/proc-stack.js";

interface Case {
  failpoint: FailpointName;
  outcome: { state: string; execution_state: string };
  /** Prompts the agent received in total (before and after the restart). */
  prompts: 0 | 1;
  /** Whether the run's worktree is made before the failpoint (a `worktree` project's run). */
  made: boolean;
}

const notStarted = { state: "failed", execution_state: "not_started" };
const lost = { state: "lost", execution_state: "outcome_unknown" };
const completed = { state: "completed", execution_state: "completed" };

const CASES: Case[] = [
  { failpoint: "after_admission", outcome: notStarted, prompts: 0, made: false },
  { failpoint: "before_barrier", outcome: notStarted, prompts: 0, made: true },
  { failpoint: "after_barrier_before_prompt", outcome: lost, prompts: 0, made: true },
  { failpoint: "after_prompt_write", outcome: lost, prompts: 1, made: true },
  { failpoint: "after_terminal_before_projection", outcome: completed, prompts: 1, made: true },
];
const MODES = ["shared", "worktree"] as const;
const MATRIX = MODES.flatMap((mode) => CASES.map((c) => ({ ...c, mode })));
/** The file a worktree run's agent writes its canary into. */
const EDIT_PATH = "notes/canary.txt";

type Structured = Record<string, unknown>;

async function tool(client: Client, name: string, args: Record<string, unknown>): Promise<Structured> {
  const result = await client.callTool({ name, arguments: args }, undefined, { timeout: 60_000 });
  if (result.isError) throw new Error(`${name} failed: ${JSON.stringify(result.content)}`);
  return result.structuredContent as Structured;
}

/**
 * No recorded change lost, no worktree left: the change `get_coding_agent_changes` answers holds the agent's edit
 * (its file, the canary in the diff) exactly when the agent's ledger says it wrote it; without a worktree made
 * before the crash there is no branch; the Runner's workspaces dir is empty and git knows only the project's tree.
 */
async function expectChangeKept(s: ProcStack, alice: Client, runId: string, canary: string, made: boolean) {
  const root = join(s.dir, "projects", "demo");
  const git = (...args: string[]) => execFileSync("git", args, { cwd: root, encoding: "utf8" });
  const wrote = readLedger(s.ledgerFile("r1")).some((l) => l.event === "file_edited" && l.path === EDIT_PATH);
  if (made) {
    await s.startRunner("r1");
    const changes = await tool(alice, "get_coding_agent_changes", { run_id: runId });
    expect(changes).toMatchObject({ run_id: runId, recorded: true, branch: `webcodex/run/${runId}` });
    expect((changes.files as { path: string }[]).map((f) => f.path)).toEqual(wrote ? [EDIT_PATH] : []);
    expect(String(changes.diff).includes(canary), "the canary in the recorded diff").toBe(wrote);
    expect(git("rev-parse", `refs/heads/webcodex/run/${runId}`).trim()).toBe(changes.head_commit);
  } else {
    expect(wrote).toBe(false);
    expect(git("branch", "--list", `webcodex/run/${runId}`).trim()).toBe("");
  }
  // The restarted Runner's one spare worktree may be there (runner workspace/spares.ts); nothing else.
  const dir = join(s.dir, "runner-state-r1", "workspaces");
  const left = existsSync(dir) ? readdirSync(dir) : [];
  expect(
    left.filter((name) => name !== ".spares"),
    "worktrees left",
  ).toEqual([]);
  const trees = git("worktree", "list", "--porcelain")
    .split("\n")
    .filter((line) => line.startsWith("worktree "))
    .filter((line) => !line.startsWith(`worktree ${join(realpathSync(dir), ".spares")}/spare-`));
  expect(trees).toEqual([`worktree ${realpathSync(root)}`]);
}

describe("crash matrix against the real Server process", { timeout: 120_000 }, () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  it.each(MATRIX)(
    "$mode, $failpoint: the MCP observer sees $outcome.state/$outcome.execution_state after reconciliation; $prompts prompt(s) dispatched",
    async (c) => {
      const worktree = c.mode === "worktree";
      s = await new ProcStack({
        runners: [{ id: "r1", projects: ["demo"], ...(worktree ? { worktreeProjects: ["demo"] } : {}) }],
        server: "child",
      }).init();
      await s.startRunner("r1", [], { WEBCODEX_FAILPOINT: c.failpoint });
      const alice = await s.mcp("alice");
      const canary = `wc-edit-canary-${randomBytes(8).toString("hex")}`;
      const args = {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: `crash-${c.failpoint}`,
        prompt: worktree ? `scenario: edit_file path=${EDIT_PATH} text=${canary}` : "scenario: hello",
      };

      // The start answers (from the Runner, or settled by the Server when the link drops) ...
      const started = await tool(alice, "start_coding_agent", args);
      const runId = started.run_id as string;
      expect(runId).toMatch(/^wc_agent_run_/);
      // ... and the Runner dies by its own SIGKILL at the failpoint.
      expect(await s.runnerExit("r1")).toEqual({ code: null, signal: "SIGKILL" });
      await s.waitOffline("r1");
      // A prompt written before the crash is still in the agent's stdin pipe: let it reach the ledger
      // before the restarted Runner reaps the orphaned agent.
      if (c.prompts === 1)
        await poll(() => s?.prompts("r1").length === 1, {
          timeoutMs: DAEMON_WAIT_MS,
          intervalMs: DAEMON_POLL_MS,
          what: "the agent's ledger",
        });
      // A worktree run's agent that has the prompt: its edit made, or the agent gone, before the restart records.
      if (worktree && c.prompts === 1)
        await poll(
          () =>
            readLedger(s!.ledgerFile("r1")).some((l) => l.event === "file_edited") ||
            processesMentioning(s!.ledgerFile("r1")).length === 0,
          { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the agent's edit or its exit" },
        );

      // A restarted Runner (no failpoint) recovers its store, says hello, and the Server reconciles.
      await s.startRunner("r1");
      let view: Structured = {};
      let token = started.observation_token as string | undefined;
      await poll(
        async () => {
          view = await tool(alice, "observe_coding_agent", {
            run_id: runId,
            ...(token ? { after_observation_token: token } : {}),
            wait_secs: 5,
          });
          token = view.observation_token as string;
          return isTerminalState(view.state as never) && view.runner_offline !== true;
        },
        { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the observer to see a settled run" },
      );
      expect(view).toMatchObject({ run_id: runId, ...c.outcome });

      // Retrying the same start replays the settled run; it is never admitted or dispatched again.
      const replay = await tool(alice, "start_coding_agent", args);
      expect(replay).toMatchObject({ run_id: runId, replayed: true, ...c.outcome });
      // A graceful stop ends every turn the Runner holds: any dispatch it made would be in the ledger by now.
      await s.killRunner("r1", "SIGTERM");
      expect(s.prompts("r1")).toHaveLength(c.prompts);
      if (worktree) await expectChangeKept(s, alice, runId, canary, c.made);
    },
  );
});
