/**
 * Admission's last step (design §6.1): the Runner's answer to `run.start` (or its absence), applied to the record —
 * not sent (a rejection the same key may retry), unknown (left `sent` for reconciliation), admitted, answered from
 * the Runner's tombstone, or rejected before admission.
 */
import type { RequestOutcome } from "../link/hub.js";
import type { LiveRunner } from "../link/registry.js";
import type { AdmissionRecord } from "../state/record.js";
import type { AdmissionRequest, ApiResult, StartOutput } from "./api.js";
import { fail, type RunContext } from "./context.js";
import type { Observation } from "./observe.js";
import { answer, STARTING } from "./start-answer.js";
import { capacityRejection, RUNNER_REJECTIONS } from "./start-refusals.js";
import { rejectionPatch, rejectUnlessSettled } from "./start-rejection.js";

/** Where a start's `run.start` went. */
export interface SentTo {
  runner: LiveRunner;
  /** The earlier record when it was sent and never acknowledged: re-sent, never marked rejected. */
  unacknowledged: AdmissionRecord | undefined;
}

/**
 * The Runner's answer to `run.start` (or its absence), applied to the record: not sent (a rejection
 * the same key may retry), unknown (left `sent` for reconciliation), admitted, answered from the
 * Runner's tombstone, or rejected before admission.
 */
export async function settleStart(
  ctx: RunContext,
  observation: Observation,
  req: AdmissionRequest,
  target: SentTo,
  outcome: RequestOutcome,
): Promise<ApiResult<StartOutput>> {
  const { runner, unacknowledged } = target;
  const runId = req.run_id;
  const instance = runner.agentInstanceId;
  if (!outcome.ok) {
    if ((outcome.reason === "busy" || outcome.reason === "not_sent") && !unacknowledged) {
      const after = await rejectUnlessSettled(
        ctx.store,
        runId,
        rejectionPatch("never_admitted", "The Runner link was busy; nothing was started."),
      );
      if (after !== null) return answer(ctx, runId, after, true, instance);
      return fail(
        "runner_unavailable",
        "The Runner link is busy; nothing was started. Retry with the same key.",
        "retry_same",
      );
    }
    // The frame may have reached the Runner: the outcome is unknown. Reconciliation settles it.
    ctx.log.warn({ run_id: runId, reason: outcome.reason }, "run.start outcome unknown; left for reconciliation");
    return answer(ctx, runId, (await ctx.store.get(runId)) ?? STARTING, false, instance);
  }
  const frame = outcome.frame;
  if (frame.type === "run.start.result") {
    const store = ctx.store;
    // No fsync of its own (state/store.ts): losing it to an OS crash leaves the record `sent`, and a
    // `sent` record is re-sent with the same run_id, which the Runner answers with this run (§6.1).
    // The next FULL commit makes it durable; the caller's answer need not wait for a disk flush. Read
    // FOR UPDATE and written in this one transaction, so the no-regress rule sees the row it changes.
    const latest = await store.transaction(
      async (tx) => {
        const rec = await store.lock(tx, runId);
        if (!rec || rec.admission === "admitted") return rec;
        return await store.update(runId, { admission: "admitted", ...ctx.noRegress(rec, frame.run) }, { tx });
      },
      { durability: "relaxed" },
    );
    const mirror = ctx.mirrors.getOrCreate(runId);
    if (mirror.instance !== instance) mirror.reset(instance);
    if (!mirror.synced && mirror.size === 0 && mirror.lastSeq === 0 && frame.run.last_seq === 0)
      mirror.markSynced(frame.run);
    else void observation.catchUp(mirror, runner);
    ctx.log.info({ run_id: runId, runner_id: runner.runnerId, created: frame.created }, "run admitted");
    return answer(ctx, runId, latest ?? frame.run, !frame.created, instance);
  }
  if (frame.type === "error" && frame.tombstone) {
    // The Runner admitted this run once and pruned its row: the tombstone is the run's outcome.
    await ctx.applyTombstone(runId, frame.tombstone);
    ctx.log.info({ run_id: runId, runner_id: runner.runnerId }, "start answered from the Runner's tombstone");
    return answer(ctx, runId, (await ctx.store.get(runId)) ?? frame.tombstone, true, instance);
  }
  if (frame.type === "error") {
    const rej =
      frame.code === "capacity" && frame.capacity_reason !== undefined
        ? capacityRejection(frame.capacity_reason)
        : RUNNER_REJECTIONS[frame.code];
    if (rej) {
      const after = await rejectUnlessSettled(ctx.store, runId, rejectionPatch(rej.failure, rej.message, rej.recovery));
      if (after !== null) return answer(ctx, runId, after, true, instance);
      ctx.log.info(
        { run_id: runId, code: frame.code, ...(rej.reason ? { capacity_reason: rej.reason } : {}) },
        "run rejected by the Runner before admission",
      );
      const refused = fail<StartOutput>(rej.code, rej.message, rej.recovery);
      if (!refused.ok && rej.reason) refused.error.capacity_reason = rej.reason;
      return refused;
    }
    ctx.log.warn({ run_id: runId, code: frame.code }, "run.start answered with an unexpected error");
    if (frame.code === "idempotency_conflict") {
      return fail("idempotency_conflict", "The Runner holds a different run under this id.", "reconcile");
    }
    return fail("internal", "The Runner could not start the run; its outcome is being reconciled.", "reconcile");
  }
  return fail("internal", "Unexpected Runner response.", "reconcile");
}
