/**
 * The words of a start that was refused or whose outcome is unknown, told once for the admission steps that
 * answer them (runs/admission.ts, runs/start-settle.ts, runs/start-answer.ts): the Server's own refusals and its
 * answer to each Runner rejection before admission, with the failure kind and recovery the record keeps. Fixed
 * words: a Runner's own error text never reaches the caller.
 */
import {
  CAPACITY_REASONS,
  type CapacityReason,
  type FailureKind,
  type RecoveryKind,
  type RunnerErrorCode,
} from "@webcodex/protocol";
import type { ApiErrorCode } from "./api.js";

/** Both the Server's own check and the Runner's rejection say the same: it is the operator's setting. */
export const PROJECT_NOT_WRITABLE_MESSAGE =
  "The project's Runner does not allow patches; nothing was started. An operator must set allow_patch = true for this project in the Runner's config.";

export const START_OUTCOME_UNKNOWN_MESSAGE =
  "The start was sent to the Runner, but the Server's state database failed before the answer was recorded: the run may be running. Retry the same call (same idempotency key) once the database is back: it returns that run, and nothing is started twice.";
export const START_IN_PROGRESS_MESSAGE =
  "A start with this idempotency key is still in progress; nothing new was started. Retry the same call shortly: it returns that run.";

/** A principal the Server does not route to the project's same-user Runner (`shared_user_principals`). */
export function sharedUserRefusal(projectId: string, principalId: string): string {
  return (
    `Project ${projectId}'s Runner runs its agents as its own OS user, and this Server gives it only the runs of ` +
    `the principals listed in its runners[].shared_user_principals; principal ${principalId} is not listed. ` +
    "Nothing was started. An operator must list the principal there, or set run_as on that Runner's agents."
  );
}

/** The Server's answer to one Runner rejection before admission, and what the record keeps of it. */
export interface RunnerRejection {
  code: ApiErrorCode;
  failure: FailureKind;
  recovery: RecoveryKind;
  message: string;
  reason?: CapacityReason;
}

/** Pre-admission Runner rejections: API code, failure kind for the record, recovery. */
export const RUNNER_REJECTIONS: Partial<Record<RunnerErrorCode, RunnerRejection>> = {
  stale_runner: {
    code: "stale_runner",
    failure: "runner_restarted",
    recovery: "retry_same",
    message:
      "The Runner restarted between routing and dispatch; nothing was started. Retry with the same idempotency key.",
  },
  stale_provider: {
    code: "stale_provider",
    failure: "stale_provider",
    recovery: "retry_same",
    message:
      "The provider restarted between routing and dispatch; nothing was started. Retry with the same idempotency key.",
  },
  capacity: {
    code: "capacity",
    failure: "capacity",
    recovery: "retry_same",
    message: "The Runner is running as many runs as it allows; nothing was started. Retry with the same key later.",
  },
  unknown_project: {
    code: "runner_unavailable",
    failure: "never_admitted",
    recovery: "retry_same",
    message: "The Runner does not serve this project right now; nothing was started.",
  },
  project_not_writable: {
    code: "forbidden",
    failure: "never_admitted",
    recovery: "none",
    message: PROJECT_NOT_WRITABLE_MESSAGE,
  },
  unknown_provider: {
    code: "provider_unavailable",
    failure: "never_admitted",
    recovery: "retry_same",
    message: "The Runner does not offer this provider right now; nothing was started.",
  },
  invalid_request: {
    code: "invalid_input",
    failure: "never_admitted",
    recovery: "fix_input",
    message: "The Runner rejected the run request as invalid; nothing was started.",
  },
};

/** What a caller is told for each capacity reason a Runner gives (protocol capacity.ts): whether retrying helps. */
const CAPACITY_ADVICE: Record<CapacityReason, string> = {
  runner_full: "Retry with the same key when one of the Runner's runs has ended.",
  pool_busy: "Retry with the same key when one of the Runner's runs has ended.",
  caller_limit: "Retry with the same key when one of your own runs on this Runner has ended.",
  pool_recycling: "Retry with the same key in a few seconds.",
  pool_bound:
    "Retrying soon will not help: ask the Runner's operator to add users to the agent's run_as pool or to release one (webcodex-runner pool release).",
};

/** The Server's answer to a Runner's `capacity` refusal that says why: its fixed words, never the Runner's text. */
export function capacityRejection(reason: CapacityReason): RunnerRejection & { reason: CapacityReason } {
  const { summary, recovery } = CAPACITY_REASONS[reason];
  return {
    code: "capacity",
    failure: "capacity",
    recovery,
    message: `${summary} Nothing was started. ${CAPACITY_ADVICE[reason]}`,
    reason,
  };
}
