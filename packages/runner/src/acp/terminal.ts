/**
 * Terminal outcomes of a run as fixed, secret-free texts (design §3):
 * FAILURE_SUMMARIES, the stage, and at most an option id, a source variable
 * name or a stop reason. Never provider text, and never a JSON-RPC code: those
 * stay in the Runner's local log (the `rpc_code` field).
 */
import {
  type ExecutionState,
  FAILURE_SUMMARIES,
  type FailureKind,
  MAX_MESSAGE_LENGTH,
  mapStopReason,
  type RecoveryKind,
  type RunState,
  type SetupStage,
  type StopReason,
} from "@webcodex/protocol";
import type { RequestOutcome } from "./session.js";

/** Why session/cancel was sent: a caller's cancel, the run deadline, or a graceful Runner stop. */
export type CancelReason = "cancel" | "deadline" | "shutdown";
/** Why a permission request was answered `cancelled`. */
export type PermissionAnswer = "permission_deadline" | CancelReason;

export interface Terminal {
  state: RunState;
  execution_state: ExecutionState;
  stop_reason: StopReason | null;
  failure_kind: FailureKind | null;
  recovery_kind: RecoveryKind;
  message: string;
}

export const NO_PROMPT = "No prompt was dispatched.";
export const SHUTDOWN_CONFIRMED =
  "The Runner was stopping; it cancelled the run and the agent confirmed the cancellation.";
export const SHUTDOWN_UNCONFIRMED =
  "The Runner was stopping; it cancelled the run, but the agent did not confirm in time and was stopped.";
export const MAY_HAVE_RUN = "The prompt may have run; its outcome is unknown.";

/** A terminal message within the protocol's bound (a longer one would make every summary of the run invalid). */
export function capMessage(message: string): string {
  if (message.length <= MAX_MESSAGE_LENGTH) return message;
  let end = MAX_MESSAGE_LENGTH - 1;
  // Do not leave half a surrogate pair at the cut.
  const last = message.charCodeAt(end - 1);
  if (last >= 0xd800 && last <= 0xdbff) end--;
  return `${message.slice(0, end)}…`;
}

/** failed / not_started, naming the stage. */
export function notStarted(
  kind: FailureKind,
  stage: SetupStage,
  detail = "",
  recovery: RecoveryKind = "none",
): Terminal {
  const extra = detail ? ` ${detail}` : "";
  return {
    state: "failed",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: kind,
    recovery_kind: recovery,
    message: capMessage(`${FAILURE_SUMMARIES[kind]}${extra} Stage: ${stage}. ${NO_PROMPT}`),
  };
}

/** lost / outcome_unknown after the barrier. */
export function lost(kind: FailureKind | null, lead: string): Terminal {
  return {
    state: "lost",
    execution_state: "outcome_unknown",
    stop_reason: null,
    failure_kind: kind,
    recovery_kind: "reconcile",
    message: capMessage(`${lead} Stage: prompt. ${MAY_HAVE_RUN}`),
  };
}

/** cancelled / not_started: the cancel (or shutdown) came before the barrier. */
export function cancelledBeforeDispatch(stage: SetupStage): Terminal {
  return {
    state: "cancelled",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: null,
    recovery_kind: "none",
    message: `Cancelled before the prompt was dispatched. Stage: ${stage}. ${NO_PROMPT}`,
  };
}

/** The terminal outcome once the prompt was dispatched: correlated answer, JSON-RPC error, fault or expired cancel grace. */
export function promptTerminal(
  answered: RequestOutcome<{ stopReason: string }> | { kind: "grace" },
  why: { cancelReason: CancelReason | null; permissionAnswered: PermissionAnswer | null },
): Terminal {
  const deadline = why.cancelReason === "deadline";
  switch (answered.kind) {
    case "ok": {
      const mapped = mapStopReason(String(answered.value?.stopReason));
      let message: string;
      let failureKind = mapped.failure_kind;
      if (mapped.state === "completed") message = "The agent completed the turn.";
      else if (mapped.state === "cancelled") {
        if (why.permissionAnswered === "permission_deadline") {
          message =
            "The agent ended the turn as cancelled after its permission request was answered 'cancelled' because the permission deadline expired.";
          failureKind = "permission_timeout";
        } else if (deadline) {
          message = `${FAILURE_SUMMARIES.run_timeout} The agent confirmed the cancellation.`;
          failureKind = "run_timeout";
        } else if (why.cancelReason === "cancel") {
          message = "A cancel was requested; the agent confirmed the cancellation.";
        } else if (why.cancelReason === "shutdown") {
          message = SHUTDOWN_CONFIRMED;
        } else message = "The agent ended the turn as cancelled.";
      } else if (mapped.failure_kind === "stop_reason") {
        message = `${FAILURE_SUMMARIES.stop_reason} Stop reason: ${mapped.stop_reason}.`;
      } else message = `${FAILURE_SUMMARIES.protocol_violation} The stop reason is not one ACP v1 defines.`;
      return { ...mapped, failure_kind: failureKind, message: capMessage(message) };
    }
    case "rpc_error":
      return {
        state: "failed",
        execution_state: "completed",
        stop_reason: null,
        failure_kind: "prompt_error",
        recovery_kind: "none",
        message: capMessage(`${FAILURE_SUMMARIES.prompt_error} Stage: prompt.`),
      };
    case "fault":
      return lost(answered.fault, FAILURE_SUMMARIES[answered.fault]);
    case "grace":
      if (deadline) {
        return lost(
          "run_timeout",
          `${FAILURE_SUMMARIES.run_timeout} The agent did not confirm the cancellation in time.`,
        );
      }
      if (why.cancelReason === "shutdown") return lost("transport_lost", SHUTDOWN_UNCONFIRMED);
      return lost(null, "A cancel was requested; the agent did not confirm it in time.");
  }
}
