/**
 * The seeded chaos in workspace mode (issue 41 §3), shared by its two variants: seeded-chaos-workspaces.test.ts
 * (the agent runs as the Runner's user: each run gets a linked worktree) and seeded-chaos-workspaces-run-as.test.ts
 * (the agent runs as a pool of real OS users: each run gets a repository of its own in `workspaces_dir`,
 * workspace/owned.ts). A ProcStack with a Server child and Runner "r1" whose project p1 is a `worktree` project.
 *
 * Each iteration starts a run whose agent writes a per-run canary into a file of its workspace (`edit_file`; a
 * drawn part of the runs then holds the turn open until cancelled), and at a random moment — 0 ms after the start
 * call included — SIGKILLs the Runner (its pid only: the agent and any git it runs are left orphaned), the Server,
 * both, or the agent; or cancels; or replays the same key, as seeded-chaos.test.ts does. Killed daemons are
 * restarted, the key is replayed, and the run must end within a deadline. After a final SIGKILL and restart of the
 * Runner (its start-up recovery records every unrecorded change and removes every leftover workspace): no prompt
 * dispatched twice, every run's end truthful to the agent's ledger, no change lost (every run whose agent logged
 * its edit holds its canary on `webcodex/run/<run_id>`; every run with a workspace has its head recorded, which is
 * that branch's tip), no object missing in the project (`git fsck --connectivity-only`), no workspace left (the
 * workspaces dir is empty — no run's directory, no `.making-` or `.record-` dir — and `git worktree list` shows
 * only the project), no agent left, and no canary in a log or under either daemon's state dir (a change is project
 * content). Prints the seed; WEBCODEX_HARDENING_SEED reproduces the plan.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, readFileSync, realpathSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { expect } from "vitest";
import { okValue, type ProcStack } from "../../../../packages/server/test/support/proc-stack.js";
import { DAEMON_POLL_MS, poll, readLedger } from "../../../test-support/index.js";
import {
  type ChaosAction as Action,
  ChaosStack,
  expectNoAgents,
  expectTruthfulEnds,
  filesUnder,
  type Seen,
  startInput,
  TERMINAL,
  TERMINAL_DEADLINE_MS,
  TerminalBook,
  tally,
} from "./chaos.js";

/**
 * The longest delay after a start call at which a step's action happens (0 is drawn too): longer than the plain
 * chaos's 400 ms, because a workspace run's edit comes after the workspace is made and the agent started, and the
 * kills must reach past it.
 */
const ACTION_DELAY_MAX_MS = 1_500;
/** Bound on one git command of the checks. */
const GIT_TIMEOUT_MS = 30_000;

interface Step {
  key: number;
  action: Action;
  delayMs: number;
  /** The key's agent holds its turn open after the edit, until cancelled (decided at the key's first use). */
  hold: boolean;
}

/** What a key's run is asked to do: write `canary` into `path` of its workspace. */
interface Edit {
  prompt: string;
  path: string;
  canary: string;
  hold: boolean;
}

export interface WorkspaceChaosOptions {
  /** Names the variant in the log lines. */
  label: string;
  iterations: number;
  seed: number;
  /** The Runner's directory of workspaces (`<state_dir>/workspaces`, or `[runner] workspaces_dir`). */
  workspacesDir: string;
}

/** `git` in `cwd`: its stdout, or null when it exits non-zero (e.g. a path not on a branch). */
function git(cwd: string, ...args: string[]): string | null {
  try {
    return execFileSync("git", args, {
      cwd,
      encoding: "utf8",
      timeout: GIT_TIMEOUT_MS,
      stdio: ["ignore", "pipe", "ignore"],
    });
  } catch {
    return null;
  }
}

/** The chaos on `stack` (started, its Runner r1 online) and every check after it; see the header. */
export async function workspaceChaos(stack: ProcStack, options: WorkspaceChaosOptions): Promise<void> {
  const { label, iterations, seed } = options;
  const chaos = new ChaosStack(stack);
  const root = join(stack.dir, "projects", "p1");
  const runnerStateDir = join(stack.dir, "runner-state-r1");
  /** Keys are drawn from a pool this much smaller than the iteration count: about a third repeat. */
  const keyPool = Math.max(3, Math.ceil((iterations * 2) / 3));

  /** The paths the agent's ledger says it edited. */
  const editedPaths = () =>
    new Set(
      readLedger(stack.ledgerFile("r1"))
        .filter((line) => line.event === "file_edited")
        .map((line) => String(line.path)),
    );

  /** Until the agent logged its edit of `path`, or the run is terminal without it. */
  const editedOrEnded = (path: string, runId: string) =>
    poll(
      async () => {
        if (editedPaths().has(path)) return true;
        const o = await stack.observe("alice", { run_id: runId }).catch(() => null);
        return o?.ok === true && TERMINAL.has(o.value.state);
      },
      { timeoutMs: TERMINAL_DEADLINE_MS, intervalMs: DAEMON_POLL_MS, what: `the edit of ${path} or its run's end` },
    );

  console.log(
    `seeded chaos (${label}) seed=${seed} iterations=${iterations} (WEBCODEX_HARDENING_SEED=${seed} reproduces the plan)`,
  );
  const t0 = Date.now();
  const plan: Step[] = fc.sample(
    fc.record({
      key: fc.nat({ max: keyPool - 1 }),
      action: fc.oneof(
        { weight: 3, arbitrary: fc.constant<Action>("none") },
        { weight: 2, arbitrary: fc.constant<Action>("cancel") },
        { weight: 2, arbitrary: fc.constant<Action>("replay") },
        // A Runner crash is what a workspace must survive: it gets a weight of its own besides the other kills.
        { weight: 2, arbitrary: fc.constant<Action>("kill_runner") },
        { weight: 2, arbitrary: fc.constantFrom<Action>("kill_server", "kill_both", "kill_agent") },
      ),
      delayMs: fc.oneof(fc.constant(0), fc.nat({ max: ACTION_DELAY_MAX_MS })),
      hold: fc.nat({ max: 2 }).map((n) => n === 0),
    }),
    { numRuns: iterations, seed },
  );
  const editOf = new Map<string, Edit>();
  const runOf = new Map<string, string>();
  const book = new TerminalBook();
  const actions = new Map<string, number>();

  const observeTerminal = (runId: string): Promise<Seen> => chaos.observeTerminal(book, runId);

  for (const [i, step] of plan.entries()) {
    const key = `ws-key-${step.key}`;
    let edit = editOf.get(key);
    if (!edit) {
      const path = `chaos/${key}.txt`;
      const canary = `wc-edit-canary-${randomBytes(12).toString("hex")}`;
      const hold = step.hold ? " hold=true" : "";
      edit = {
        prompt: `scenario: edit_file path=${path} text=${canary}${hold}\nchaos ${key}`,
        path,
        canary,
        hold: step.hold,
      };
      editOf.set(key, edit);
    }
    tally(actions, `${step.action}${edit.hold ? "+hold" : ""}`);
    const input = startInput(key, edit.prompt);
    const start = () => chaos.start(input);
    const replay = await chaos.startStep(i, key, step.action, step.delayMs, start, runOf);
    // A holding agent ends its turn only when cancelled: once it made its edit (or its run ended without).
    if (edit.hold) await editedOrEnded(edit.path, replay.run_id);
    if (step.action === "cancel" || edit.hold) okValue(await stack.cancel("alice", { run_id: replay.run_id }));
    await observeTerminal(replay.run_id);
    if (step.action === "replay") {
      const again = okValue(await stack.start("alice", input));
      expect(again.run_id).toBe(replay.run_id);
      expect(again.replayed).toBe(true);
    }
  }

  // A last crash: the restarted Runner's recovery (before its hello) records what is unrecorded and removes
  // every workspace left, the kept ones of terminal runs included.
  await chaos.ensureUp();
  await stack.killRunner("r1", "SIGKILL");
  await stack.startRunner("r1");

  const ledger = stack.prompts("r1");
  const { ends, states } = await expectTruthfulEnds(runOf, (key) => editOf.get(key)!.prompt, ledger, observeTerminal);
  const edited = editedPaths();
  const lost: string[] = [];
  const unrecorded: string[] = [];
  const strayHeads: string[] = [];
  let heads = 0;
  for (const [key, { runId, seen, dispatched }] of ends) {
    const edit = editOf.get(key)!;
    const wrote = edited.has(edit.path);
    if (seen.state === "completed") expect(wrote, `${key} completed without its edit in the ledger`).toBe(true);
    if (wrote) expect(dispatched, `${key} edited without a dispatch`).toBe(true);
    // No change lost: the agent's edit is on the run's branch, as it wrote it.
    const branch = `refs/heads/webcodex/run/${runId}`;
    const onBranch = git(root, "show", `${branch}:${edit.path}`);
    if (wrote && onBranch?.trim() !== edit.canary) lost.push(`${key} (${runId}, ${seen.state})`);
    // Every run that got a workspace has its change recorded; the head observe reports is the branch's tip.
    const o = okValue(await stack.observe("alice", { run_id: runId }));
    const head = o.workspace?.head_commit;
    if (o.workspace && head === undefined) unrecorded.push(`${key} (${runId}, ${seen.state})`);
    if (head !== undefined) {
      heads += 1;
      const tip = git(root, "rev-parse", "--verify", `${branch}^{commit}`)?.trim();
      if (tip !== head) strayHeads.push(`${key} (${runId}): observe ${head}, branch ${tip ?? "missing"}`);
    }
  }
  expect(lost, "runs whose recorded change lost the agent's edit").toEqual([]);
  expect(unrecorded, "terminal runs with a workspace whose change is not recorded").toEqual([]);
  expect(strayHeads, "heads observe reports that are not the run's branch tip").toEqual([]);
  // Every object of every recorded change is in the project.
  expect(git(root, "fsck", "--connectivity-only", "--no-progress"), "git fsck of the project").not.toBeNull();

  // No workspace left: the Runner's directory of them is empty and git knows only the project's own tree — but
  // for the live Runner's one spare worktree (runner workspace/spares.ts; none when every agent runs as a pool user).
  const { workspacesDir } = options;
  const left = existsSync(workspacesDir) ? readdirSync(workspacesDir) : [];
  expect(
    left.filter((name) => name !== ".spares"),
    "workspaces left",
  ).toEqual([]);
  const worktrees = (git(root, "worktree", "list", "--porcelain") ?? "")
    .split("\n")
    .filter((line) => line.startsWith("worktree "))
    .map((line) => line.slice("worktree ".length));
  expect(worktrees[0]).toBe(realpathSync(root));
  const spares = worktrees.slice(1);
  expect(spares.length, "more spares than one Runner keeps").toBeLessThanOrEqual(1);
  for (const spare of spares) expect(spare).toContain(`${join(realpathSync(workspacesDir), ".spares")}/spare-`);

  // No agent outlives its run; a change (project content) and a prompt reach no log and no state file.
  await expectNoAgents(() => chaos.agentPids());
  const scanned = [...filesUnder(runnerStateDir), ...filesUnder(stack.serverStateDir)];
  const canaries = [...editOf.values()].map((e) => e.canary);
  for (const f of scanned) {
    const bytes = readFileSync(f);
    for (const c of canaries) expect(bytes.includes(c), `an edit's canary found in ${f}`).toBe(false);
  }
  for (const [name, log] of stack.logs)
    for (const c of canaries) expect(log.includes(c), `an edit's canary in the ${name} log`).toBe(false);

  console.log(
    `seeded chaos (${label}): ${iterations} iterations in ${((Date.now() - t0) / 1000).toFixed(1)} s; ${runOf.size} runs, ${ledger.length} dispatches, ${edited.size} edits (all on their branches), ${heads} heads observed; actions ${JSON.stringify(Object.fromEntries(actions))}; end states ${JSON.stringify(Object.fromEntries(states))}; ${scanned.length} files scanned`,
  );
}
