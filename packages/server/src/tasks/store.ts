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
 */
import type BetterSqlite3 from "better-sqlite3";

export const MAX_OPEN_TASKS_PER_PRINCIPAL = 1000;
export const MAX_ATTEMPTS_PER_TASK = 256;
export const MAX_CLOSED_TASKS = 10_000;
export const CLOSED_TASK_RETENTION_MS = 30 * 24 * 3600 * 1000;

export const TASK_OUTCOMES = ["succeeded", "failed", "abandoned"] as const;
export type TaskOutcome = (typeof TASK_OUTCOMES)[number];

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
  readonly db: BetterSqlite3.Database;
  readonly #now: () => Date;

  constructor(db: BetterSqlite3.Database, now: () => Date = () => new Date()) {
    this.db = db;
    this.#now = now;
  }

  /** Run `fn` in one transaction (nested calls join the outer one). */
  atomically<T>(fn: () => T): T {
    return this.db.transaction(fn)();
  }

  task(taskId: string): TaskRow | undefined {
    return this.db.prepare<[string], TaskRow>("SELECT * FROM agent_tasks WHERE task_id = ?").get(taskId);
  }

  countOpenTasks(principalId: string): number {
    const row = this.db
      .prepare<[string], { n: number }>(
        "SELECT COUNT(*) AS n FROM agent_tasks WHERE principal_id = ? AND state = 'open'",
      )
      .get(principalId);
    return row?.n ?? 0;
  }

  insertTask(
    row: Omit<
      TaskRow,
      "created_at" | "updated_at" | "closed_at" | "outcome" | "current_attempt_id" | "last_fence" | "state"
    >,
  ): TaskRow {
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
    this.db
      .prepare(
        `INSERT INTO agent_tasks (task_id, principal_id, project_id, title, instruction, instruction_bytes,
           request_fingerprint, state, outcome, current_attempt_id, last_fence, created_at, updated_at, closed_at)
         VALUES (@task_id, @principal_id, @project_id, @title, @instruction, @instruction_bytes,
           @request_fingerprint, @state, @outcome, @current_attempt_id, @last_fence, @created_at, @updated_at, @closed_at)`,
      )
      .run(full);
    return full;
  }

  closeTask(taskId: string, outcome: TaskOutcome): void {
    const now = this.#now().toISOString();
    this.db
      .prepare("UPDATE agent_tasks SET state = 'closed', outcome = ?, closed_at = ?, updated_at = ? WHERE task_id = ?")
      .run(outcome, now, now, taskId);
    this.db
      .prepare("UPDATE agent_task_attempts SET state = 'closed', updated_at = ? WHERE task_id = ? AND state = 'active'")
      .run(now, taskId);
  }

  attempt(attemptId: string): AttemptRow | undefined {
    return this.db
      .prepare<[string], AttemptRow>("SELECT * FROM agent_task_attempts WHERE attempt_id = ?")
      .get(attemptId);
  }

  attemptsOf(taskId: string): AttemptRow[] {
    return this.db
      .prepare<[string], AttemptRow>("SELECT * FROM agent_task_attempts WHERE task_id = ? ORDER BY fence")
      .all(taskId);
  }

  /** A new attempt becomes the task's current claim; any earlier active attempt is superseded. */
  insertAttempt(
    row: Pick<AttemptRow, "attempt_id" | "task_id" | "assignee" | "fence" | "lease_expires_ms" | "superseded_run_id">,
  ): AttemptRow {
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
      created_at: now,
      updated_at: now,
    };
    this.db
      .prepare(
        "UPDATE agent_task_attempts SET state = 'superseded', updated_at = ? WHERE task_id = ? AND state = 'active'",
      )
      .run(now, row.task_id);
    this.db
      .prepare(
        `INSERT INTO agent_task_attempts (attempt_id, task_id, assignee, fence, controller_generation, lease_expires_ms,
           state, superseded_run_id, run_state, run_execution_state, run_stop_reason, run_failure_kind,
           run_reconciled_at, created_at, updated_at)
         VALUES (@attempt_id, @task_id, @assignee, @fence, @controller_generation, @lease_expires_ms, @state,
           @superseded_run_id, @run_state, @run_execution_state, @run_stop_reason, @run_failure_kind,
           @run_reconciled_at, @created_at, @updated_at)`,
      )
      .run(full);
    this.db
      .prepare("UPDATE agent_tasks SET current_attempt_id = ?, last_fence = ?, updated_at = ? WHERE task_id = ?")
      .run(row.attempt_id, row.fence, now, row.task_id);
    return full;
  }

  /** Extend a lease; `bumpGeneration` when an expired claim is re-taken (older holders become stale). */
  renewAttempt(attemptId: string, leaseExpiresMs: number, bumpGeneration: boolean): void {
    this.db
      .prepare(
        `UPDATE agent_task_attempts SET lease_expires_ms = ?, controller_generation = controller_generation + ?,
           updated_at = ? WHERE attempt_id = ?`,
      )
      .run(leaseExpiresMs, bumpGeneration ? 1 : 0, this.#now().toISOString(), attemptId);
  }

  recordRunOutcome(attemptId: string, patch: AttemptRunPatch): void {
    this.db
      .prepare(
        `UPDATE agent_task_attempts SET run_state = @run_state, run_execution_state = @run_execution_state,
           run_stop_reason = @run_stop_reason, run_failure_kind = @run_failure_kind,
           run_reconciled_at = @run_reconciled_at, updated_at = @run_reconciled_at WHERE attempt_id = @attempt_id`,
      )
      .run({ ...patch, attempt_id: attemptId });
  }

  binding(attemptId: string): BindingRow | undefined {
    return this.db
      .prepare<[string], BindingRow>("SELECT * FROM agent_task_run_bindings WHERE attempt_id = ?")
      .get(attemptId);
  }

  bindingsOf(taskId: string): BindingRow[] {
    return this.db
      .prepare<[string], BindingRow>("SELECT * FROM agent_task_run_bindings WHERE task_id = ? ORDER BY created_at")
      .all(taskId);
  }

  /**
   * Insert the binding, or — for a run the Runner provably never admitted and that is being
   * re-admitted — refresh its captured fences. The run id of a binding never changes.
   */
  upsertBinding(row: Omit<BindingRow, "created_at" | "updated_at">): void {
    const now = this.#now().toISOString();
    this.db
      .prepare(
        `INSERT INTO agent_task_run_bindings (attempt_id, task_id, run_id, provider_id, runner_id, provider_instance_id,
           agent_instance_id, authority_fingerprint, intent_fingerprint, created_at, updated_at)
         VALUES (@attempt_id, @task_id, @run_id, @provider_id, @runner_id, @provider_instance_id, @agent_instance_id,
           @authority_fingerprint, @intent_fingerprint, @now, @now)
         ON CONFLICT (attempt_id) DO UPDATE SET runner_id = excluded.runner_id,
           provider_instance_id = excluded.provider_instance_id, agent_instance_id = excluded.agent_instance_id,
           updated_at = excluded.updated_at
         WHERE agent_task_run_bindings.run_id = excluded.run_id`,
      )
      .run({ ...row, now });
  }

  /** Delete closed tasks past retention (and beyond MAX_CLOSED_TASKS, oldest first); returns how many. */
  prune(retentionMs = CLOSED_TASK_RETENTION_MS, maxClosed = MAX_CLOSED_TASKS): number {
    return this.atomically(() => {
      const cutoff = new Date(this.#now().getTime() - retentionMs).toISOString();
      const old = this.db
        .prepare<[string, number], { task_id: string }>(
          `SELECT task_id FROM agent_tasks WHERE state = 'closed' AND (closed_at < ? OR task_id IN (
             SELECT task_id FROM agent_tasks WHERE state = 'closed' ORDER BY closed_at DESC LIMIT -1 OFFSET ?))`,
        )
        .all(cutoff, maxClosed);
      for (const { task_id } of old) {
        this.db.prepare("DELETE FROM agent_task_run_bindings WHERE task_id = ?").run(task_id);
        this.db.prepare("DELETE FROM agent_task_attempts WHERE task_id = ?").run(task_id);
        this.db.prepare("DELETE FROM agent_tasks WHERE task_id = ?").run(task_id);
      }
      return old.length;
    });
  }
}
