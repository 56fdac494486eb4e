/**
 * Reconciliation rules, and `reconcileRecord` over a StateStore on the pass's state engine
 * (support/test-state.ts): SQLite in the main pass, PostgreSQL in the PostgreSQL pass.
 */
import { type HelloFrame, PROTOCOL_VERSION, type RunSummary } from "@webcodex/protocol";
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { Registry } from "../../src/link/registry.js";
import { RunContext } from "../../src/runs/context.js";
import { decide, decideAfterQuery, type QueryAnswer, reconcileRecord } from "../../src/runs/reconcile.js";
import type { AdmissionRecord } from "../../src/state/record.js";
import type { StateStore } from "../../src/state/store.js";
import { openTestState } from "../support/test-state.js";

const RUN = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const STORE = "store_aaaaaaaaaaaaaaaa";

function record(admission: AdmissionRecord["admission"], store_id: string | null = STORE): AdmissionRecord {
  return {
    run_id: RUN,
    principal_id: "alice",
    project_id: "demo",
    provider_id: "fake",
    runner_id: "r1",
    intent_fingerprint: "0".repeat(64),
    agent_instance_id: "agent_aaaaaaaaaaaaaaaa",
    provider_instance_id: "prov_aaaaaaaaaaaaaaaaa",
    store_id,
    admission,
    state: "starting",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "wait",
    message: null,
    cancel_forwarded: false,
    cancel_pending: false,
    effective_config: [],
    usage_used_tokens: null,
    usage_context_size: null,
    usage_cost_amount: null,
    usage_cost_currency: null,
    runner_seq: null,
    runner_updated_at: null,
    created_at: "t",
    updated_at: "t",
  };
}

function hello(storeId: string, inventory: RunSummary[] = []): HelloFrame {
  return {
    type: "hello",
    protocol_version: PROTOCOL_VERSION,
    agent_instance_id: "agent_bbbbbbbbbbbbbbbb",
    store_id: storeId,
    capabilities: { coding_agent_run: { max_concurrent_runs: 1 } },
    providers: [],
    projects: [],
    inventory,
  };
}

const summary = { run_id: RUN, state: "running" } as RunSummary;

describe("reconciliation rules (design §6.1)", () => {
  it.each([
    [
      "an intent never sent closes as retryable failed/not_started",
      record("intent_recorded"),
      hello(STORE),
      "close",
      "failed",
    ],
    [
      "a sent run in the inventory takes the Runner's state",
      record("sent"),
      hello(STORE, [summary]),
      "apply",
      undefined,
    ],
    ["an admitted run missing from the inventory is queried", record("admitted"), hello(STORE), "query", undefined],
    [
      "a changed store_id makes an admitted run lost",
      record("admitted"),
      hello("store_other_aaaaaaaaa"),
      "close",
      "lost",
    ],
    ["a changed store_id makes a sent run lost", record("sent"), hello("store_other_aaaaaaaaa"), "close", "lost"],
  ] as const)("%s", (_name, rec, h, kind, state) => {
    const d = decide(rec, h, false);
    expect(d.kind).toBe(kind);
    if (d.kind === "close") expect(d.patch.state).toBe(state);
  });

  it("skips a run whose start is still in flight", () => {
    expect(decide(record("intent_recorded"), hello(STORE), true).kind).toBe("skip");
  });

  it("after a query: never admitted (same store) fails not_started and is retryable; admitted but missing is lost", () => {
    const sent = decideAfterQuery(record("sent"), null);
    expect(sent.kind === "close" && sent.patch).toMatchObject({
      admission: "rejected_pre_admission",
      state: "failed",
      execution_state: "not_started",
      failure_kind: "never_admitted",
      recovery_kind: "retry_same",
    });
    const admitted = decideAfterQuery(record("admitted"), null);
    expect(admitted.kind === "close" && admitted.patch).toMatchObject({
      state: "lost",
      execution_state: "outcome_unknown",
      failure_kind: "missing_on_runner",
    });
    expect(decideAfterQuery(record("admitted"), { kind: "run", summary }).kind).toBe("apply");
  });

  it("a pruned-but-tombstoned run closes with its recorded outcome, never as never-admitted", () => {
    const tombstone = {
      run_id: summary.run_id,
      state: "completed" as const,
      execution_state: "completed" as const,
      terminal_at: "2026-01-01T00:00:00.000Z",
    };
    for (const admission of ["sent", "admitted"] as const) {
      const d = decideAfterQuery(record(admission), { kind: "pruned", tombstone });
      expect(d.kind === "close" && d.patch).toMatchObject({
        admission: "admitted",
        state: "completed",
        execution_state: "completed",
        failure_kind: null,
        recovery_kind: "none",
      });
    }
  });
});

/**
 * `reconcileRecord` of one `sent` record on a real store: the Runner's answers come from `query` (called with
 * the RunContext, so it can note a start meanwhile or admit the record as another instance would), the link
 * is held or not as `linkHeld` says.
 */
async function reconcileSent(
  query: (ctx: RunContext, store: StateStore, asked: number) => Promise<QueryAnswer>,
  linkHeld = true,
) {
  const { store } = await openTestState();
  const {
    created_at: _c,
    updated_at: _u,
    cancel_forwarded: _f,
    cancel_pending: _p,
    effective_config: _e,
    ...sent
  } = record("sent");
  await store.insert(sent);
  const ctx = new RunContext(store, {} as Registry, pino({ level: "silent" }));
  const applied: RunSummary[] = [];
  let asked = 0;
  const closed = await reconcileRecord(await store.get(RUN).then((r) => r as AdmissionRecord), hello(STORE), {
    store,
    logger: pino({ level: "silent" }),
    isBusy: () => false,
    startMark: () => ctx.startMark(),
    startSentSince: (runId, mark) => ctx.startSentSince(runId, mark),
    linkHeld: async () => linkHeld,
    query: async () => query(ctx, store, ++asked),
    apply: async (_record, s) => {
      applied.push(s);
    },
    closed: () => undefined,
  });
  return { closed, asked, applied, after: await store.get(RUN) };
}

describe("a not_found that predates a start proves nothing (reconcileRecord)", () => {
  // The Runner answers not_found; meanwhile (maybe) a start of the run leaves on this instance.
  const notFound = (startSentMeanwhile: boolean) => async (ctx: RunContext) => {
    if (startSentMeanwhile) ctx.noteStartSent(RUN);
    return null;
  };

  it("closes a sent record the Runner does not know as never admitted", async () => {
    const { closed, after } = await reconcileSent(notFound(false));
    expect(closed).toBe(true);
    expect(after).toMatchObject({ state: "failed", failure_kind: "never_admitted" });
  });

  it("leaves it sent when a start of it left after the question was asked", async () => {
    const { closed, after } = await reconcileSent(notFound(true));
    expect(closed).toBe(false);
    expect(after).toMatchObject({ admission: "sent", state: "starting" });
  });
});

/**
 * The cluster chaos once saw a run answered lost / missing_on_runner and later completed: this instance
 * asked the Runner about a `sent` record and got not_found; meanwhile the Runner relinked to another
 * instance, a start sent there was admitted and the record said so — and the answer, older than that
 * admission, closed it. Neither this instance's starts in flight nor its marks could see that start.
 */
describe("a not_found older than an admission made elsewhere closes nothing (reconcileRecord)", () => {
  // The first answer is given before the start reached the Runner; the instance the start went through
  // records the admission. Asked again, the Runner has the run (or, for the lost case, still not).
  const admittedMeanwhile =
    (requery: "run" | "not_found") =>
    async (_ctx: RunContext, store: StateStore, asked: number): Promise<QueryAnswer> => {
      if (asked > 1) return requery === "run" ? { kind: "run", summary } : null;
      await store.update(RUN, { admission: "admitted", state: "running", execution_state: "started" });
      return null;
    };

  it("asks again when the record was admitted while the question was out, and takes the run it finds", async () => {
    const { closed, asked, applied, after } = await reconcileSent(admittedMeanwhile("run"));
    expect(closed).toBe(false);
    expect(asked).toBe(2);
    expect(applied).toEqual([summary]);
    expect(after).toMatchObject({ admission: "admitted", state: "running", failure_kind: null });
  });

  it("closes an admitted run as lost only on an answer given after it was admitted", async () => {
    const { closed, asked, after } = await reconcileSent(admittedMeanwhile("not_found"));
    expect(asked).toBe(2);
    expect(closed).toBe(true);
    expect(after).toMatchObject({ state: "lost", failure_kind: "missing_on_runner" });
  });

  it("closes nothing once the link the question went over no longer holds the Runner's lease", async () => {
    const { closed, after } = await reconcileSent(admittedMeanwhile("not_found"), false);
    expect(closed).toBe(false);
    expect(after).toMatchObject({ admission: "admitted", state: "running", failure_kind: null });
  });

  it("closes nothing on a sent record once the link no longer holds the lease", async () => {
    const { closed, after } = await reconcileSent(async () => null, false);
    expect(closed).toBe(false);
    expect(after).toMatchObject({ admission: "sent", state: "starting" });
  });
});
