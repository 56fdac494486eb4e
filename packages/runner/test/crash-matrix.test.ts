/**
 * The crash matrix (issue 4 acceptance): for each failpoint, the real Runner
 * daemon with the real fake agent (and its --ledger) is killed by SIGKILL at
 * that boundary, restarted on the same state dir, and driven by an in-test
 * Server speaking the real protocol frames.
 *
 * The tiny Server is kept here because only it reaches what this file checks
 * at the frame level: the restarted Runner's `hello` inventory (store_id,
 * agent_instance_id, the recovered row), raw `run.start` replay/conflict
 * answers, and orphan reaping before that hello. The same five failpoints
 * against the real Server process and an MCP observer are in
 * packages/server/test/runs/crash-matrix-server.test.ts.
 */
import { randomBytes } from "node:crypto";
import type { ErrorFrame, RunnerFrame, RunStartFrame, RunStartResultFrame, RunSummary } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { alive, killProcesses, ledgerPrompts, poll, processesMentioning } from "../../../scripts/test-support/index.js";
import type { FailpointName } from "../src/failpoints.js";
import {
  killAllRunners,
  ledgerGrandchildren,
  makeSandbox,
  type RunnerConnection,
  type Sandbox,
  startRunner,
  startTestServer,
  storeBytes,
  type TestServer,
} from "./crash-matrix-harness.js";

/** Bound on the agent's ledger showing the prompt the killed Runner dispatched. */
const LEDGER_WAIT_MS = 10_000;

interface Case {
  failpoint: FailpointName;
  /** What the agent is asked to do (its first line picks the fake agent's scenario). */
  label: string;
  scenario: (canary: string) => string;
  recovered: Pick<RunSummary, "state" | "execution_state" | "failure_kind" | "recovery_kind">;
  /** Prompts the agent must have received, before and after the restart. */
  prompts: 0 | 1;
  /** The killed run leaves processes that only the restarted Runner's reaper can end. */
  orphans?: true;
}

const hello = (canary: string) => `scenario: hello text="${canary} says hello in chunks"`;
/** The agent ignores stdin EOF and never answers: it outlives the killed Runner. */
const hang = () => "scenario: hang";
/** The agent leaves a SIGTERM-ignoring grandchild in its process group and ends the turn. */
const grandchild = () => "scenario: grandchild";
const notStarted = {
  state: "failed",
  execution_state: "not_started",
  failure_kind: "runner_restarted",
  recovery_kind: "none",
} as const;
const completed = {
  state: "completed",
  execution_state: "completed",
  failure_kind: null,
  recovery_kind: "none",
} as const;
const lost = {
  state: "lost",
  execution_state: "outcome_unknown",
  failure_kind: "transport_lost",
  recovery_kind: "reconcile",
} as const;

const CASES: Case[] = [
  { failpoint: "after_admission", label: "hello", scenario: hello, recovered: notStarted, prompts: 0 },
  { failpoint: "before_barrier", label: "hello", scenario: hello, recovered: notStarted, prompts: 0 },
  { failpoint: "after_barrier_before_prompt", label: "hello", scenario: hello, recovered: lost, prompts: 0 },
  { failpoint: "after_prompt_write", label: "hello", scenario: hello, recovered: lost, prompts: 1 },
  { failpoint: "after_prompt_write", label: "hang", scenario: hang, recovered: lost, prompts: 1, orphans: true },
  { failpoint: "after_terminal_before_projection", label: "hello", scenario: hello, recovered: completed, prompts: 1 },
  {
    failpoint: "after_terminal_before_projection",
    label: "grandchild",
    scenario: grandchild,
    recovered: completed,
    prompts: 1,
    orphans: true,
  },
];

function base32Id(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz234567";
  return Array.from(randomBytes(26), (b) => alphabet[b % 32]).join("");
}

let requestCounter = 0;
function runStart(conn: RunnerConnection, runId: string, fingerprint: string, prompt: string): RunStartFrame {
  const provider = conn.hello.providers.find((p) => p.provider_id === "fake");
  if (!provider) throw new Error("runner did not advertise the fake provider");
  requestCounter++;
  return {
    type: "run.start",
    request_id: `req-${requestCounter}`,
    run_id: runId,
    intent_fingerprint: fingerprint,
    project_id: "demo",
    provider_id: "fake",
    agent_instance_id: conn.hello.agent_instance_id,
    provider_instance_id: provider.provider_instance_id,
    prompt,
    config: {},
    timeout_secs: null,
  };
}

function answerTo(requestId: string) {
  return (f: RunnerFrame): f is RunStartResultFrame | ErrorFrame =>
    (f.type === "run.start.result" || f.type === "error") && f.request_id === requestId;
}

const servers: TestServer[] = [];
const sandboxes: Sandbox[] = [];
afterEach(async () => {
  await killAllRunners();
  for (const s of sandboxes.splice(0)) {
    killProcesses([...processesMentioning(s.ledger), ...ledgerGrandchildren(s.ledger)]);
    s.cleanup();
  }
  for (const s of servers.splice(0)) await s.close();
});

describe("crash matrix: Runner SIGKILL at each dispatch boundary", { timeout: 90_000 }, () => {
  it.each(CASES)(
    "$failpoint ($label): recovers as $recovered.state/$recovered.execution_state, never re-dispatches",
    async (c) => {
      const server = await startTestServer();
      servers.push(server);
      const sandbox = makeSandbox({ serverUrl: server.url });
      sandboxes.push(sandbox);
      const canary = `CANARY${randomBytes(8).toString("hex")}`;
      const prompt = `${c.scenario(canary)}\nThe secret word is ${canary}; do not store it.`;
      const runId = `wc_agent_run_${base32Id()}`;
      const fingerprint = randomBytes(32).toString("hex");

      // 1. The first Runner admits the run and dies by SIGKILL at the failpoint.
      const first = startRunner(sandbox, { failpoint: c.failpoint });
      const conn1 = await server.nextConnection();
      conn1.send(runStart(conn1, runId, fingerprint, prompt));
      const died = await first.exited;
      expect(died.signal).toBe("SIGKILL");
      if (c.prompts === 1)
        await poll(() => ledgerPrompts(sandbox.ledger).length >= 1, {
          timeoutMs: LEDGER_WAIT_MS,
          what: "the agent's ledger",
        });
      expect(ledgerPrompts(sandbox.ledger).length).toBe(c.prompts);

      // Processes of the killed run: the agent (its argv names the sandbox's ledger) and any grandchild it logged.
      const survivors = [...processesMentioning(sandbox.ledger), ...ledgerGrandchildren(sandbox.ledger)];
      if (c.orphans) expect(survivors.length).toBeGreaterThan(0);

      // 2. A restarted Runner on the same state dir: recovery and reaping happen before its hello.
      const second = startRunner(sandbox);
      const conn2 = await server.nextConnection();
      expect(processesMentioning(sandbox.ledger)).toEqual([]);
      expect(survivors.filter(alive)).toEqual([]);
      if (c.orphans) expect(second.output()).toContain("reaped orphaned agent process group");
      expect(conn2.hello.store_id).toBe(conn1.hello.store_id);
      expect(conn2.hello.agent_instance_id).not.toBe(conn1.hello.agent_instance_id);
      const recovered = conn2.hello.inventory.find((r) => r.run_id === runId);
      expect(recovered).toMatchObject({ ...c.recovered, phase: "terminal", intent_fingerprint: fingerprint });

      // 3. The same run_id + fingerprint returns the recovered run; a different fingerprint conflicts.
      const again = runStart(conn2, runId, fingerprint, prompt);
      conn2.send(again);
      const replay = await conn2.next(answerTo(again.request_id));
      expect(replay.type).toBe("run.start.result");
      if (replay.type !== "run.start.result") throw new Error("unreachable");
      expect(replay.created).toBe(false);
      expect(replay.run).toMatchObject({ ...c.recovered, run_id: runId });

      const other = runStart(conn2, runId, randomBytes(32).toString("hex"), prompt);
      conn2.send(other);
      const conflict = await conn2.next(answerTo(other.request_id));
      expect(conflict).toMatchObject({ type: "error", code: "idempotency_conflict" });

      // 4. Nothing was dispatched again: a graceful stop ends every turn the Runner holds, so any dispatch
      //    it made is in the ledger by the time it exits. And the durable store never saw the canary.
      await second.stop();
      expect((await second.exited).code).toBe(0);
      expect(ledgerPrompts(sandbox.ledger).length).toBe(c.prompts);
      expect(processesMentioning(sandbox.ledger)).toEqual([]);
      const bytes = storeBytes(sandbox.stateDir);
      expect(bytes.length).toBeGreaterThan(0);
      expect(bytes.includes(canary)).toBe(false);
      expect(bytes.includes(fingerprint)).toBe(true); // the scan does see row contents
      // Nor did either Runner's log.
      expect(first.output()).not.toContain(canary);
      expect(second.output()).not.toContain(canary);
    },
  );
});
