/**
 * The managed path (design §10): AgentTask attempts with leases and fences,
 * layered over the one CodingAgentRun admission path (runs/runs.ts `admit`).
 * It adds ownership, never a second provider lifecycle.
 *
 * Rules (the README's "Managed tasks" section is the long form):
 * - Everything under a task belongs to its creating principal; anyone else,
 *   or a principal that lost the project grant, gets `not_found`.
 * - One current attempt per task. A new attempt is refused while the current
 *   lease is live, and while a run of the task blocks it (tasks/rules.ts
 *   `blockingRun`: a lease is not proof that the work stopped).
 * - A claim is checked by tasks/rules.ts `currentAttempt`. Renewing a live
 *   lease keeps the claim; re-taking an expired one (same ref, nothing newer)
 *   bumps the generation, so an older holder's ref goes stale.
 * - Starting a run: check the claim → derive the run id from the attempt →
 *   admit through the run core, whose single transaction re-checks the claim
 *   and writes the Attempt→Run binding together with the admission record
 *   before `run.start` is sent. A repeated start with a current claim meets
 *   the bound run (`replayed: true`).
 * - Run completion is the attempt's run outcome, never the task's: only
 *   `close_agent_task` closes a task.
 *
 * Atomicity (state/engine.ts): every decision is read and written in one engine transaction. Decisions
 * about an existing task (a new attempt, a renewal, the claim inside admission, a close) read the task
 * with `lockTask` (SELECT … FOR UPDATE), so concurrent claimants on any Server instance take turns on
 * that row and each sees the previous one's commit. A create, whose task may not exist yet, runs under
 * the advisory lock of its principal (`createLock`), which also keeps the open-task cap exact.
 */
import { isTerminalState } from "@webcodex/protocol";
import type { Logger } from "pino";
import { serverFailpoint } from "../failpoints.js";
import { missingScopes, START_SCOPES, startRefusal } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import type { AdmissionHooks, ApiError, ApiErrorCode, ApiResult, RunAdmission, StartOutput } from "../runs/api.js";
import { continuationLinks } from "../runs/continuation.js";
import { intentFingerprint } from "../runs/identity.js";
import type { StateQueries } from "../state/engine.js";
import type { StateStore } from "../state/store.js";
import { TaskAnnouncer, type TaskChangeListener } from "./changes.js";
import {
  AttemptRefs,
  authorityFingerprint,
  type Claim,
  deriveTaskId,
  deriveTaskRunId,
  newAttemptId,
  taskRequestFingerprint,
} from "./claim.js";
import { blockingRun, currentAttempt, taskError } from "./rules.js";
import {
  type AttemptRow,
  MAX_ATTEMPTS_PER_TASK,
  MAX_OPEN_TASKS_PER_PRINCIPAL,
  type TaskOutcome,
  type TaskRow,
  type TaskStore,
} from "./store.js";
import {
  type AttemptClaimView,
  type AttemptView,
  claimView,
  iso,
  type RunOutcomeView,
  runOutcomeView,
  type TaskView,
  taskView,
} from "./views.js";

export const DEFAULT_LEASE_SECS = 600;
// The lease bounds are the tools' contract (the protocol package's tools/tasks.ts).
export { MAX_LEASE_SECS, MIN_LEASE_SECS } from "@webcodex/protocol";

export interface CreateTaskInput {
  project_id: string;
  instruction: string;
  idempotency_key: string;
  title?: string;
}

export interface StartAttemptInput {
  task_id: string;
  assignee: string;
  lease_secs?: number;
  renew_attempt_ref?: string;
  supersede_uncertain_run?: string;
}

export type ClaimSelector = { attempt_ref: string } | Claim;

export interface StartTaskRunInput {
  project_id: string;
  provider_id: string;
  claim: ClaimSelector;
  config?: Record<string, string | boolean>;
  timeout_secs?: number;
  /** Only for a `worktree` project (design §16): what the run's checkout starts from. */
  base_ref?: string;
  /** The terminal run this one continues (design §17); the run core's admission checks and links it. */
  continue_run_id?: string;
  /**
   * The workflow-session recorder check, asked once the caller's authority is decided; its answer is the
   * recorder link, written in the same transaction as the binding.
   */
  recorder?: () => Promise<ApiResult<NonNullable<AdmissionHooks["bind"]>>>;
}

export interface TaskServiceOptions {
  tasks: TaskStore;
  records: StateStore;
  admission: RunAdmission;
  logger: Logger;
  /** Wall clock (ms); injectable for tests. */
  now?: () => number;
  /** Told of each task change of tasks/changes.ts inside its transaction (the webhooks' outbox writer). */
  onChange?: TaskChangeListener;
}

function fail<T>(code: ApiErrorCode, message: string, recovery_kind: ApiError["recovery_kind"]): ApiResult<T> {
  return { ok: false, error: { code, message, recovery_kind } };
}

const NOT_FOUND_TASK = (id: string) => taskError("not_found", `No task ${id}.`, "none");

/** What the scope refusals of the task tools name (principals/authority.ts). */
const TASKS_WHAT = "Using agent tasks";
/** The advisory lock (state/engine.ts `{lock}`) a principal's task creations take turns on. */
export function createLock(principalId: string): string {
  return `agent_tasks.create:${principalId}`;
}

export class TaskService {
  readonly #tasks: TaskStore;
  readonly #records: StateStore;
  readonly #admission: RunAdmission;
  readonly #log: Logger;
  readonly #now: () => number;
  readonly #refs: AttemptRefs;
  readonly #secret: Buffer;
  readonly #announcer: TaskAnnouncer;

  constructor(opts: TaskServiceOptions) {
    this.#tasks = opts.tasks;
    this.#records = opts.records;
    this.#admission = opts.admission;
    this.#log = opts.logger;
    this.#now = opts.now ?? Date.now;
    this.#secret = opts.records.serverSecret;
    this.#refs = new AttemptRefs(this.#secret);
    this.#announcer = new TaskAnnouncer({
      tasks: opts.tasks,
      log: opts.logger,
      now: this.#now,
      listener: opts.onChange,
    });
  }

  /** At Server start: delete closed tasks past retention; with a change listener, start the expiry sweep. */
  async start(): Promise<void> {
    this.#announcer.start();
    const pruned = await this.#tasks.prune();
    if (pruned > 0) this.#log.info({ pruned }, "closed tasks past retention deleted");
  }

  /** Stop the expiry sweep (and wait for one in progress). */
  async stop(): Promise<void> {
    await this.#announcer.stop();
  }

  /** One expiry sweep now (what the sweep's timer does; returns how many expiries it announced). */
  sweepExpiries(): Promise<number> {
    return this.#announcer.sweep();
  }

  // ---- authority ----------------------------------------------------------------------------

  /** coding_agent:run + project:write + the exact project grant (principals/authority.ts words the refusal). */
  #authorize(principal: Principal, projectId: string): ApiError | null {
    return startRefusal(principal, projectId, TASKS_WHAT);
  }

  /** coding_agent:run + project:write, before a task is looked up (its project's grant is #owned's). */
  #mayUseTasks(principal: Principal): ApiError | null {
    return missingScopes(principal, START_SCOPES, TASKS_WHAT);
  }

  /**
   * The task when this principal owns it and may still work on its project; else not found. Read with
   * `lockTask` in `tx`: the caller decides on it in that transaction.
   */
  async #owned(principal: Principal, taskId: string, tx: StateQueries): Promise<TaskRow | ApiError> {
    const task = await this.#tasks.lockTask(taskId, tx);
    if (!task || task.principal_id !== principal.id) return NOT_FOUND_TASK(taskId);
    if (this.#authorize(principal, task.project_id) !== null) return NOT_FOUND_TASK(taskId);
    return task;
  }

  // ---- create -------------------------------------------------------------------------------

  async createTask(principal: Principal, input: CreateTaskInput): Promise<ApiResult<TaskView & { replayed: boolean }>> {
    const denied = this.#authorize(principal, input.project_id);
    if (denied) return { ok: false, error: denied };
    const taskId = deriveTaskId(this.#secret, principal.id, input.idempotency_key);
    const title = input.title ?? "";
    const fingerprint = taskRequestFingerprint({ project_id: input.project_id, instruction: input.instruction, title });
    // Atomic by the principal's advisory lock: the same key twice creates one task, and the cap holds.
    return await this.#tasks.transaction(
      async (tx) => {
        const existing = await this.#tasks.task(taskId, tx);
        if (existing) {
          if (existing.request_fingerprint !== fingerprint) {
            return fail(
              "idempotency_conflict",
              "This idempotency_key already created a task with a different project, instruction or title; use a new key or repeat the original request.",
              "fix_input",
            );
          }
          return { ok: true, value: { ...taskView(existing), replayed: true } };
        }
        if ((await this.#tasks.countOpenTasks(principal.id, tx)) >= MAX_OPEN_TASKS_PER_PRINCIPAL) {
          return fail(
            "capacity",
            `This principal already has ${MAX_OPEN_TASKS_PER_PRINCIPAL} open tasks; close some with close_agent_task first.`,
            "fix_input",
          );
        }
        const row = await this.#tasks.insertTask(
          {
            task_id: taskId,
            principal_id: principal.id,
            project_id: input.project_id,
            title,
            instruction: input.instruction,
            instruction_bytes: Buffer.byteLength(input.instruction, "utf8"),
            request_fingerprint: fingerprint,
          },
          tx,
        );
        this.#log.info({ task_id: taskId, principal_id: principal.id, project_id: input.project_id }, "task created");
        return { ok: true, value: { ...taskView(row), replayed: false } };
      },
      { lock: createLock(principal.id) },
    );
  }

  // ---- attempts -----------------------------------------------------------------------------

  async startAttempt(
    principal: Principal,
    input: StartAttemptInput,
  ): Promise<ApiResult<AttemptClaimView & { renewed: boolean; superseded_run_id?: string }>> {
    const denied = this.#mayUseTasks(principal);
    if (denied) return { ok: false, error: denied };
    // Atomic by the task's row lock (#owned → lockTask): of two concurrent claimants one inserts the
    // attempt and commits; the other then reads its live lease and is refused.
    return await this.#tasks.transaction(async (tx) => {
      const task = await this.#owned(principal, input.task_id, tx);
      if ("code" in task) return { ok: false, error: task };
      if (task.state === "closed") {
        return fail("claim_conflict", `Task ${task.task_id} is closed; it takes no new attempts.`, "none");
      }
      const now = this.#now();
      const leaseMs = (input.lease_secs ?? DEFAULT_LEASE_SECS) * 1000;
      if (input.renew_attempt_ref !== undefined) return await this.#renew(task, input, now + leaseMs, tx);

      const current = task.current_attempt_id ? await this.#tasks.attempt(task.current_attempt_id, tx) : undefined;
      await this.#announcer.expiry(task, current, tx);
      if (current?.state === "active" && current.lease_expires_ms > now) {
        return fail(
          "claim_conflict",
          `Attempt ${current.attempt_id} holds a live lease until ${iso(current.lease_expires_ms)}; its holder may renew it (renew_attempt_ref), anyone else waits for it to expire.`,
          "wait",
        );
      }
      const blocked = await blockingRun(this.#tasks, this.#records, task, input.supersede_uncertain_run, tx);
      if (blocked) return { ok: false, error: blocked };
      if ((await this.#tasks.countAttempts(task.task_id, tx)) >= MAX_ATTEMPTS_PER_TASK) {
        return fail(
          "claim_conflict",
          `Task ${task.task_id} already had ${MAX_ATTEMPTS_PER_TASK} attempts; close it and create a new task.`,
          "none",
        );
      }
      const row = await this.#tasks.insertAttempt(
        {
          attempt_id: newAttemptId(),
          task_id: task.task_id,
          assignee: input.assignee,
          fence: task.last_fence + 1,
          lease_expires_ms: now + leaseMs,
          superseded_run_id: input.supersede_uncertain_run ?? null,
        },
        tx,
      );
      if (input.supersede_uncertain_run !== undefined) {
        this.#log.warn(
          { task_id: task.task_id, attempt_id: row.attempt_id, run_id: input.supersede_uncertain_run },
          "lost run explicitly superseded by a new attempt",
        );
      }
      this.#log.info({ task_id: task.task_id, attempt_id: row.attempt_id, fence: row.fence }, "attempt started");
      const view = this.#claimView(row);
      return {
        ok: true,
        value: {
          ...view,
          renewed: false,
          ...(row.superseded_run_id !== null ? { superseded_run_id: row.superseded_run_id } : {}),
        },
      };
    });
  }

  async #renew(
    task: TaskRow,
    input: StartAttemptInput,
    leaseExpiresMs: number,
    tx: StateQueries,
  ): Promise<ApiResult<AttemptClaimView & { renewed: boolean }>> {
    if (input.supersede_uncertain_run !== undefined) {
      return fail(
        "invalid_input",
        "supersede_uncertain_run starts a new attempt; it cannot be combined with renew_attempt_ref.",
        "fix_input",
      );
    }
    const claim = this.#refs.read(input.renew_attempt_ref ?? "");
    if (!claim) return fail("stale_claim", "renew_attempt_ref is not a valid attempt_ref.", "fix_input");
    if (claim.task_id !== task.task_id || claim.assignee !== input.assignee) {
      return fail("stale_claim", "renew_attempt_ref names another task or assignee.", "fix_input");
    }
    const attempt = await this.#tasks.attempt(claim.attempt_id, tx);
    if (
      !attempt ||
      attempt.attempt_id !== task.current_attempt_id ||
      attempt.state !== "active" ||
      attempt.fence !== claim.fence ||
      attempt.controller_generation !== claim.controller_generation
    ) {
      return fail(
        "stale_claim",
        "That claim is no longer the task's current one (a newer attempt or generation exists); reconcile the task.",
        "reconcile",
      );
    }
    const expired = attempt.lease_expires_ms <= this.#now();
    await this.#announcer.expiry(task, attempt, tx);
    await this.#tasks.renewAttempt(attempt.attempt_id, leaseExpiresMs, expired, tx);
    const row = (await this.#tasks.attempt(attempt.attempt_id, tx)) ?? attempt;
    this.#log.info(
      { task_id: task.task_id, attempt_id: row.attempt_id, generation: row.controller_generation, reclaimed: expired },
      "attempt lease renewed",
    );
    return { ok: true, value: { ...this.#claimView(row), renewed: true } };
  }

  #claimView(row: AttemptRow): AttemptClaimView {
    return claimView(row, this.#refs);
  }

  /**
   * The claim's task and attempt when the claim is current (tasks/rules.ts `currentAttempt`), the task
   * locked in `tx` so no other claim can be taken before `tx` ends.
   */
  async #checkClaim(
    principal: Principal,
    claim: Claim,
    tx: StateQueries,
  ): Promise<{ task: TaskRow; attempt: AttemptRow } | ApiError> {
    const task = await this.#owned(principal, claim.task_id, tx);
    if ("code" in task) return task;
    const attempt = currentAttempt(task, await this.#tasks.attempt(claim.attempt_id, tx), claim, this.#now());
    if ("code" in attempt) return attempt;
    return { task, attempt };
  }

  #resolveClaim(selector: ClaimSelector): Claim | ApiError {
    if ("attempt_ref" in selector) {
      return (
        this.#refs.read(selector.attempt_ref) ??
        taskError(
          "stale_claim",
          "attempt_ref is not a valid attempt_ref (forged, truncated or from another Server).",
          "fix_input",
        )
      );
    }
    return selector;
  }

  // ---- the run ------------------------------------------------------------------------------

  async startRun(
    principal: Principal,
    input: StartTaskRunInput,
  ): Promise<ApiResult<StartOutput & { task_id: string; attempt_id: string }>> {
    const denied = this.#authorize(principal, input.project_id);
    if (denied) return { ok: false, error: denied };
    let recorder: NonNullable<AdmissionHooks["bind"]> | undefined;
    if (input.recorder) {
      const checked = await input.recorder();
      if (!checked.ok) return checked;
      recorder = checked.value;
    }
    const claim = this.#resolveClaim(input.claim);
    if ("code" in claim) return { ok: false, error: claim };
    // A first look, to refuse early; the decision is the check inside the admission transaction (bind).
    const checked = await this.#tasks.transaction((tx) => this.#checkClaim(principal, claim, tx));
    if ("code" in checked) return { ok: false, error: checked };
    const { task, attempt } = checked;
    if (task.project_id !== input.project_id) {
      return fail(
        "invalid_input",
        `project_id ${input.project_id} is not the task's project (${task.project_id}).`,
        "fix_input",
      );
    }
    const runId = deriveTaskRunId(this.#secret, principal.id, task.task_id, attempt.attempt_id);
    const config = input.config ?? {};
    const timeout = input.timeout_secs ?? null;
    const fingerprint = intentFingerprint({
      project_id: task.project_id,
      provider_id: input.provider_id,
      prompt: task.instruction,
      config,
      timeout_secs: timeout,
      base_ref: input.base_ref,
      continue_run_id: input.continue_run_id ?? null,
    });
    const authority = authorityFingerprint({
      principal_id: principal.id,
      project_id: task.project_id,
      provider_id: input.provider_id,
    });
    const result = await this.#admission.admit(principal, {
      run_id: runId,
      intent_fingerprint: fingerprint,
      project_id: task.project_id,
      provider_id: input.provider_id,
      prompt: task.instruction,
      config,
      timeout_secs: timeout,
      ...(input.base_ref !== undefined ? { base_ref: input.base_ref } : {}),
      ...(input.continue_run_id !== undefined ? { continue_run_id: input.continue_run_id } : {}),
      // Inside the admission transaction `tx`: the claim again (the task row locked until it commits, so
      // no new attempt or generation can slip in), then the binding next to the record.
      bind: async (fences, tx) => {
        const again = await this.#checkClaim(principal, claim, tx);
        if ("code" in again) return again;
        const bound = await this.#tasks.binding(attempt.attempt_id, tx);
        if (bound && bound.run_id !== runId) {
          return taskError("internal", "This attempt is bound to another run.", "reconcile");
        }
        await this.#tasks.upsertBinding(
          {
            attempt_id: attempt.attempt_id,
            task_id: task.task_id,
            run_id: runId,
            provider_id: input.provider_id,
            runner_id: fences.runner_id,
            provider_instance_id: fences.provider_instance_id,
            agent_instance_id: fences.agent_instance_id,
            authority_fingerprint: authority,
            intent_fingerprint: fingerprint,
          },
          tx,
        );
        return (await recorder?.(fences, tx)) ?? null;
      },
      afterRecorded: () => serverFailpoint("task_after_binding"),
      afterDispatched: () => serverFailpoint("task_after_run_start"),
    });
    if (!result.ok) return result;
    await this.#recordOutcome(attempt.attempt_id, runId, this.#tasks.engine);
    this.#log.info(
      { task_id: task.task_id, attempt_id: attempt.attempt_id, run_id: runId, replayed: result.value.replayed },
      "task run started",
    );
    return { ok: true, value: { ...result.value, task_id: task.task_id, attempt_id: attempt.attempt_id } };
  }

  /** Copy the run's authoritative state (the admission record) onto the attempt. */
  async #recordOutcome(attemptId: string, runId: string, q: StateQueries): Promise<RunOutcomeView | null> {
    const rec = await this.#records.get(runId, q);
    if (!rec) return null;
    const at = new Date(this.#now()).toISOString();
    await this.#tasks.recordRunOutcome(
      attemptId,
      {
        run_state: rec.state,
        run_execution_state: rec.execution_state,
        run_stop_reason: rec.stop_reason,
        run_failure_kind: rec.failure_kind,
        run_reconciled_at: at,
      },
      q,
    );
    return runOutcomeView(rec, at);
  }

  // ---- reconcile / close ------------------------------------------------------------------

  async reconcile(
    principal: Principal,
    input: { task_id: string; attempt_id?: string },
  ): Promise<ApiResult<{ task: TaskView; attempt: AttemptView | null; attempts: number }>> {
    const denied = this.#mayUseTasks(principal);
    if (denied) return { ok: false, error: denied };
    return await this.#tasks.transaction(async (tx) => {
      const task = await this.#owned(principal, input.task_id, tx);
      if ("code" in task) return { ok: false, error: task };
      const attemptId = input.attempt_id ?? task.current_attempt_id;
      let attempt: AttemptView | null = null;
      if (attemptId !== null && attemptId !== undefined) {
        const row = await this.#tasks.attempt(attemptId, tx);
        if (!row || row.task_id !== task.task_id) {
          return fail("not_found", `No attempt ${attemptId} on task ${task.task_id}.`, "none");
        }
        const binding = await this.#tasks.binding(row.attempt_id, tx);
        const outcome = binding ? await this.#recordOutcome(row.attempt_id, binding.run_id, tx) : null;
        // The chain (design §17) as observe names it, read live: a later run may have continued this one.
        const run = outcome === null ? null : { ...outcome, ...(await continuationLinks(tx, outcome.run_id)) };
        const now = this.#now();
        attempt = {
          ...this.#claimView(row),
          state: row.state,
          lease_live: row.state === "active" && row.lease_expires_ms > now,
          ...(row.superseded_run_id !== null ? { superseded_run_id: row.superseded_run_id } : {}),
          run,
        };
      }
      const attempts = await this.#tasks.countAttempts(task.task_id, tx);
      return { ok: true, value: { task: taskView(task), attempt, attempts } };
    });
  }

  async close(
    principal: Principal,
    input: { task_id: string; outcome: TaskOutcome },
  ): Promise<ApiResult<{ task: TaskView; already_closed: boolean }>> {
    const denied = this.#mayUseTasks(principal);
    if (denied) return { ok: false, error: denied };
    // Atomic by the task's row lock: no attempt or binding can be added between the check and the close.
    const result = await this.#tasks.transaction(
      async (tx): Promise<ApiResult<{ task: TaskView; already_closed: boolean }>> => {
        const task = await this.#owned(principal, input.task_id, tx);
        if ("code" in task) return { ok: false, error: task };
        if (task.state === "closed") {
          if (task.outcome !== input.outcome) {
            return fail("claim_conflict", `Task ${task.task_id} is already closed as ${task.outcome}.`, "none");
          }
          return { ok: true, value: { task: taskView(task), already_closed: true } };
        }
        const bindings = await this.#tasks.bindingsOf(task.task_id, tx);
        for (const b of bindings) {
          const rec = await this.#records.get(b.run_id, tx);
          if (rec && !isTerminalState(rec.state)) {
            return fail(
              "claim_conflict",
              `Run ${rec.run_id} of this task is ${rec.state}; cancel it or wait for it to end before closing the task.`,
              "wait",
            );
          }
        }
        if (task.current_attempt_id !== null) {
          await this.#announcer.expiry(task, await this.#tasks.attempt(task.current_attempt_id, tx), tx);
        }
        await this.#tasks.closeTask(task.task_id, input.outcome, tx);
        this.#log.info({ task_id: task.task_id, outcome: input.outcome }, "task closed");
        const closed = (await this.#tasks.task(task.task_id, tx)) ?? task;
        await this.#announcer.tell(
          {
            kind: "closed",
            task: closed,
            attempts: await this.#tasks.countAttempts(task.task_id, tx),
            runs: bindings.length,
          },
          tx,
        );
        return { ok: true, value: { task: taskView(closed), already_closed: false } };
      },
    );
    if (result.ok && !result.value.already_closed) await this.#tasks.prune();
    return result;
  }

  /** The run id bound to an attempt (for audit rows), or null. */
  async boundRunId(attemptId: string | undefined): Promise<string | null> {
    if (attemptId === undefined) return null;
    return (await this.#tasks.binding(attemptId))?.run_id ?? null;
  }
}
