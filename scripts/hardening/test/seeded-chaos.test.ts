/**
 * Issue 16 §4: seeded chaos against a real Server child, a real Runner child
 * and the fake agent. Each iteration starts a run (random scenario; keys drawn
 * from a small pool, so some repeat), and at a random moment — 0 ms after the
 * start call included — SIGKILLs the Runner (its pid only: the agent is left
 * orphaned), the Server, both, or the agent; or cancels; or replays the same
 * key. Killed daemons are restarted, the key is replayed, and the run must end
 * within a deadline. Invariants, from the fake agent's ledger and the
 * Server's answers: no prompt dispatched twice; no run `not_started` whose
 * prompt is in the ledger; no run `completed` without it; every run terminal
 * within its deadline; a terminal state never changes; no orphan process; the
 * canary secret mapped into the agent's env never appears in any file under
 * the state dirs or in the logs. Prints the seed; WEBCODEX_HARDENING_SEED
 * reproduces the plan.
 *
 * About a third of the starts are managed-task starts (design §10) through a
 * real MCP client: create the task (idempotent by its key), claim it, and
 * `start_agent_task_coding_run` with the claim — killed around, replayed and
 * cancelled like the plain starts. A repeated task key re-creates (replayed),
 * renews the holder's claim and replays the start: the same run, never a
 * second dispatch. The task's runs obey the same invariants, and the task
 * itself stays consistent with its run: reconcile reports the run's first
 * terminal answer after every restart, one attempt, the task open and that
 * attempt current. When the holder's lease lapses, a new claim is taken —
 * unless the run is lost, which blocks it until the host supersedes that run —
 * and the old claim starts nothing; once closed, the task starts and claims
 * nothing more.
 */
import { randomBytes } from "node:crypto";
import { appendFileSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_LEASE_SECS, MIN_LEASE_SECS } from "../../../packages/server/src/tasks/service.js";
import { TASK_TOOL_NAMES } from "../../../packages/server/src/tasks/tools.js";
import { okValue, ProcStack } from "../../../packages/server/test/support/proc-stack.js";
import { DAEMON_POLL_MS, poll } from "../../test-support/index.js";
import {
  ACTION_DELAY_MAX_MS,
  type ChaosAction as Action,
  ChaosStack,
  CRASH_SCENARIO,
  expectCanaryAbsent,
  expectNoAgents,
  expectTruthfulEnds,
  RUN_TIMEOUT_SECS,
  SCENARIOS,
  type Seen,
  type Started,
  startInput,
  TerminalBook,
  tally,
} from "./support/chaos.js";
import { seed, size } from "./support/profile.js";
import { TaskHost } from "./support/task-host.js";

/** WEBCODEX_CHAOS_ITERATIONS changes the count for a local try. */
const ITERATIONS = Number(process.env.WEBCODEX_CHAOS_ITERATIONS) || size(200, 6);
/** Keys are drawn from a pool this much smaller than the iteration count: about a third repeat. */
const KEY_POOL = Math.max(4, Math.ceil((ITERATIONS * 2) / 3));
/** Task keys come from a smaller pool (about a third of the steps are managed): about half of them repeat. */
const TASK_POOL = Math.max(2, Math.ceil(ITERATIONS / 6));
const ASSIGNEE = "chaos-host";

interface Step {
  key: number;
  scenario: number;
  action: Action;
  delayMs: number;
  /** A managed-task start (create, claim, start_agent_task_coding_run) instead of a plain start. */
  managed: boolean;
}

interface TaskClaim {
  task_id: string;
  attempt_id: string;
  attempt_ref: string;
}

describe("seeded chaos: kills, restarts, replays and cancels", () => {
  let stack: ProcStack;
  let chaos: ChaosStack;
  let host: TaskHost;
  const canary = `wc-canary-${randomBytes(12).toString("hex")}`;
  const runnerEnv = { WC_CANARY: canary };

  beforeAll(async () => {
    stack = await new ProcStack({ server: "child", runners: [{ id: "r1", projects: ["p1"] }] }).init();
    // Map the canary into the agent's environment (the config ends in [acp.agents.env_from_env]).
    appendFileSync(join(stack.dir, "runner-r1.toml"), 'WC_CANARY = "WC_CANARY"\n');
    await stack.startRunner("r1", [], runnerEnv);
    chaos = new ChaosStack(stack, runnerEnv);
    host = new TaskHost(() => stack.port, stack.principalTokens.get("alice")!);
  });

  afterAll(async () => {
    await host?.close();
    await stack?.stop();
  });

  it(
    `keeps every dispatch invariant through ${ITERATIONS} seeded iterations`,
    async () => {
      const s = seed();
      console.log(`seeded chaos seed=${s} iterations=${ITERATIONS} (WEBCODEX_HARDENING_SEED=${s} reproduces the plan)`);
      const t0 = Date.now();
      const plan: Step[] = fc.sample(
        fc.record({
          key: fc.nat({ max: KEY_POOL - 1 }),
          scenario: fc.nat({ max: SCENARIOS.length - 1 }),
          // Kills (each costs a restart, a Runner's about the link's lease window) in about a third of the steps.
          action: fc.oneof(
            { weight: 3, arbitrary: fc.constant<Action>("none") },
            { weight: 2, arbitrary: fc.constant<Action>("cancel") },
            { weight: 2, arbitrary: fc.constant<Action>("replay") },
            { weight: 1, arbitrary: fc.constantFrom<Action>("kill_runner", "kill_server", "kill_both", "kill_agent") },
            { weight: 2, arbitrary: fc.constantFrom<Action>("kill_runner", "kill_server", "kill_both", "kill_agent") },
          ),
          delayMs: fc.oneof(fc.constant(0), fc.nat({ max: ACTION_DELAY_MAX_MS })),
          managed: fc.nat({ max: 2 }).map((n) => n === 0),
        }),
        { numRuns: ITERATIONS, seed: s },
      );
      // Even the short plan has a managed start, and a task whose agent dies holding its prompt (its run ends
      // lost, which must block a new claim until superseded).
      if (!plan.some((p) => p.managed) && plan[0]) plan[0].managed = true;
      const firstManaged = plan.find((p) => p.managed);
      if (firstManaged && !plan.some((p) => p.managed && p.scenario === CRASH_SCENARIO))
        firstManaged.scenario = CRASH_SCENARIO;
      const promptOf = new Map<string, string>();
      const runOf = new Map<string, string>();
      const book = new TerminalBook();
      const actions = new Map<string, number>();
      const tasks = new Map<string, TaskClaim>();

      /** The task of a key: created (or re-created: replayed), and claimed (or the holder's claim renewed). */
      const claimTask = async (key: string, instruction: string): Promise<TaskClaim> => {
        const created = await host.ok(TASK_TOOL_NAMES.create, { project_id: "p1", instruction, idempotency_key: key });
        const known = tasks.get(key);
        if (known) {
          expect(created, `re-creating ${key}`).toMatchObject({ task_id: known.task_id, replayed: true });
          // Nobody else claims the task while the holder's lease lives.
          const other = await host.call(TASK_TOOL_NAMES.attempt, { task_id: known.task_id, assignee: "chaos-other" });
          expect(other.ok ? "claimed" : other.error.code, `a second claim on ${key}`).toBe("claim_conflict");
          const renewed = await host.ok(TASK_TOOL_NAMES.attempt, {
            task_id: known.task_id,
            assignee: ASSIGNEE,
            renew_attempt_ref: known.attempt_ref,
            lease_secs: MAX_LEASE_SECS,
          });
          expect(renewed).toMatchObject({ attempt_id: known.attempt_id, renewed: true });
          known.attempt_ref = String(renewed.attempt_ref);
          return known;
        }
        expect(created.replayed, `creating ${key}`).toBe(false);
        const claim = await host.ok(TASK_TOOL_NAMES.attempt, {
          task_id: created.task_id,
          assignee: ASSIGNEE,
          lease_secs: MAX_LEASE_SECS,
        });
        const fresh = {
          task_id: String(claim.task_id),
          attempt_id: String(claim.attempt_id),
          attempt_ref: String(claim.attempt_ref),
        };
        tasks.set(key, fresh);
        return fresh;
      };

      const startTaskRun = async (task: TaskClaim): Promise<Started> => {
        const r = await host.call(TASK_TOOL_NAMES.run, {
          project_id: "p1",
          provider_id: "fake",
          attempt_ref: task.attempt_ref,
          timeout_secs: RUN_TIMEOUT_SECS,
        });
        if (!r.ok) return r;
        expect(r.value).toMatchObject({ task_id: task.task_id, attempt_id: task.attempt_id });
        return { ok: true, value: { run_id: String(r.value.run_id), replayed: r.value.replayed === true } };
      };

      /** Reconcile of the key's first attempt reports its run's first terminal answer; returns the reconcile. */
      const expectAttemptRun = async (key: string): Promise<Record<string, unknown>> => {
        const task = tasks.get(key)!;
        const runId = runOf.get(key)!;
        const first = book.first(runId)!;
        const rec = await host.ok(TASK_TOOL_NAMES.reconcile, { task_id: task.task_id, attempt_id: task.attempt_id });
        const run = (rec.attempt as { run: Record<string, unknown> | null }).run;
        expect(run, `task ${key}: reconcile sees its run`).not.toBeNull();
        expect(
          {
            run_id: run!.run_id,
            state: run!.state,
            execution_state: run!.execution_state,
            stop_reason: run!.stop_reason ?? null,
            failure_kind: run!.failure_kind ?? null,
          },
          `task ${key}: the attempt's run outcome`,
        ).toEqual({ run_id: runId, ...first });
        return rec;
      };

      /** The task agrees with its run: reconcile reports the run's first terminal answer; one attempt, current. */
      const checkTask = async (key: string): Promise<void> => {
        const task = tasks.get(key)!;
        const rec = await expectAttemptRun(key);
        expect(rec.task, `task ${key}`).toMatchObject({ state: "open", current_attempt_id: task.attempt_id });
        expect(rec.attempts, `task ${key}: attempts`).toBe(1);
      };

      const observeTerminal = (runId: string): Promise<Seen> => chaos.observeTerminal(book, runId);

      for (const [i, step] of plan.entries()) {
        const key = step.managed ? `chaos-task-${step.key % TASK_POOL}` : `chaos-key-${step.key}`;
        const prompt = promptOf.get(key) ?? `${SCENARIOS[step.scenario]}\nchaos ${key}`;
        promptOf.set(key, prompt);
        const action = `${step.managed ? "task:" : ""}${step.action}`;
        tally(actions, action);
        const task = step.managed ? await claimTask(key, prompt) : null;
        const startOnce = (): Promise<Started> => (task ? startTaskRun(task) : chaos.start(startInput(key, prompt)));
        const replay = await chaos.startStep(i, key, step.action, step.delayMs, startOnce, runOf);
        if (step.action === "cancel") {
          // A task's run is cancelled like any run, with the run tool (design §10).
          if (task) await host.ok("cancel_coding_agent", { run_id: replay.run_id });
          else okValue(await stack.cancel("alice", { run_id: replay.run_id }));
        }
        await observeTerminal(replay.run_id);
        if (step.action === "replay") {
          const again = await chaos.mustStart(i, key, startOnce);
          expect(again.run_id).toBe(replay.run_id);
          expect(again.replayed).toBe(true);
        }
        if (task) await checkTask(key);
      }

      // Invariants over every run, from the ledger and the Server's answers.
      await chaos.ensureUp();
      const ledger = stack.prompts("r1");
      const { states } = await expectTruthfulEnds(runOf, (key) => promptOf.get(key)!, ledger, observeTerminal);

      // Every task still agrees with its run after all the restarts.
      for (const key of tasks.keys()) await checkTask(key);
      // A lapsed lease is not proof the work stopped: once the holders' leases lapse, a task whose run ended takes a
      // new claim, but a lost run blocks it until the host supersedes that run (design §10).
      for (const task of tasks.values()) {
        const renewed = await host.ok(TASK_TOOL_NAMES.attempt, {
          task_id: task.task_id,
          assignee: ASSIGNEE,
          renew_attempt_ref: task.attempt_ref,
          lease_secs: MIN_LEASE_SECS,
        });
        task.attempt_ref = String(renewed.attempt_ref);
      }
      await poll(
        async () => {
          for (const task of tasks.values()) {
            const rec = await host.ok(TASK_TOOL_NAMES.reconcile, { task_id: task.task_id });
            if ((rec.attempt as { lease_live: boolean }).lease_live) return false;
          }
          return true;
        },
        { timeoutMs: 10 * MIN_LEASE_SECS * 1000, intervalMs: DAEMON_POLL_MS, what: "the holders' leases to lapse" },
      );
      const taskRuns = new Map<string, number>();
      for (const [key, task] of tasks) {
        const runId = runOf.get(key)!;
        const first = book.first(runId)!;
        tally(taskRuns, first.state);
        const plain = await host.call(TASK_TOOL_NAMES.attempt, { task_id: task.task_id, assignee: "chaos-next" });
        let next: Record<string, unknown>;
        if (first.state === "lost") {
          expect(plain.ok ? "claimed" : plain.error.code, `a new claim over the lost run of ${key}`).toBe(
            "claim_conflict",
          );
          next = await host.ok(TASK_TOOL_NAMES.attempt, {
            task_id: task.task_id,
            assignee: "chaos-next",
            supersede_uncertain_run: runId,
          });
          expect(next.superseded_run_id).toBe(runId);
        } else {
          if (!plain.ok) throw new Error(`a new claim on ${key} (run ${first.state}): ${JSON.stringify(plain.error)}`);
          next = plain.value;
        }
        expect(next.fence, `fence of the second attempt on ${key}`).toBe(2);
        const nextClaim = {
          task_id: task.task_id,
          attempt_id: String(next.attempt_id),
          attempt_ref: String(next.attempt_ref),
        };
        // The first claim is stale now: replaying its start starts nothing; its attempt keeps its run's outcome.
        const stale = await startTaskRun(task);
        expect(stale.ok ? "started" : (stale.error as { code: string }).code, `old claim of ${key}`).toBe(
          "stale_claim",
        );
        await expectAttemptRun(key);
        // Closed, the task starts and claims nothing more.
        const outcome = first.state === "completed" ? "succeeded" : "failed";
        const closed = await host.ok(TASK_TOOL_NAMES.close, { task_id: task.task_id, outcome });
        expect(closed, `closing ${key}`).toMatchObject({ task: { state: "closed", outcome }, already_closed: false });
        const start = await startTaskRun(nextClaim);
        expect(start.ok ? "started" : (start.error as { code: string }).code, `start after closing ${key}`).toBe(
          "stale_claim",
        );
        const claim = await host.call(TASK_TOOL_NAMES.attempt, { task_id: task.task_id, assignee: ASSIGNEE });
        expect(claim.ok ? "claimed" : claim.error.code, `claim after closing ${key}`).toBe("claim_conflict");
        expect(await observeTerminal(runId), `${key}: its run after the task closed`).toEqual(first);
      }
      expect(stack.prompts("r1"), "no dispatch after the tasks closed").toHaveLength(ledger.length);

      // The canary never reached a file under the stack's dirs (state, config, ledger) or a daemon log.
      const scanned = expectCanaryAbsent(canary, stack.dir, stack.logs);
      // No agent outlives its run (orphans of a killed Runner are reaped by the next one).
      await expectNoAgents(() => chaos.agentPids());
      console.log(
        `seeded chaos: ${ITERATIONS} iterations in ${((Date.now() - t0) / 1000).toFixed(1)} s; ${runOf.size} runs (${tasks.size} tasks, their runs ${JSON.stringify(Object.fromEntries(taskRuns))}), ${ledger.length} dispatches; actions ${JSON.stringify(Object.fromEntries(actions))}; end states ${JSON.stringify(Object.fromEntries(states))}; ${scanned} files scanned`,
      );
    },
    18 * 60_000,
  );
});
