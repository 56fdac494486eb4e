/**
 * Startup recovery (design §4.4). Runs once, before the Runner connects
 * anywhere or accepts work, in one transaction over the rows a previous
 * process left behind:
 *
 *   phase admitted | setup      → failed / not_started, failure_kind runner_restarted, recovery_kind none
 *                                 (the prompt was provably never written: the barrier commit precedes it)
 *   phase dispatch_barrier      → lost / outcome_unknown, failure_kind transport_lost, recovery_kind reconcile
 *                                 (the prompt may have run; it is never re-sent)
 *   phase terminal              → unchanged (its in-memory events are gone: observers see history_lost)
 *
 * Why `transport_lost` for the lost rows: its fixed summary ("the connection
 * to the agent was lost after the prompt was dispatched") is true of a Runner
 * crash after the barrier, whereas `runner_restarted` promises that no prompt
 * was dispatched — which is exactly what we cannot prove here.
 *
 * Recovered rows keep their child_pgid/start time: the reaper uses them
 * and clears them once the group is gone.
 */

import type { SqliteDispatchStore } from "./dispatch-store.js";
import type { DispatchRow, TerminalUpdate } from "./types.js";

export const RECOVERED_NOT_STARTED_MESSAGE =
  "The Runner restarted before the prompt was dispatched; no prompt was dispatched.";
export const RECOVERED_LOST_MESSAGE =
  "The Runner restarted after the prompt may have been dispatched; the outcome cannot be proved and the prompt will not be sent again.";

export interface RecoveredRun {
  run_id: string;
  from_phase: DispatchRow["phase"];
  state: "failed" | "lost";
}

/** The terminal update recovery applies to a row found in `phase`, or null if it stays as it is. */
export function recoveryUpdateFor(
  row: Pick<DispatchRow, "phase" | "ignored_updates" | "last_seq">,
): TerminalUpdate | null {
  switch (row.phase) {
    case "admitted":
    case "setup":
      return {
        state: "failed",
        execution_state: "not_started",
        stop_reason: null,
        failure_kind: "runner_restarted",
        recovery_kind: "none",
        message: RECOVERED_NOT_STARTED_MESSAGE,
        ignored_updates: row.ignored_updates,
        last_seq: row.last_seq,
      };
    case "dispatch_barrier":
      return {
        state: "lost",
        execution_state: "outcome_unknown",
        stop_reason: null,
        failure_kind: "transport_lost",
        recovery_kind: "reconcile",
        message: RECOVERED_LOST_MESSAGE,
        ignored_updates: row.ignored_updates,
        last_seq: row.last_seq,
      };
    case "terminal":
      return null;
    default: {
      const never: never = row.phase;
      throw new Error(`unknown phase ${String(never)}`);
    }
  }
}

/** Close every non-terminal row left by a previous Runner process. Atomic. */
export function recoverStore(store: SqliteDispatchStore): RecoveredRun[] {
  return store.transaction(() => {
    const recovered: RecoveredRun[] = [];
    for (const row of store.listNonTerminal()) {
      const update = recoveryUpdateFor(row);
      if (!update) continue;
      store.markTerminal(row.run_id, update);
      recovered.push({ run_id: row.run_id, from_phase: row.phase, state: update.state as "failed" | "lost" });
    }
    return recovered;
  });
}
