/**
 * Exit codes of every `webcodex` command. A followed run exits with the code
 * of its terminal state, so scripts can branch on the outcome.
 */
import type { RunState } from "./wire.js";

export const EXIT = {
  /** The run completed (or the command did what it was asked). */
  ok: 0,
  /** The run failed, or the command could not talk to the Server. */
  failed: 1,
  /** The command line was wrong. */
  usage: 2,
  /** The run is lost: its outcome cannot be proved. */
  lost: 3,
  /**
   * The agent asked for a permission and the Runner's permission deadline answered it `cancelled`
   * (`failure_kind = permission_timeout`): WebCodex never grants permissions, so nobody pressed Ctrl-C.
   */
  permissionDeadline: 4,
  /** The run reached its own deadline (`timeout_secs`) and the agent confirmed the cancellation (`run_timeout`). */
  runDeadline: 5,
  /** The run was cancelled, or following was interrupted (128 + SIGINT). */
  cancelled: 130,
} as const;

/** Exit code for a run last seen in `state` (with its failure kind); a run still in progress maps to 0. */
export function exitCodeForState(state: RunState, failureKind?: string | null): number {
  if (state === "cancelled" && failureKind === "permission_timeout") return EXIT.permissionDeadline;
  if (state === "cancelled" && failureKind === "run_timeout") return EXIT.runDeadline;
  switch (state) {
    case "completed":
      return EXIT.ok;
    case "failed":
      return EXIT.failed;
    case "lost":
      return EXIT.lost;
    case "cancelled":
      return EXIT.cancelled;
    case "starting":
    case "running":
    case "waiting_permission":
      return EXIT.ok;
    default: {
      const never: never = state;
      return never;
    }
  }
}
