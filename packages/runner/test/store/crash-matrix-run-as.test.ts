/**
 * The crash matrix (crash-matrix.test.ts), run_as variant of workspace mode (issue 41 §3): a `worktree` project
 * whose agent runs as a pool user of real OS users, so each run works in a repository of its own in the Runner's
 * `workspaces_dir` (workspace/owned.ts). The real Runner daemon is SIGKILLed at the points of that repository's
 * life — before and after its rename into place, before and after the pack of the change's objects into the
 * project, after the project's branch moved, after the head was stored — and at those points again while the
 * restarted Runner's start-up recovery records the change, then restarted on the same state dir; and once with the
 * lock of the run's branch left in the project by a git killed with the Runner (stale: removed, then recorded).
 *
 * After the last restart (its recovery runs before the hello): no change lost (the run's branch holds exactly what
 * the agent wrote, the inventory's head is the branch's tip and is a commit of the project), nothing of the
 * workspace left (the `workspaces_dir` is empty: no run's repository, no `.making-` or `.record-` dir), no object
 * missing in the project (`git fsck --connectivity-only`), and no prompt dispatched twice.
 *
 * Creating users and switching to them needs root (CI runs the suite as root): as any other user this file's tests
 * are skipped, and the describe title says why.
 */
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readdirSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import type { RunSummary } from "@webcodex/protocol";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  killProcesses,
  ledgerPrompts,
  poll,
  processesMentioning,
  readLedger,
} from "../../../../scripts/test-support/index.js";
import type { FailpointName } from "../../src/failpoints.js";
import { sweepUser } from "../../src/process/user-pool.js";
import {
  branchTip,
  git,
  killAllRunners,
  onBranch,
  runStartFrame,
  type Sandbox,
  startAnswerTo,
  startRunner,
  startTestServer,
  storeBytes,
  type TestServer,
  TOKEN_ENV,
} from "../support/crash-matrix-harness.js";
import { newRunId } from "../support/harness.js";
import { agentCopy, createTestUser, IS_ROOT, sharedTestDir, type TestUser } from "../support/test-user.js";

/** Bound on the agent's ledger showing the prompt the killed Runner dispatched (a loaded machine). */
const LEDGER_WAIT_MS = 30_000;
/** Bound on a Runner daemon's link coming up after its start (sized for a loaded machine). */
const CONNECT_WAIT_MS = 60_000;
/** Longest one case may take: up to three Runner starts and a pool user's agent on a loaded machine. */
const CASE_TIMEOUT_MS = 180_000;

/** The file the agent writes its canary into, uncommitted, before it ends its turn. */
const EDIT_PATH = "notes/canary.txt";

interface Case {
  /** The case's name: where the Runners die. */
  label: string;
  /** Where the first Runner dies. */
  failpoint: FailpointName;
  /** Where the restarted Runner dies too, during its start-up recovery (a third one then recovers). */
  atRecovery?: FailpointName;
  recovered: Pick<RunSummary, "state" | "execution_state" | "failure_kind">;
  /** Prompts the agent received (before the kill; never again after). */
  prompts: 0 | 1;
  /** Whether the agent wrote its canary; "either" where it may or may not have before the kill. */
  edit: boolean | "either";
  /**
   * The killed Runner's git left the lock of the run's branch in the project (as when its whole cgroup is
   * killed mid-`update-ref`): stale, so the restart removes it and records.
   */
  staleRefLock?: true;
}

const notStarted = { state: "failed", execution_state: "not_started", failure_kind: "runner_restarted" } as const;
const lost = { state: "lost", execution_state: "outcome_unknown", failure_kind: "transport_lost" } as const;

const CASES: Case[] = [
  // The run's repository made and handed to its pool user, not yet in place (a `.making-` dir), then in place.
  { label: "owned_before_rename", failpoint: "owned_before_rename", recovered: notStarted, prompts: 0, edit: false },
  { label: "owned_after_rename", failpoint: "owned_after_rename", recovered: notStarted, prompts: 0, edit: false },
  // The agent at work in it (left running, a pool user's orphan, until the restart reaps it).
  { label: "after_prompt_write", failpoint: "after_prompt_write", recovered: lost, prompts: 1, edit: "either" },
  // The run ended; its change committed in the scratch repository, then its objects in the project, then the
  // project's branch moved, then the head stored — each before the run's terminal is recorded.
  { label: "owned_before_pack", failpoint: "owned_before_pack", recovered: lost, prompts: 1, edit: true },
  { label: "owned_after_pack", failpoint: "owned_after_pack", recovered: lost, prompts: 1, edit: true },
  { label: "change_after_branch", failpoint: "change_after_branch", recovered: lost, prompts: 1, edit: true },
  { label: "change_after_store", failpoint: "change_after_store", recovered: lost, prompts: 1, edit: true },
  // Killed again while the restarted Runner's recovery records that change.
  {
    label: "owned_before_pack, then owned_before_pack in its recovery",
    failpoint: "owned_before_pack",
    atRecovery: "owned_before_pack",
    recovered: lost,
    prompts: 1,
    edit: true,
  },
  {
    label: "owned_before_pack, then owned_after_pack in its recovery",
    failpoint: "owned_before_pack",
    atRecovery: "owned_after_pack",
    recovered: lost,
    prompts: 1,
    edit: true,
  },
  {
    label: "owned_after_pack, then change_after_branch in its recovery",
    failpoint: "owned_after_pack",
    atRecovery: "change_after_branch",
    recovered: lost,
    prompts: 1,
    edit: true,
  },
  {
    label: "owned_after_pack, a stale lock of its branch left",
    failpoint: "owned_after_pack",
    staleRefLock: true,
    recovered: lost,
    prompts: 1,
    edit: true,
  },
];

/** Older than the git command bound plus its margin (workspace/locks.ts STALE_GIT_LOCK_MS = 90 s). */
const STALE_AGE_MS = 10 * 60_000;

/** The lock file of the run's branch in the project, as a git killed mid-`update-ref` leaves it, `ageMs` old. */
function plantRefLock(project: string, runId: string, ageMs: number): string {
  const lock = join(project, ".git", "refs", "heads", "webcodex", "run", `${runId}.lock`);
  mkdirSync(dirname(lock), { recursive: true });
  writeFileSync(lock, "0".repeat(40));
  const when = (Date.now() - ageMs) / 1000;
  utimesSync(lock, when, when);
  return lock;
}

interface RunAsSandbox extends Sandbox {
  workspaces: string;
}

let users: TestUser[] = [];
let agent: ReturnType<typeof agentCopy> | undefined;

/**
 * A sandbox under the shared test root (a run_as agent gets /tmp private): the project the operator's (root's),
 * readable by the pool users and writable by none of them, in `worktree` mode; the Runner's `workspaces_dir`
 * beside it; the fake agent run as a pool of the two test users.
 */
function runAsSandbox(serverUrl: string): RunAsSandbox {
  const dir = sharedTestDir("wc-crash-ras-");
  const project = join(dir, "project");
  mkdirSync(project);
  writeFileSync(join(project, "README.md"), "demo\n");
  git(project, "init", "-q", "-b", "main");
  git(project, "add", "-A");
  git(project, "commit", "-q", "-m", "initial");
  chmodSync(dir, 0o755);
  const ledger = join(dir, "ledger.jsonl");
  writeFileSync(ledger, "");
  chmodSync(ledger, 0o666);
  const stateDir = join(dir, "state");
  const workspaces = join(dir, "workspaces");
  const configPath = join(dir, "runner.toml");
  const lines = [
    "[runner]",
    `state_dir = ${JSON.stringify(stateDir)}`,
    `workspaces_dir = ${JSON.stringify(workspaces)}`,
    'log_level = "info"',
    "[server]",
    `url = ${JSON.stringify(serverUrl)}`,
    `token_env = ${JSON.stringify(TOKEN_ENV)}`,
    "[[projects]]",
    'id = "demo"',
    `root = ${JSON.stringify(project)}`,
    "allow_patch = true",
    'workspace = "worktree"',
    "[acp]",
    "max_concurrent_runs = 2",
    "setup_timeout_secs = 30",
    "cancel_grace_secs = 2",
    "[[acp.agents]]",
    'id = "pooled"',
    'name = "Pooled"',
    `executable = ${JSON.stringify(agent?.bin)}`,
    `args = ${JSON.stringify(["--ledger", ledger])}`,
    `run_as = ${JSON.stringify(users.map((u) => u.name))}`,
    "[acp.agents.env_from_env]",
    'PATH = "PATH"',
  ];
  writeFileSync(configPath, `${lines.join("\n")}\n`, { mode: 0o600 });
  return {
    dir,
    project,
    stateDir,
    ledger,
    configPath,
    workspaces,
    // The pool users' entries (a failed case's leftovers) go with it: root removes them.
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

const servers: TestServer[] = [];
const sandboxes: RunAsSandbox[] = [];
afterEach(async () => {
  await killAllRunners();
  for (const s of sandboxes.splice(0)) {
    killProcesses(processesMentioning(s.ledger));
    s.cleanup();
  }
  for (const s of servers.splice(0)) await s.close();
});

/**
 * After the last restart's recovery: the change recorded (the branch holds the canary exactly when the agent's
 * ledger says it wrote it, the head is the branch's tip), nothing of the workspace left, no object missing.
 */
function expectRecovered(c: Case, sandbox: RunAsSandbox, runId: string, canary: string, head: string | undefined) {
  const wrote = readLedger(sandbox.ledger).some((l) => l.event === "file_edited" && l.path === EDIT_PATH);
  if (c.edit !== "either") expect(wrote, "the agent wrote its canary").toBe(c.edit);
  expect(onBranch(sandbox.project, runId, EDIT_PATH), "the canary on the run's branch").toBe(
    wrote ? canary : undefined,
  );
  const tip = branchTip(sandbox.project, runId);
  expect(tip, "the run's branch").toMatch(/^[0-9a-f]{40}$/);
  expect(head, "the recovered run's head, the branch's tip").toBe(tip);
  // Its parent is the base (the project's main) when there is a change, else it is the base.
  const base = git(sandbox.project, "rev-parse", "main");
  expect(git(sandbox.project, "rev-parse", wrote ? `${tip}~1` : `${tip}`)).toBe(base);
  expect(readdirSync(sandbox.workspaces), "owned repositories or scratch dirs left").toEqual([]);
  git(sandbox.project, "fsck", "--connectivity-only", "--no-progress");
  expect(
    git(sandbox.project, "worktree", "list", "--porcelain")
      .split("\n")
      .filter((l) => l.startsWith("worktree ")),
  ).toHaveLength(1);
}

/** One case: SIGKILL at the failpoint (and at recovery), restart, and the checks of the recovered run. */
async function crashCase(c: Case): Promise<void> {
  const server = await startTestServer();
  servers.push(server);
  const sandbox = runAsSandbox(server.url);
  sandboxes.push(sandbox);
  const canary = `CANARY${randomBytes(8).toString("hex")}`;
  const prompt = `scenario: edit_file path=${EDIT_PATH} text=${canary}\nThe secret word is ${canary}.`;
  const runId = newRunId();
  const fingerprint = randomBytes(32).toString("hex");

  // 1. The first Runner admits the run and dies by SIGKILL at the failpoint.
  const first = startRunner(sandbox, { failpoint: c.failpoint });
  const conn1 = await server.nextConnection(CONNECT_WAIT_MS);
  conn1.send(runStartFrame(conn1, "pooled", runId, prompt, fingerprint));
  expect((await first.exited).signal).toBe("SIGKILL");
  if (c.prompts === 1)
    await poll(() => ledgerPrompts(sandbox.ledger).length >= 1, { timeoutMs: LEDGER_WAIT_MS, what: "the ledger" });
  expect(ledgerPrompts(sandbox.ledger).length).toBe(c.prompts);
  // An agent that has the prompt: its edit made, or the agent gone, before the restart records.
  if (c.prompts === 1)
    await poll(
      () =>
        readLedger(sandbox.ledger).some((l) => l.event === "file_edited") ||
        processesMentioning(sandbox.ledger).length === 0,
      { timeoutMs: LEDGER_WAIT_MS, what: "the agent's edit or its exit" },
    );

  const refLock = c.staleRefLock ? plantRefLock(sandbox.project, runId, STALE_AGE_MS) : null;

  // 2. Killed again in the restarted Runner's recovery, before its hello.
  const logs = [first];
  if (c.atRecovery) {
    const again = startRunner(sandbox, { failpoint: c.atRecovery });
    logs.push(again);
    expect((await again.exited).signal, "the Runner killed in its recovery").toBe("SIGKILL");
  }

  // 3. A restarted Runner on the same state dir: recovery and reaping happen before its hello.
  const last = startRunner(sandbox);
  logs.push(last);
  const conn2 = await server.nextConnection(CONNECT_WAIT_MS);
  expect(processesMentioning(sandbox.ledger)).toEqual([]);
  expect(conn2.hello.store_id).toBe(conn1.hello.store_id);
  const recovered = conn2.hello.inventory.find((r) => r.run_id === runId);
  expect(recovered).toMatchObject({ ...c.recovered, phase: "terminal", intent_fingerprint: fingerprint });
  expect(recovered?.workspace).toMatchObject({ mode: "worktree", branch: `webcodex/run/${runId}` });
  expectRecovered(c, sandbox, runId, canary, recovered?.workspace?.head_commit);
  if (refLock) {
    expect(existsSync(refLock), "the stale lock of the run's branch").toBe(false);
    expect(last.output()).toContain("stale git locks of a killed git removed");
  }

  // 4. The same run_id + fingerprint returns the recovered run, never a second one.
  const replayStart = runStartFrame(conn2, "pooled", runId, prompt, fingerprint);
  conn2.send(replayStart);
  const replay = await conn2.next(startAnswerTo(replayStart.request_id));
  expect(replay).toMatchObject({ type: "run.start.result", created: false, run: { ...c.recovered, run_id: runId } });

  // 5. Nothing dispatched again (a graceful stop ends every turn it holds, so any dispatch is in the ledger by
  //    then); the change (project content) reached no log and no state file.
  await last.stop();
  expect((await last.exited).code).toBe(0);
  expect(ledgerPrompts(sandbox.ledger).length).toBe(c.prompts);
  expect(storeBytes(sandbox.stateDir).includes(canary)).toBe(false);
  for (const runner of logs) expect(runner.output()).not.toContain(canary);
}

describe.skipIf(!IS_ROOT)(
  "crash matrix, run_as workspace mode: Runner SIGKILL around a pool user's own repository (needs root to create users)",
  { timeout: CASE_TIMEOUT_MS },
  () => {
    beforeAll(() => {
      users = [createTestUser("k1"), createTestUser("k2")];
      agent = agentCopy();
    });
    afterAll(async () => {
      for (const user of users) await sweepUser(user.uid);
      for (const user of users) user.remove();
      agent?.remove();
    });

    it.each(CASES)("$label: recovers as $recovered.state, loses no change, leaves nothing", crashCase);
  },
);
