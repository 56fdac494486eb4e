/**
 * The crash matrix end to end: for each of the five failpoints, the real
 * `webcodex-server` process, a real `webcodex-runner` daemon that SIGKILLs
 * itself at that dispatch boundary, and the fake agent (its ledger counts the
 * prompts it received). After a Runner restart and reconciliation, a real MCP
 * client (Streamable HTTP, the principal's bearer token) must observe the
 * settled outcome, a retried start must replay the same run, and the prompt
 * must have reached the agent at most once.
 *
 * packages/runner/test/crash-matrix.test.ts keeps a tiny in-test Server for
 * what only it can reach: the Runner's `hello` inventory and raw `run.start`
 * replays/conflicts at the frame level, and orphan reaping by the restarted
 * Runner before its hello.
 */
import type { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { isTerminalState } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import type { FailpointName } from "../../../runner/src/failpoints.js";
import { ProcStack } from "../support/proc-stack.js";

interface Case {
  failpoint: FailpointName;
  outcome: { state: string; execution_state: string };
  /** Prompts the agent received in total (before and after the restart). */
  prompts: 0 | 1;
}

const notStarted = { state: "failed", execution_state: "not_started" };
const lost = { state: "lost", execution_state: "outcome_unknown" };
const completed = { state: "completed", execution_state: "completed" };

const CASES: Case[] = [
  { failpoint: "after_admission", outcome: notStarted, prompts: 0 },
  { failpoint: "before_barrier", outcome: notStarted, prompts: 0 },
  { failpoint: "after_barrier_before_prompt", outcome: lost, prompts: 0 },
  { failpoint: "after_prompt_write", outcome: lost, prompts: 1 },
  { failpoint: "after_terminal_before_projection", outcome: completed, prompts: 1 },
];

type Structured = Record<string, unknown>;

async function tool(client: Client, name: string, args: Record<string, unknown>): Promise<Structured> {
  const result = await client.callTool({ name, arguments: args }, undefined, { timeout: 60_000 });
  if (result.isError) throw new Error(`${name} failed: ${JSON.stringify(result.content)}`);
  return result.structuredContent as Structured;
}

describe("crash matrix against the real Server process", { timeout: 120_000 }, () => {
  let s: ProcStack | undefined;
  afterEach(async () => {
    await s?.stop();
    s = undefined;
  });

  it.each(CASES)(
    "$failpoint: the MCP observer sees $outcome.state/$outcome.execution_state after reconciliation; $prompts prompt(s) dispatched",
    async (c) => {
      s = await new ProcStack({ runners: [{ id: "r1", projects: ["demo"] }], server: "child" }).init();
      await s.startRunner("r1", [], { WEBCODEX_FAILPOINT: c.failpoint });
      const alice = await s.mcp("alice");
      const args = {
        project_id: "demo",
        provider_id: "fake",
        idempotency_key: `crash-${c.failpoint}`,
        prompt: "scenario: hello",
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
    },
  );
});
