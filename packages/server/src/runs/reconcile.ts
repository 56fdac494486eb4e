/**
 * Reconciliation of Server admission records against a Runner (design §6.1).
 * Runs on every Runner `hello` and, for records that were never sent, at
 * Server start. It fails closed: a run that may have been admitted but
 * cannot be found becomes `lost`, never re-sent.
 */
import {
  FAILURE_SUMMARIES,
  type HelloFrame,
  type RunSummary,
  type RunTombstone,
  TOMBSTONE_MESSAGE,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import type { StateQueries } from "../state/engine.js";
import type { AdmissionRecord, RecordPatch } from "../state/record.js";
import type { StateStore } from "../state/store.js";

export const RESTARTED_BEFORE_DISPATCH_MESSAGE =
  "The Server restarted before sending this run to its Runner; no prompt was dispatched. Retry with the same idempotency key.";

/**
 * At Server start: intents that were recorded but never sent can be retried with the same key. Each is
 * closed only if it is still the intent listed (compare-and-set in the one UPDATE); returns how many.
 */
export async function reconcileAtStart(store: StateStore, logger: Logger): Promise<number> {
  const stale = await store.listByAdmission("intent_recorded");
  let closed = 0;
  for (const r of stale) {
    const updated = await store.update(
      r.run_id,
      {
        admission: "rejected_pre_admission",
        state: "failed",
        execution_state: "not_started",
        stop_reason: null,
        failure_kind: "never_admitted",
        recovery_kind: "retry_same",
        message: RESTARTED_BEFORE_DISPATCH_MESSAGE,
      },
      { expect: r },
    );
    if (updated) closed++;
  }
  if (closed > 0) logger.info({ count: closed }, "closed never-sent admission intents as retryable");
  return closed;
}

export type Decision =
  | { kind: "skip" }
  | { kind: "apply"; summary: RunSummary }
  | { kind: "query" }
  | { kind: "close"; patch: RecordPatch };

export function neverAdmittedPatch(retry: boolean): RecordPatch {
  return {
    ...(retry ? { admission: "rejected_pre_admission" as const } : {}),
    state: "failed",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: "never_admitted",
    recovery_kind: retry ? "retry_same" : "none",
    message: FAILURE_SUMMARIES.never_admitted,
  };
}

export function lostPatch(kind: "runner_store_changed" | "missing_on_runner"): RecordPatch {
  return {
    state: "lost",
    execution_state: "outcome_unknown",
    stop_reason: null,
    failure_kind: kind,
    recovery_kind: "reconcile",
    message: FAILURE_SUMMARIES[kind],
  };
}

/**
 * The Runner admitted the run and pruned its row: it ended as the tombstone says (a `sent` record was
 * admitted after all). Its details and events are gone, so the message says so.
 */
export function tombstonePatch(t: RunTombstone): RecordPatch {
  return {
    admission: "admitted",
    state: t.state,
    execution_state: t.execution_state,
    stop_reason: null,
    failure_kind: null,
    recovery_kind: t.state === "lost" ? "reconcile" : "none",
    message: TOMBSTONE_MESSAGE,
  };
}

/** What the Runner said of a run missing from its inventory: its summary, its tombstone, or null (never admitted). */
export type QueryAnswer = { kind: "run"; summary: RunSummary } | { kind: "pruned"; tombstone: RunTombstone } | null;

/** What to do with one open record of this runner, given its hello. */
export function decide(record: AdmissionRecord, hello: HelloFrame, busy: boolean): Decision {
  if (busy) return { kind: "skip" };
  switch (record.admission) {
    case "rejected_pre_admission":
      return { kind: "skip" };
    case "intent_recorded":
      // Not in flight (not busy) and never sent: nothing reached the Runner.
      return { kind: "close", patch: neverAdmittedPatch(true) };
    case "sent":
    case "admitted": {
      if (record.store_id !== null && record.store_id !== hello.store_id) {
        return { kind: "close", patch: lostPatch("runner_store_changed") };
      }
      const summary = hello.inventory.find((s) => s.run_id === record.run_id);
      if (summary) return { kind: "apply", summary };
      return { kind: "query" };
    }
    default: {
      const never: never = record.admission;
      throw new Error(`unknown admission ${String(never)}`);
    }
  }
}

/** Decide for a record missing from the inventory once the Runner answered run.sync. */
export function decideAfterQuery(record: AdmissionRecord, found: QueryAnswer): Decision {
  if (found?.kind === "run") return { kind: "apply", summary: found.summary };
  // Admitted once, row pruned since: the tombstone is the outcome. Absence would not be proof.
  if (found?.kind === "pruned") return { kind: "close", patch: tombstonePatch(found.tombstone) };
  // Same store, no row and no tombstone (the Runner keeps one for every run it ever admitted, and admits
  // durably before replying): the run was never admitted. Nothing reached the agent, so an exact same-key
  // retry may re-admit it (design §6.1: retry_same).
  if (record.admission === "sent") return { kind: "close", patch: neverAdmittedPatch(true) };
  return { kind: "close", patch: lostPatch("missing_on_runner") };
}

/** How many times one record is asked about when it is admitted while the question is out (then: next hello). */
export const MAX_RECONCILE_QUERIES = 3;

export interface ReconcileDeps {
  store: StateStore;
  logger: Logger;
  isBusy(runId: string): boolean;
  /** RunContext.startMark / startSentSince: a `not_found` asked before a start that left since proves nothing. */
  startMark(): number;
  startSentSince(runId: string, mark: number): boolean;
  /**
   * run.sync(after_seq = 0, max 0) against the live connection: the summary, the tombstone (`pruned`),
   * null when the Runner never admitted it (`not_found`), "unavailable" on failure.
   */
  query(runId: string): Promise<QueryAnswer | "unavailable">;
  /**
   * Inside the transaction that would close a record on a query's answer: whether the link the query went
   * over is still this instance's live link and still holds the Runner's lease (read in `tx`). Once the
   * Runner has linked elsewhere, a start sent there may have been admitted after that answer, and this
   * instance cannot see it (its `startSentSince` knows only its own starts): the answer proves nothing.
   */
  linkHeld(tx: StateQueries): Promise<boolean>;
  apply(record: AdmissionRecord, summary: RunSummary): Promise<void>;
  closed(record: AdmissionRecord): void;
}

export async function reconcileRunner(runnerId: string, hello: HelloFrame, deps: ReconcileDeps): Promise<void> {
  const open = await deps.store.listOpenForRunner(runnerId);
  let closed = 0;
  for (const record of open) {
    if (await reconcileRecord(record, hello, deps)) closed++;
  }
  deps.logger.info({ runner_id: runnerId, open: open.length, closed }, "reconciliation done");
}

/**
 * Reconcile one open record against the Runner that sent `hello`. True when it was closed. A close is
 * written only if the record is still the one decided on: the listed record (compare-and-set), or after
 * a run.sync query the row read FOR UPDATE in the transaction that closes it.
 */
export async function reconcileRecord(
  record: AdmissionRecord,
  hello: HelloFrame,
  deps: ReconcileDeps,
): Promise<boolean> {
  const store = deps.store;
  let d = decide(record, hello, deps.isBusy(record.run_id));
  let updated: AdmissionRecord | undefined;
  if (d.kind === "close") {
    updated = await store.update(record.run_id, d.patch, { expect: record });
    if (updated === undefined) return false;
  }
  let asked = record;
  for (let round = 0; d.kind === "query"; round++) {
    const mark = deps.startMark();
    const found = await deps.query(record.run_id);
    if (found === "unavailable") return false;
    const after = await store.transaction(async (tx) => {
      const fresh = await store.lock(tx, record.run_id);
      if (!fresh || deps.isBusy(record.run_id) || deps.startSentSince(record.run_id, mark)) return undefined;
      // Admitted since it was read: the Runner's answer may predate that admission (a start that reached
      // it over another link), so it is asked again, on the record as it is now.
      if (found === null && fresh.admission !== asked.admission) return { fresh };
      const decision = decideAfterQuery(fresh, found);
      if (decision.kind === "close" && !(await deps.linkHeld(tx))) return undefined;
      return {
        decision,
        updated: decision.kind === "close" ? await store.update(record.run_id, decision.patch, { tx }) : undefined,
      };
    });
    if (after === undefined) return false;
    if (!("decision" in after)) {
      if (round + 1 >= MAX_RECONCILE_QUERIES) return false;
      asked = after.fresh;
      continue;
    }
    d = after.decision;
    if (d.kind === "close" && after.updated === undefined) return false;
    updated = after.updated;
  }
  switch (d.kind) {
    case "skip":
      return false;
    case "apply":
      await deps.apply(record, d.summary);
      return false;
    case "close": {
      deps.logger.info(
        {
          run_id: record.run_id,
          runner_id: record.runner_id,
          state: d.patch.state,
          failure_kind: d.patch.failure_kind,
        },
        "reconciled run",
      );
      if (updated) deps.closed(updated);
      return true;
    }
  }
}
