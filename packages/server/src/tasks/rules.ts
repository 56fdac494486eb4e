/**
 * The managed path's decisions (design §10), read-only: whether a claim is current, and whether some run of
 * a task blocks a new attempt. tasks/service.ts asks them inside its transactions and does the writing; the
 * README's "Managed tasks" section is the long form.
 *
 * - A claim = (task, attempt, assignee, fence, controller_generation). It is current when the task is open,
 *   the attempt is the task's current one and still active, assignee, fence and generation match, and its
 *   lease is live. Anything else is `stale_claim`: nothing recorded, nothing sent.
 * - A new attempt is refused while any run of the task is starting / running / waiting_permission, or lost
 *   and not yet explicitly superseded (`supersede_uncertain_run`): a lease is not proof that the work stopped.
 */
import type { RunState } from "@webcodex/protocol";
import type { ApiError, ApiErrorCode } from "../runs/api.js";
import type { StateQueries } from "../state/engine.js";
import type { AdmissionRecord } from "../state/record.js";
import type { StateStore } from "../state/store.js";
import type { Claim } from "./claim.js";
import type { AttemptRow, TaskRow, TaskStore } from "./store.js";
import { iso } from "./views.js";

/** Run states that block a new attempt or a close: the work may still be going on. */
const ACTIVE_RUN_STATES: ReadonlySet<RunState> = new Set(["starting", "running", "waiting_permission"]);

export function taskError(code: ApiErrorCode, message: string, recovery_kind: ApiError["recovery_kind"]): ApiError {
  return { code, message, recovery_kind };
}

/**
 * The claim's attempt when the claim is current on `task` (lease live at `nowMs`, fence and generation
 * match), else why not. `attempt` is the stored row the claim names, if any.
 */
export function currentAttempt(
  task: TaskRow,
  attempt: AttemptRow | undefined,
  claim: Claim,
  nowMs: number,
): AttemptRow | ApiError {
  if (!attempt || attempt.task_id !== task.task_id) {
    return taskError("not_found", `No attempt ${claim.attempt_id} on task ${task.task_id}.`, "none");
  }
  if (task.state === "closed") return taskError("stale_claim", `Task ${task.task_id} is closed.`, "none");
  if (attempt.assignee !== claim.assignee) {
    return taskError("stale_claim", "The assignee does not hold this attempt.", "reconcile");
  }
  if (attempt.fence !== claim.fence || attempt.attempt_id !== task.current_attempt_id || attempt.state !== "active") {
    return taskError(
      "stale_claim",
      `Fence ${claim.fence} is not current for task ${task.task_id} (current fence ${task.last_fence}); nothing was started.`,
      "reconcile",
    );
  }
  if (attempt.controller_generation !== claim.controller_generation) {
    return taskError(
      "stale_claim",
      `Controller generation ${claim.controller_generation} is not current (current ${attempt.controller_generation}); nothing was started.`,
      "reconcile",
    );
  }
  if (attempt.lease_expires_ms <= nowMs) {
    return taskError(
      "stale_claim",
      `The lease of attempt ${attempt.attempt_id} expired at ${iso(attempt.lease_expires_ms)}; nothing was started. Renew it (renew_attempt_ref) or reconcile.`,
      "reconcile",
    );
  }
  return attempt;
}

/**
 * Whether any run of the task blocks a new attempt: active (the work may be going on whatever the
 * lease says) or lost and not superseded. `supersede` may name exactly one such lost run. `q`: the
 * transaction that locked the task and will write the attempt.
 */
export async function blockingRun(
  tasks: TaskStore,
  records: StateStore,
  task: TaskRow,
  supersede: string | undefined,
  q: StateQueries,
): Promise<ApiError | null> {
  const superseded = new Set(
    (await tasks.attemptsOf(task.task_id, q)).map((a) => a.superseded_run_id).filter((r): r is string => r !== null),
  );
  const bindings = await tasks.bindingsOf(task.task_id, q);
  const withRecords = [];
  for (const b of bindings) withRecords.push({ binding: b, rec: await records.get(b.run_id, q) });
  const bound = withRecords.filter(
    (x): x is { binding: (typeof x)["binding"]; rec: AdmissionRecord } => x.rec !== undefined,
  );
  const lost = bound.filter((x) => x.rec.state === "lost" && !superseded.has(x.rec.run_id));
  if (supersede !== undefined && !lost.some((x) => x.rec.run_id === supersede)) {
    return taskError(
      "invalid_input",
      "supersede_uncertain_run must name a lost, not yet superseded run of this task.",
      "fix_input",
    );
  }
  const active = bound.find((x) => ACTIVE_RUN_STATES.has(x.rec.state));
  if (active) {
    return taskError(
      "claim_conflict",
      `Run ${active.rec.run_id} of attempt ${active.binding.attempt_id} is ${active.rec.state}; a lease expiry does not prove the work stopped. Observe or cancel it, then reconcile_agent_task_coding_run.`,
      "wait",
    );
  }
  const uncertain = lost.find((x) => x.rec.run_id !== supersede);
  if (uncertain) {
    return taskError(
      "claim_conflict",
      `Run ${uncertain.rec.run_id} of attempt ${uncertain.binding.attempt_id} is lost: its prompt may have run and its outcome is unknown. Inspect the project tree, then start the attempt with supersede_uncertain_run: "${uncertain.rec.run_id}".`,
      "reconcile",
    );
  }
  return null;
}
