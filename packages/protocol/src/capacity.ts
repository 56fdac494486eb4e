/**
 * Why a Runner refused a start as `capacity` (design §4.2): a closed set, each with a fixed, secret-free
 * summary and whether retrying the same start can help. The Runner sends only the reason (the `error`
 * frame's optional `capacity_reason`); the Server words its answer from this table, never from Runner text.
 */
import { z } from "zod";
import type { RecoveryKind } from "./vocab.js";

export const CAPACITY_REASONS = {
  /** `max_concurrent_runs` runs are live. */
  runner_full: {
    summary: "The Runner is full: it is already running as many runs as it allows.",
    recovery: "retry_same",
  },
  /** Every run_as pool user of the agent serves a live run or is being cleaned up after one. */
  pool_busy: {
    summary: "Every run_as pool user of this agent is serving a live run.",
    recovery: "retry_same",
  },
  /** The caller already holds `max_users_per_caller` pool users, and each serves one of its live runs. */
  caller_limit: {
    summary:
      "This caller already holds as many run_as pool users of this agent as one caller may (max_users_per_caller), and each is serving one of its live runs.",
    recovery: "retry_same",
  },
  /** A pool user its caller left idle is being recycled for this caller and was not ready in time. */
  pool_recycling: {
    summary: "A run_as pool user left idle by another caller is being cleaned for this caller.",
    recovery: "retry_same",
  },
  /** Users are free, but each serves another caller and none has been idle long enough to be recycled. */
  pool_bound: {
    summary:
      "Every free run_as pool user of this agent serves another caller (a user never serves two callers), and none has been idle long enough (binding_idle_days) to be recycled.",
    recovery: "none",
  },
} as const satisfies Record<string, { summary: string; recovery: RecoveryKind }>;

export type CapacityReason = keyof typeof CAPACITY_REASONS;
export const CapacityReasonSchema = z.enum(Object.keys(CAPACITY_REASONS) as [CapacityReason, ...CapacityReason[]]);
