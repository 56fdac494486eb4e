/**
 * Issue 43 §3: the seeded chaos of seeded-chaos.test.ts (plain starts) with a webhook subscription of alice's
 * to a real receiver that verifies every request with `standardwebhooks` and answers a seeded share of them 500
 * (so retries happen too), a third of them after a delay of up to 1.5 s (so a kill meets attempts in flight). Through SIGKILLs of the Runner, the Server (whose worker may hold a claim or an
 * unanswered attempt then), both or the agent, cancels and replays: every run's end arrives (`run.terminal`,
 * or `run.lost` for a run that ended lost) with the run's final state, answered 200 — 0 lost; every event the
 * outbox committed arrives and nothing else; a duplicate repeats an id and its body; one run's events arrive in
 * order (never one before an earlier one of the same run). The runs keep the dispatch invariants of the plain
 * chaos. Prints the seed; WEBCODEX_HARDENING_SEED reproduces the plan.
 */
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { okValue, ProcStack } from "../../../packages/server/test/support/proc-stack.js";
import { WebhookReceiver } from "../../../packages/server/test/support/webhook-receiver.js";
import { subscribe, verified } from "../../../packages/server/test/support/webhooks.js";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, poll } from "../../test-support/index.js";
import {
  ACTION_DELAY_MAX_MS,
  type ChaosAction as Action,
  ChaosStack,
  expectNoAgents,
  expectTruthfulEnds,
  SCENARIOS,
  type Seen,
  startInput,
  TerminalBook,
  tally,
} from "./support/chaos.js";
import { seed, size } from "./support/profile.js";

/** WEBCODEX_CHAOS_ITERATIONS changes the count for a local try. */
const ITERATIONS = Number(process.env.WEBCODEX_CHAOS_ITERATIONS) || size(40, 4);
/** Keys are drawn from a pool this much smaller than the iteration count: about a third repeat. */
const KEY_POOL = Math.max(3, Math.ceil((ITERATIONS * 2) / 3));
/** One receiver answer in this many is a 500 (drawn from the seed): those events are retried. */
const FAIL_ONE_IN = 5;
/** One receiver answer in this many waits up to ANSWER_DELAY_MAX_MS (drawn): a kill then meets an attempt in flight. */
const DELAY_ONE_IN = 3;
const ANSWER_DELAY_MAX_MS = 1500;
/** Answers drawn (then reused in turn). */
const ANSWERS = 1000;
/**
 * The first retry's delay: long enough that a run's later event is often committed while an earlier one waits
 * for its retry (the order is then the claim's doing), short enough that retries fit the chaos's bounds.
 */
const RETRY_BASE_MS = 1000;
/** The run events alice subscribes to. */
const EVENTS = "run.started,run.waiting_permission,run.terminal,run.lost";

interface Row {
  seq: number;
  event_id: string;
  run_id: string;
  event_type: string;
  body: string;
  status: string;
}

describe("seeded chaos with a webhook subscription: nothing lost, in order, duplicates only by id", () => {
  let stack: ProcStack;
  let chaos: ChaosStack;
  let hook: WebhookReceiver;

  beforeAll(async () => {
    stack = await new ProcStack({
      server: "child",
      runners: [{ id: "r1", projects: ["p1"] }],
      extraServerToml: `[server.webhooks]\nallow_loopback_http = true\nretry_base_ms = ${RETRY_BASE_MS}\n`,
    }).init();
    await stack.startRunner("r1");
    chaos = new ChaosStack(stack);
  });

  afterAll(async () => {
    await hook?.close();
    await stack?.stop();
  });

  it(
    `delivers every run's end through ${ITERATIONS} seeded iterations of kills, replays and cancels`,
    async () => {
      const s = seed();
      console.log(
        `webhook chaos seed=${s} iterations=${ITERATIONS} (WEBCODEX_HARDENING_SEED=${s} reproduces the plan)`,
      );
      const t0 = Date.now();
      // The receiver's answers, drawn from the seed too: a status, and a delay before it.
      const answers = fc.sample(
        fc.record({
          fail: fc.nat({ max: FAIL_ONE_IN - 1 }).map((n) => n === 0),
          delayMs: fc.oneof(
            { weight: DELAY_ONE_IN - 1, arbitrary: fc.constant(0) },
            { weight: 1, arbitrary: fc.nat({ max: ANSWER_DELAY_MAX_MS }) },
          ),
        }),
        { numRuns: ANSWERS, seed: s },
      );
      const answer = (i: number) => answers[i % ANSWERS] ?? { fail: false, delayMs: 0 };
      hook = await new WebhookReceiver(
        (_req, i) => (answer(i).fail ? 500 : 200),
        (i) => answer(i).delayMs,
      ).start();
      const sub = await subscribe(stack.serverConfigFile, "alice", hook.url, EVENTS);
      const plan = fc.sample(
        fc.record({
          key: fc.nat({ max: KEY_POOL - 1 }),
          scenario: fc.nat({ max: SCENARIOS.length - 1 }),
          action: fc.oneof(
            { weight: 2, arbitrary: fc.constantFrom<Action>("none", "cancel", "replay") },
            { weight: 3, arbitrary: fc.constantFrom<Action>("kill_runner", "kill_server", "kill_both", "kill_agent") },
          ),
          delayMs: fc.oneof(fc.constant(0), fc.nat({ max: ACTION_DELAY_MAX_MS })),
        }),
        { numRuns: ITERATIONS, seed: s },
      );
      // Even the short plan kills the Server once, after its worker had events to deliver.
      if (!plan.some((p) => p.action === "kill_server" || p.action === "kill_both") && plan[0])
        plan[plan.length - 1]!.action = "kill_server";
      const promptOf = new Map<string, string>();
      const runOf = new Map<string, string>();
      const book = new TerminalBook();
      const actions = new Map<string, number>();
      const observeTerminal = (runId: string): Promise<Seen> => chaos.observeTerminal(book, runId);

      for (const [i, step] of plan.entries()) {
        const key = `hook-key-${step.key}`;
        const prompt = promptOf.get(key) ?? `${SCENARIOS[step.scenario]}\nchaos ${key}`;
        promptOf.set(key, prompt);
        tally(actions, step.action);
        const start = () => chaos.start(startInput(key, prompt));
        const replay = await chaos.startStep(i, key, step.action, step.delayMs, start, runOf);
        if (step.action === "cancel") okValue(await stack.cancel("alice", { run_id: replay.run_id }));
        await observeTerminal(replay.run_id);
        if (step.action === "replay") expect((await chaos.mustStart(i, key, start)).replayed).toBe(true);
      }

      await chaos.ensureUp();
      const { ends: endOfKey } = await expectTruthfulEnds(
        runOf,
        (key) => promptOf.get(key)!,
        stack.prompts("r1"),
        observeTerminal,
      );
      const ends = new Map([...endOfKey.values()].map((e) => [e.runId, e.seen]));

      // 0 lost: every run's end arrives with its final state, and every committed event, answered 200.
      const endOf = (runId: string) => (ends.get(runId)?.state === "lost" ? "run.lost" : "run.terminal");
      const rows = await poll(
        async () => {
          const all = (
            await stack.stateRows<Row>(
              "SELECT seq, event_id, run_id, event_type, body, status FROM webhook_outbox ORDER BY seq",
            )
          ).map((r) => ({ ...r, seq: Number(r.seq) }));
          const ok = new Set(hook.received.filter((r) => r.status === 200).map((r) => r.headers["webhook-id"]));
          const ended = [...runOf.values()].every((runId) =>
            all.some((r) => r.run_id === runId && r.event_type === endOf(runId) && ok.has(r.event_id)),
          );
          return ended && all.every((r) => r.status === "delivered" && ok.has(r.event_id)) ? all : undefined;
        },
        { timeoutMs: DAEMON_WAIT_MS * 2, intervalMs: DAEMON_POLL_MS, what: "every run's end delivered" },
      );
      const events = verified(hook, sub.secret);
      const byId = new Map(rows.map((r) => [r.event_id, r]));
      for (const runId of runOf.values()) {
        const last = events.filter((e) => e.data.run_id === runId && e.type === endOf(runId)).at(-1);
        expect(last?.data.state, `the end delivered for ${runId}`).toBe(ends.get(runId)?.state);
      }
      // Nothing but the outbox's events, a duplicate with its id and its body.
      hook.received.forEach((r, i) => {
        const row = byId.get(r.headers["webhook-id"] ?? "");
        expect(row?.body, `request ${i}: an event of the outbox, its body`).toBe(r.body);
      });
      // In order per run: the arrivals of one run's events never go back to an earlier one.
      for (const runId of runOf.values()) {
        const seqs = events.filter((e) => e.data.run_id === runId).map((e) => byId.get(e.id)?.seq ?? -1);
        expect(seqs, `the order of ${runId}'s events`).toEqual([...seqs].sort((x, y) => x - y));
      }
      await expectNoAgents(() => chaos.agentPids());
      const duplicates = events.filter((e) => e.status === 200).length - rows.length;
      const failed = events.filter((e) => e.status === 500).length;
      console.log(
        `webhook chaos: ${ITERATIONS} iterations in ${((Date.now() - t0) / 1000).toFixed(1)} s; ${runOf.size} runs, ${rows.length} events, ${events.length} requests (${failed} answered 500, ${duplicates} duplicate deliveries); actions ${JSON.stringify(Object.fromEntries(actions))}`,
      );
    },
    18 * 60_000,
  );
});
