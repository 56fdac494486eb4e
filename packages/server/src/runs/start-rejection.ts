/**
 * A rejection before admission, as the admission record keeps it (design §6.1: `rejected_pre_admission`, which an
 * exact retry of the same key may re-admit): the patch, its first write for a Runner that was offline, and its
 * write over a `sent` record that no other instance settled meanwhile. Each write is conditional on the record the
 * caller read, so a record settled elsewhere is never overwritten.
 */
import { type FailureKind, isTerminalState, type RecoveryKind } from "@webcodex/protocol";
import type { Principal } from "../principals/principal.js";
import type { StateQueries } from "../state/engine.js";
import type { AdmissionRecord, RecordPatch } from "../state/record.js";
import type { RECORD_CHANGED, StateStore } from "../state/store.js";
import type { AdmissionRequest } from "./api.js";

/** The record's columns for a start rejected before admission. */
export function rejectionPatch(
  failure: FailureKind,
  message: string,
  recovery: RecoveryKind = "retry_same",
): RecordPatch {
  return {
    admission: "rejected_pre_admission",
    state: "failed",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: failure,
    recovery_kind: recovery,
    message,
  };
}

/** The offline runner's rejection, written only if the record is still `existing` (`StateStore.decide`). */
export async function recordRejection(
  store: StateStore,
  existing: AdmissionRecord | undefined,
  principal: Principal,
  req: AdmissionRequest,
  runnerId: string,
  failure: FailureKind,
): Promise<undefined | typeof RECORD_CHANGED> {
  const patch = rejectionPatch(failure, "The project's Runner was offline; nothing was started.");
  return await store.decide(req.run_id, existing, async (tx) => {
    if (existing) await store.update(req.run_id, patch, { tx });
    else await insertRejection(store, tx, principal, req, runnerId, failure, patch);
    return undefined;
  });
}

async function insertRejection(
  store: StateStore,
  tx: StateQueries,
  principal: Principal,
  req: AdmissionRequest,
  runnerId: string,
  failure: FailureKind,
  patch: RecordPatch,
): Promise<void> {
  await store.insert(
    {
      run_id: req.run_id,
      principal_id: principal.id,
      project_id: req.project_id,
      provider_id: req.provider_id,
      runner_id: runnerId,
      intent_fingerprint: req.intent_fingerprint,
      agent_instance_id: null,
      provider_instance_id: null,
      store_id: null,
      admission: "rejected_pre_admission",
      state: "failed",
      execution_state: "not_started",
      stop_reason: null,
      failure_kind: failure,
      recovery_kind: "retry_same",
      message: patch.message ?? null,
    },
    tx,
  );
}

/**
 * Write a rejection before admission over this start's `sent` record, in one transaction on the row read
 * FOR UPDATE — unless the record settled while the start was out (another instance closed it as never
 * admitted, or another send of it was admitted): then it is left as it is. Null when the rejection was
 * written, or the record is a rejection already (the same answer: nothing started, retry the same key);
 * otherwise the record as it is, to answer from.
 */
export async function rejectUnlessSettled(
  store: StateStore,
  runId: string,
  patch: RecordPatch,
): Promise<AdmissionRecord | null> {
  return await store.transaction(async (tx) => {
    const rec = await store.lock(tx, runId);
    if (rec === undefined || rec.admission === "rejected_pre_admission") return null;
    if (rec.admission !== "sent" || isTerminalState(rec.state)) return rec;
    await store.update(runId, patch, { tx });
    return null;
  });
}
