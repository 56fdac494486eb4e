/**
 * Durable state of the managed path (design §10) in the Server's state DB:
 * tasks, attempts and the unique Attempt→Run binding. Plain rows and
 * statements; the rules (claims, leases, blocking runs) live in
 * tasks/service.ts. The task instruction is task data: stored here, bounded,
 * and never logged or audited by anyone.
 *
 * Bounds: open tasks per principal (MAX_OPEN_TASKS_PER_PRINCIPAL), attempts
 * per task (MAX_ATTEMPTS_PER_TASK); closed tasks are deleted with their
 * attempts and bindings after CLOSED_TASK_RETENTION_MS, and beyond
 * MAX_CLOSED_TASKS the oldest closed ones go first. Admission records of
 * their runs stay (they belong to the run core).
 *
 * The tables are created by the state DB's migrations (state/schema.ts, version 3).
 *
 * Every method runs on the engine, or — given `q`, a transaction's handle — inside that transaction
 * (state/engine.ts). The store decides nothing itself: tasks/service.ts reads the deciding row with
 * `lockTask` (SELECT … FOR UPDATE) in the transaction that writes, so two claimants of one task on any
 * number of Server instances are serialised on that row.
 */
import type { TaskOutcome } from "@webcodex/protocol";
import type { StateEngine, StateQueries } from "../state/engine.js";

export const MAX_OPEN_TASKS_PER_PRINCIPAL = 1000;
export const MAX_ATTEMPTS_PER_TASK = 256;
export const MAX_CLOSED_TASKS = 10_000;
export const CLOSED_TASK_RETENTION_MS = 30 * 24 * 3600 * 1000;

// The outcomes are the tools' contract (the protocol package's tools/tasks.ts).
export { TASK_OUTCOMES, type TaskOutcome } from "@webcodex/protocol";

export type TaskState = "open" | "closed";
/** `active`: the task's current claim (its lease may have expired); `superseded` by a newer attempt; `closed` with the task. */
export type AttemptState = "active" | "superseded" | "closed";

export interface TaskRow {
  task_id: string;
  principal_id: string;
  project_id: string;
  title: string;
  instruction: string;
  instruction_bytes: number;
  request_fingerprint: string;
  state: TaskState;
  outcome: TaskOutcome | null;
  current_attempt_id: string | null;
  last_fence: number;
  created_at: string;
  updated_at: string;
  closed_at: string | null;
}

export interface AttemptRow {
  attempt_id: string;
  task_id: string;
  assignee: string;
  fence: number;
  controller_generation: number;
  lease_expires_ms: number;
  state: AttemptState;
  /** The lost run this attempt explicitly superseded when it was claimed (audited). */
  superseded_run_id: string | null;
  /** The bound run's state as last reconciled (never the task's outcome). */
  run_state: string | null;
  run_execution_state: string | null;
  run_stop_reason: string | null;
  run_failure_kind: string | null;
  run_reconciled_at: string | null;
  /** The controller generation whose lease expiry was announced (tasks/changes.ts); 0: none yet. */
  expiry_announced_generation: number;
  created_at: string;
  updated_at: string;
}

export interface BindingRow {
  attempt_id: string;
  task_id: string;
  run_id: string;
  provider_id: string;
  runner_id: string;
  provider_instance_id: string;
  agent_instance_id: string;
  authority_fingerprint: string;
  intent_fingerprint: string;
  created_at: string;
  updated_at: string;
}

export type AttemptRunPatch = Pick<
  AttemptRow,
  "run_state" | "run_execution_state" | "run_stop_reason" | "run_failure_kind" | "run_reconciled_at"
>;

export class TaskStore {
  readonly engine: StateEngine;
  readonly #now: () => Date;

  constructor(engine: StateEngine, now: () => Date = () => new Date()) {
    this.engine = engine;
    this.#now = now;
  }

  /** Run `fn` in one engine transaction (state/engine.ts: commit when it resolves, roll back when it throws). */
  transaction<T>(fn: (tx: StateQueries) => Promise<T>, options?: { lock?: string }): Promise<T> {
    return this.engine.transaction(fn, options);
  }

  async task(taskId: string, q: StateQueries = this.engine): Promise<TaskRow | undefined> {
    return await q.get<TaskRow>("SELECT * FROM agent_tasks WHERE task_id = ?", [taskId]);
  }

  /**
   * The task row, locked until `tx` ends (PostgreSQL row lock; SQLite runs one transaction at a time):
   * every decision about a task's attempts and claims is read through this, inside the transaction
   * that acts on it.
   */
  async lockTask(taskId: string, tx: StateQueries): Promise<TaskRow | undefined> {
    return await tx.get<TaskRow>("SELECT * FROM agent_tasks WHERE task_id = ? FOR UPDATE", [taskId]);
  }

  async countOpenTasks(principalId: string, q: StateQueries = this.engine): Promise<number> {
    const row = await q.get<{ n: number }>(
      "SELECT COUNT(*) AS n FROM agent_tasks WHERE principal_id = ? AND state = 'open'",
      [principalId],
    );
    return Number(row?.n ?? 0);
  }

  async insertTask(
    row: Omit<
      TaskRow,
      "created_at" | "updated_at" | "closed_at" | "outcome" | "current_attempt_id" | "last_fence" | "state"
    >,
    q: StateQueries = this.engine,
  ): Promise<TaskRow> {
    const now = this.#now().toISOString();
    const full: TaskRow = {
      ...row,
      state: "open",
      outcome: null,
      current_attempt_id: null,
      last_fence: 0,
      created_at: now,
      updated_at: now,
      closed_at: null,
    };
    await q.run(
      `INSERT INTO agent_tasks (task_id, principal_id, project_id, title, instruction, instruction_bytes,
         request_fingerprint, state, outcome, current_attempt_id, last_fence, created_at, updated_at, closed_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      [
        full.task_id,
        full.principal_id,
        full.project_id,
        full.title,
        full.instruction,
        full.instruction_bytes,
        full.request_fingerprint,
        full.state,
        full.outcome,
        full.current_attempt_id,
        full.last_fence,
        full.created_at,
        full.updated_at,
        full.closed_at,
      ],
    );
    return full;
  }

  /** Close the task and its active attempt; call it in one transaction (both statements or neither). */
  async closeTask(taskId: string, outcome: TaskOutcome, q: StateQueries = this.engine): Promise<void> {
    const now = this.#now().toISOString();
    await q.run(
      "UPDATE agent_tasks SET state = 'closed', outcome = ?, closed_at = ?, updated_at = ? WHERE task_id = ?",
      [outcome, now, now, taskId],
    );
    await q.run(
      "UPDATE agent_task_attempts SET state = 'closed', updated_at = ? WHERE task_id = ? AND state = 'active'",
      [now, taskId],
    );
  }

  async attempt(attemptId: string, q: StateQueries = this.engine): Promise<AttemptRow | undefined> {
    return await q.get<AttemptRow>("SELECT * FROM agent_task_attempts WHERE attempt_id = ?", [attemptId]);
  }

  async attemptsOf(taskId: string, q: StateQueries = this.engine): Promise<AttemptRow[]> {
    return await q.all<AttemptRow>("SELECT * FROM agent_task_attempts WHERE task_id = ? ORDER BY fence", [taskId]);
  }

  async countAttempts(taskId: string, q: StateQueries = this.engine): Promise<number> {
    const row = await q.get<{ n: number }>("SELECT COUNT(*) AS n FROM agent_task_attempts WHERE task_id = ?", [taskId]);
    return Number(row?.n ?? 0);
  }

  /**
   * A new attempt becomes the task's current claim; any earlier active attempt is superseded. Call it in
   * the transaction that locked the task (`lockTask`) and read `fence` from it: UNIQUE (task_id, fence)
   * refuses a second attempt with the same fence should that ever be skipped.
   */
  async insertAttempt(
    row: Pick<AttemptRow, "attempt_id" | "task_id" | "assignee" | "fence" | "lease_expires_ms" | "superseded_run_id">,
    q: StateQueries = this.engine,
  ): Promise<AttemptRow> {
    const now = this.#now().toISOString();
    const full: AttemptRow = {
      ...row,
      controller_generation: 1,
      state: "active",
      run_state: null,
      run_execution_state: null,
      run_stop_reason: null,
      run_failure_kind: null,
      run_reconciled_at: null,
      expiry_announced_generation: 0,
      created_at: now,
      updated_at: now,
    };
    await q.run(
      "UPDATE agent_task_attempts SET state = 'superseded', updated_at = ? WHERE task_id = ? AND state = 'active'",
      [now, row.task_id],
    );
    await q.run(
      `INSERT INTO agent_task_attempts (attempt_id, task_id, assignee, fence, controller_generation, lease_expires_ms,
         state, superseded_run_id, run_state, run_execution_state, run_stop_reason, run_failure_kind,
         run_reconciled_at, created_at, updated_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      [
        full.attempt_id,
        full.task_id,
        full.assignee,
        full.fence,
        full.controller_generation,
        full.lease_expires_ms,
        full.state,
        full.superseded_run_id,
        full.run_state,
        full.run_execution_state,
        full.run_stop_reason,
        full.run_failure_kind,
        full.run_reconciled_at,
        full.created_at,
        full.updated_at,
      ],
    );
    await q.run("UPDATE agent_tasks SET current_attempt_id = ?, last_fence = ?, updated_at = ? WHERE task_id = ?", [
      row.attempt_id,
      row.fence,
      now,
      row.task_id,
    ]);
    return full;
  }

  /** Extend a lease; `bumpGeneration` when an expired claim is re-taken (older holders become stale). */
  async renewAttempt(
    attemptId: string,
    leaseExpiresMs: number,
    bumpGeneration: boolean,
    q: StateQueries = this.engine,
  ): Promise<void> {
    await q.run(
      `UPDATE agent_task_attempts SET lease_expires_ms = ?, controller_generation = controller_generation + ?,
         updated_at = ? WHERE attempt_id = ?`,
      [leaseExpiresMs, bumpGeneration ? 1 : 0, this.#now().toISOString(), attemptId],
    );
  }

  /**
   * Active attempts whose lease ran out before `nowMs` and whose expiry (for their current generation) was not
   * announced yet, oldest first, at most `limit`: the expiry sweep's candidates (it decides on each under the
   * task's lock).
   */
  async unannouncedExpiries(
    nowMs: number,
    limit: number,
    q: StateQueries = this.engine,
  ): Promise<{ attempt_id: string; task_id: string }[]> {
    return await q.all<{ attempt_id: string; task_id: string }>(
      `SELECT attempt_id, task_id FROM agent_task_attempts WHERE state = 'active' AND lease_expires_ms <= ?
         AND expiry_announced_generation < controller_generation ORDER BY lease_expires_ms LIMIT ?`,
      [nowMs, limit],
    );
  }

  /** Record that the expiry of `generation` of this attempt was announced (tasks/changes.ts). */
  async markExpiryAnnounced(attemptId: string, generation: number, q: StateQueries = this.engine): Promise<void> {
    await q.run("UPDATE agent_task_attempts SET expiry_announced_generation = ? WHERE attempt_id = ?", [
      generation,
      attemptId,
    ]);
  }

  async recordRunOutcome(attemptId: string, patch: AttemptRunPatch, q: StateQueries = this.engine): Promise<void> {
    await q.run(
      `UPDATE agent_task_attempts SET run_state = ?, run_execution_state = ?, run_stop_reason = ?,
         run_failure_kind = ?, run_reconciled_at = ?, updated_at = ? WHERE attempt_id = ?`,
      [
        patch.run_state,
        patch.run_execution_state,
        patch.run_stop_reason,
        patch.run_failure_kind,
        patch.run_reconciled_at,
        patch.run_reconciled_at,
        attemptId,
      ],
    );
  }

  async binding(attemptId: string, q: StateQueries = this.engine): Promise<BindingRow | undefined> {
    return await q.get<BindingRow>("SELECT * FROM agent_task_run_bindings WHERE attempt_id = ?", [attemptId]);
  }

  async bindingsOf(taskId: string, q: StateQueries = this.engine): Promise<BindingRow[]> {
    return await q.all<BindingRow>("SELECT * FROM agent_task_run_bindings WHERE task_id = ? ORDER BY created_at", [
      taskId,
    ]);
  }

  /**
   * Insert the binding, or — for a run the Runner provably never admitted and that is being
   * re-admitted — refresh its captured fences. The run id of a binding never changes.
   */
  async upsertBinding(
    row: Omit<BindingRow, "created_at" | "updated_at">,
    q: StateQueries = this.engine,
  ): Promise<void> {
    const now = this.#now().toISOString();
    await q.run(
      `INSERT INTO agent_task_run_bindings (attempt_id, task_id, run_id, provider_id, runner_id, provider_instance_id,
         agent_instance_id, authority_fingerprint, intent_fingerprint, created_at, updated_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (attempt_id) DO UPDATE SET runner_id = excluded.runner_id,
         provider_instance_id = excluded.provider_instance_id, agent_instance_id = excluded.agent_instance_id,
         updated_at = excluded.updated_at
       WHERE agent_task_run_bindings.run_id = excluded.run_id`,
      [
        row.attempt_id,
        row.task_id,
        row.run_id,
        row.provider_id,
        row.runner_id,
        row.provider_instance_id,
        row.agent_instance_id,
        row.authority_fingerprint,
        row.intent_fingerprint,
        now,
        now,
      ],
    );
  }

  /** Delete closed tasks past retention (and beyond MAX_CLOSED_TASKS, oldest first); returns how many. */
  async prune(retentionMs = CLOSED_TASK_RETENTION_MS, maxClosed = MAX_CLOSED_TASKS): Promise<number> {
    const cutoff = new Date(this.#now().getTime() - retentionMs).toISOString();
    // One transaction: a task is deleted with its attempts and bindings or not at all. Only closed tasks
    // are touched, and nothing reopens a closed task, so no lock is needed against other writers.
    return await this.transaction(async (tx) => {
      const old = await tx.all<{ task_id: string }>(
        `SELECT task_id FROM (
           SELECT task_id, closed_at, ROW_NUMBER() OVER (ORDER BY closed_at DESC, task_id) AS newest
           FROM agent_tasks WHERE state = 'closed') ranked
         WHERE closed_at < ? OR newest > ?`,
        [cutoff, maxClosed],
      );
      for (const { task_id } of old) {
        await tx.run("DELETE FROM agent_task_run_bindings WHERE task_id = ?", [task_id]);
        await tx.run("DELETE FROM agent_task_attempts WHERE task_id = ?", [task_id]);
        await tx.run("DELETE FROM agent_tasks WHERE task_id = ?", [task_id]);
      }
      return old.length;
    });
  }
}
