/**
 * The answer vocabulary of every tool and of the run core behind them: the closed set of tool-level error codes,
 * the secret-free `ApiError` and the `ApiResult` every service returns, and each code's default recovery advice.
 * It sits below the tool modules (runs/, tasks/, sessions/) and the MCP router so that all of them share one
 * definition without importing each other.
 */
import type { ApplyRefusalReason, CapacityReason, RecoveryKind } from "@webcodex/protocol";
import type { Scope } from "../principals/principal.js";

/** Closed set of tool-level error codes (documented in the README). */
export const API_ERROR_CODES = [
  "unauthorized",
  "forbidden",
  "not_found",
  "invalid_input",
  "idempotency_conflict",
  "runner_unavailable",
  "provider_unavailable",
  "stale_runner",
  "stale_provider",
  "capacity",
  "start_in_progress",
  /**
   * A start whose `run.start` went out (or may have) when the state database failed before its answer
   * was recorded: the run may be running. The same-key retry, once the database is back, returns it.
   */
  "start_outcome_unknown",
  "invalid_observation_token",
  "too_many_observers",
  /** Managed path (design §10): the presented claim is not the task's current live claim. */
  "stale_claim",
  /** Managed path: a live attempt, or an active/uncertain Run, blocks what was asked. */
  "claim_conflict",
  /** Workflow sessions: expected_version is not the session's current version. */
  "version_conflict",
  /** Workflow sessions: context_session_version is not the context session's current version. */
  "context_version_conflict",
  /** Continuation (design §17): the parent run was already continued under another idempotency key. */
  "continuation_conflict",
  /** Continuation: the provider's agent advertises neither session/resume nor session/load. */
  "continuation_unsupported",
  /** apply_coding_agent_changes (design §16): refused, nothing changed; `apply_refusal` says why. */
  "apply_refused",
  /** The Server's state database cannot be reached (state/engine.ts StateUnavailableError); nothing half-written. */
  "state_unavailable",
  /** Too many operations already wait for the state database (StateBusyError). */
  "state_busy",
  "internal",
] as const;
export type ApiErrorCode = (typeof API_ERROR_CODES)[number];

export interface ApiError {
  code: ApiErrorCode;
  /** Secret-free, says what was wrong and what to do. */
  message: string;
  recovery_kind: RecoveryKind;
  /** On a `forbidden` for want of scopes: exactly the scopes this token lacks for the call (principals/authority.ts). */
  missing_scopes?: Scope[];
  /** On a `capacity` refusal the Runner explained: why (protocol capacity.ts; its recovery_kind says whether retrying helps). */
  capacity_reason?: CapacityReason;
  /** On `apply_refused`: why (protocol APPLY_REFUSALS), and for `dirty_tree` the uncommitted paths (to the caller only). */
  apply_refusal?: ApplyRefusalReason;
  paths?: string[];
  paths_truncated?: boolean;
}

export type ApiResult<T> = { ok: true; value: T } | { ok: false; error: ApiError };

/** Default recovery advice for codes raised by this layer. */
const RECOVERY_FOR: Record<ApiError["code"], RecoveryKind> = {
  unauthorized: "none",
  forbidden: "none",
  not_found: "none",
  invalid_input: "fix_input",
  idempotency_conflict: "fix_input",
  runner_unavailable: "retry_same",
  provider_unavailable: "fix_input",
  stale_runner: "retry_same",
  stale_provider: "retry_same",
  capacity: "retry_same",
  start_in_progress: "retry_same",
  start_outcome_unknown: "retry_same",
  invalid_observation_token: "reobserve",
  too_many_observers: "wait",
  stale_claim: "reconcile",
  claim_conflict: "wait",
  version_conflict: "reobserve",
  context_version_conflict: "reobserve",
  continuation_conflict: "fix_input",
  continuation_unsupported: "none",
  apply_refused: "fix_input",
  state_unavailable: "retry_same",
  state_busy: "retry_same",
  internal: "none",
};

export function apiError(code: ApiError["code"], message: string): ApiError {
  return { code, message, recovery_kind: RECOVERY_FOR[code] };
}
