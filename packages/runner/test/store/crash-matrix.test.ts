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
 *
 * The same failpoints again with the project in `worktree` mode (issue 41 §3) and an agent that writes a canary
 * into a file of its worktree: after the restart (its recovery runs before the hello) the run's branch holds the
 * canary exactly when the agent wrote it, the head the inventory reports is that branch's tip, and no worktree is
 * left (the Runner's workspaces dir empty but for its spares dir, `git worktree list` only the project's own tree
 * and at most the restarted Runner's one spare).
 */
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, realpathSync } from "node:fs";
import { join } from "node:path";
import type { RunSummary } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import {
  alive,
  killProcesses,
  ledgerPrompts,
  poll,
  processesMentioning,
  readLedger,
} from "../../../../scripts/test-support/index.js";
import type { FailpointName } from "../../src/failpoints.js";
import {
  branchTip,
  git,
  killAllRunners,
  ledgerGrandchildren,
  makeSandbox,
  onBranch,
  runStartFrame,
  type Sandbox,
  startAnswerTo,
  startRunner,
  startTestServer,
  storeBytes,
  type TestServer,
} from "../support/crash-matrix-harness.js";
import { newRunId } from "../support/harness.js";

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
  /**
   * A `worktree` project: whether the run's worktree was made before the kill (its branch then exists and the
   * inventory reports its head), and whether the agent wrote its canary — "either" where the killed Runner's
   * agent may or may not handle the prompt before it sees stdin close.
   */
  worktree?: { made: boolean; edit: boolean | "either" };
}

const hello = (canary: string) => `scenario: hello text="${canary} says hello in chunks"`;
/** The agent ignores stdin EOF and never answers: it outlives the killed Runner. */
const hang = () => "scenario: hang";
/** The agent leaves a SIGTERM-ignoring grandchild in its process group and ends the turn. */
const grandchild = () => "scenario: grandchild";
/** The file a worktree case's agent writes its canary into. */
const EDIT_PATH = "notes/canary.txt";
/** The agent writes the canary into EDIT_PATH of its worktree, uncommitted, and ends the turn. */
const edit = (canary: string) => `scenario: edit_file path=${EDIT_PATH} text=${canary}`;
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

const WORKTREE_CASES: Case[] = [
  {
    failpoint: "after_admission",
    label: "edit",
    scenario: edit,
    recovered: notStarted,
    prompts: 0,
    worktree: { made: false, edit: false },
  },
  {
    failpoint: "before_barrier",
    label: "edit",
    scenario: edit,
    recovered: notStarted,
    prompts: 0,
    worktree: { made: true, edit: false },
  },
  {
    failpoint: "after_barrier_before_prompt",
    label: "edit",
    scenario: edit,
    recovered: lost,
    prompts: 0,
    worktree: { made: true, edit: false },
  },
  {
    failpoint: "after_prompt_write",
    label: "edit",
    scenario: edit,
    recovered: lost,
    prompts: 1,
    worktree: { made: true, edit: "either" },
  },
  {
    failpoint: "after_terminal_before_projection",
    label: "edit",
    scenario: edit,
    recovered: completed,
    prompts: 1,
    worktree: { made: true, edit: true },
  },
];

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

/** One case: SIGKILL at the failpoint, restart, and the checks of the recovered run. */
async function crashCase(c: Case): Promise<void> {
  const server = await startTestServer();
  servers.push(server);
  const sandbox = makeSandbox({ serverUrl: server.url, workspace: c.worktree ? "worktree" : "shared" });
  sandboxes.push(sandbox);
  const canary = `CANARY${randomBytes(8).toString("hex")}`;
  const prompt = `${c.scenario(canary)}\nThe secret word is ${canary}; do not store it.`;
  const runId = newRunId();
  const fingerprint = randomBytes(32).toString("hex");

  // 1. The first Runner admits the run and dies by SIGKILL at the failpoint.
  const first = startRunner(sandbox, { failpoint: c.failpoint });
  const conn1 = await server.nextConnection();
  conn1.send(runStartFrame(conn1, "fake", runId, prompt, fingerprint));
  const died = await first.exited;
  expect(died.signal).toBe("SIGKILL");
  if (c.prompts === 1)
    await poll(() => ledgerPrompts(sandbox.ledger).length >= 1, {
      timeoutMs: LEDGER_WAIT_MS,
      what: "the agent's ledger",
    });
  expect(ledgerPrompts(sandbox.ledger).length).toBe(c.prompts);
  // A worktree run's agent that has the prompt: its edit made, or the agent gone, before the restart records.
  if (c.worktree && c.prompts === 1)
    await poll(
      () =>
        readLedger(sandbox.ledger).some((l) => l.event === "file_edited") ||
        processesMentioning(sandbox.ledger).length === 0,
      { timeoutMs: LEDGER_WAIT_MS, what: "the agent's edit or its exit" },
    );

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
  if (c.worktree) expectWorkspaceRecovered(c.worktree, sandbox, runId, canary, recovered?.workspace?.head_commit);

  // 3. The same run_id + fingerprint returns the recovered run; a different fingerprint conflicts.
  const again = runStartFrame(conn2, "fake", runId, prompt, fingerprint);
  conn2.send(again);
  const replay = await conn2.next(startAnswerTo(again.request_id));
  expect(replay.type).toBe("run.start.result");
  if (replay.type !== "run.start.result") throw new Error("unreachable");
  expect(replay.created).toBe(false);
  expect(replay.run).toMatchObject({ ...c.recovered, run_id: runId });

  const other = runStartFrame(conn2, "fake", runId, prompt);
  conn2.send(other);
  const conflict = await conn2.next(startAnswerTo(other.request_id));
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
}

/**
 * After the restart's recovery: no recorded change lost (the run's branch holds the canary exactly when the
 * agent's ledger says it wrote it; the inventory's head is the branch's tip) and no worktree left.
 */
function expectWorkspaceRecovered(
  expected: NonNullable<Case["worktree"]>,
  sandbox: Sandbox,
  runId: string,
  canary: string,
  head: string | undefined,
): void {
  const wrote = readLedger(sandbox.ledger).some((l) => l.event === "file_edited" && l.path === EDIT_PATH);
  if (expected.edit !== "either") expect(wrote, "the agent wrote its canary").toBe(expected.edit);
  expect(onBranch(sandbox.project, runId, EDIT_PATH), "the canary on the run's branch").toBe(
    wrote ? canary : undefined,
  );
  const tip = branchTip(sandbox.project, runId);
  expect(tip, "the run's branch, as the recovered run's head").toBe(head);
  expect(tip !== undefined, "the run's worktree was made").toBe(expected.made);
  // Besides the project's own tree, only the restarted Runner's spare may be there (workspace/spares.ts): the
  // killed Runner's went at start-up.
  const workspaces = join(sandbox.stateDir, "workspaces");
  const left = existsSync(workspaces) ? readdirSync(workspaces) : [];
  expect(
    left.filter((name) => name !== ".spares"),
    "worktrees left",
  ).toEqual([]);
  const trees = git(sandbox.project, "worktree", "list", "--porcelain")
    .split("\n")
    .filter((line) => line.startsWith("worktree "));
  expect(trees[0]).toBe(`worktree ${realpathSync(sandbox.project)}`);
  const spares = trees.slice(1);
  expect(spares.length, "more spares than one Runner keeps").toBeLessThanOrEqual(1);
  for (const spare of spares) expect(spare).toContain(`${join(realpathSync(workspaces), ".spares")}/spare-`);
}

describe("crash matrix: Runner SIGKILL at each dispatch boundary", { timeout: 90_000 }, () => {
  it.each(CASES)(
    "$failpoint ($label): recovers as $recovered.state/$recovered.execution_state, never re-dispatches",
    crashCase,
  );
});

describe("crash matrix, workspace mode: Runner SIGKILL at each dispatch boundary of a worktree run", {
  timeout: 90_000,
}, () => {
  it.each(WORKTREE_CASES)(
    "$failpoint ($label): recovers as $recovered.state/$recovered.execution_state, loses no change, leaves no worktree",
    crashCase,
  );
});
