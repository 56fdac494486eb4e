/**
 * Runs as MCP Tasks (the `io.modelcontextprotocol/tasks` extension, its
 * 2026-07-28 binding) for clients that declare the extension in their
 * request's `_meta` client capabilities.
 *
 * A task is a view of a run, never state of its own: its id is derived from
 * the run id and the starting principal (`wc_task_<run suffix>_<MAC>`, the
 * MAC keyed by the Server secret), so the same idempotency key gives the
 * same task, another principal's id (or a made-up one) fails the MAC before
 * any lookup, and `tasks/get` after a Server restart (`kill -9`) reads the
 * same durable run record. Nothing is held in memory between requests, so
 * any Server process answers any task request.
 *
 * Run state → task status (design §13, docs/design.md §13):
 * - `starting`, `running`, `waiting_permission` → `working`, with a one-line
 *   status message (state, execution stage, the last tool step, Runner offline);
 * - `completed` → `completed`; its `result` is the observe-shaped terminal
 *   result (run id, state, execution state, stop reason, failure kind,
 *   recovery kind, message, usage, and a continuation's `parent_run_id` / `continued_by`, design §17) as a
 *   tool result with `resultType: "complete"`;
 * - `cancelled` → `cancelled`;
 * - `failed` → `failed` whose `error` (TASK_RUN_FAILED) carries the same
 *   terminal result in `data`;
 * - `lost` → `failed` whose `error` (TASK_RUN_LOST) says the outcome is
 *   unknown and what to do, with the terminal result in `data` — never
 *   `completed`.
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import { isCanonicalBase64url, RUN_ID_PATTERN } from "@webcodex/protocol";
import type { ObserveOutput, Principal, RunsApi } from "../runs/api.js";
import type { ToolStep } from "../runs/mirror.js";
import type { Era } from "./era.js";

export const TASKS_EXTENSION = "io.modelcontextprotocol/tasks";
/** How often a client should poll `tasks/get` (the task's `pollIntervalMs`). */
export const TASK_POLL_INTERVAL_MS = 2_000;
/** JSON-RPC error code of a failed task whose run failed. */
export const TASK_RUN_FAILED = -32010;
/** JSON-RPC error code of a failed task whose run is lost (outcome unknown). */
export const TASK_RUN_LOST = -32011;

/**
 * `_meta` key of a task result naming its run: on the task-backed start the start tool's own output
 * (`run_id`, `state`, `execution_state`, `replayed`, `observation_token`), on `tasks/get` `{run_id}` — so a
 * client can follow the run's events with observe_coding_agent.
 */
export const RUN_META = "dev.webcodex/run";

const TASK_ID_PREFIX = "wc_task_";
const RUN_ID_PREFIX = "wc_agent_run_";
const KEY_DOMAIN = "webcodex mcp task id v1";
/** Bytes of the task id's MAC (base64url, 22 characters): 128 bits, not guessable. */
const MAC_BYTES = 16;
const TASK_ID_PATTERN = /^wc_task_([a-z2-7]{26})_([A-Za-z0-9_-]{22})$/;

/**
 * Why a task id that has the task id's shape is still refused: its MAC is not spelled canonically (the last
 * base64url character's two unused low bits set), so it would decode to the same task as the issued id
 * under another spelling — past de-duplication and per-principal bounds. Null when the id is canonical
 * or does not have the shape at all (then it is simply unknown).
 */
export function nonCanonicalTaskId(taskId: string): string | null {
  const m = TASK_ID_PATTERN.exec(taskId);
  if (m === null || isCanonicalBase64url(m[2] ?? "")) return null;
  return "is not the canonical spelling of a task id (its last character has unused bits set); send the task id exactly as the Server issued it";
}

type TaskStatus = "working" | "input_required" | "completed" | "failed" | "cancelled";

/** What a task needs of the run's durable record: whose it is and when it changed. */
export interface RunRecordTimes {
  get(runId: string): Promise<{ principal_id: string; created_at: string; updated_at: string } | undefined>;
}

/** Whether this request's client declared the Tasks extension (`_meta` client capabilities `extensions`). */
export function declaresTasks(era: Era): boolean {
  if (era.kind !== "modern") return false;
  const extensions = era.clientCapabilities.extensions;
  if (typeof extensions !== "object" || extensions === null || Array.isArray(extensions)) return false;
  const declared = (extensions as Record<string, unknown>)[TASKS_EXTENSION];
  return typeof declared === "object" && declared !== null && !Array.isArray(declared);
}

/** A JSON-RPC error for a task request. */
export class TaskRequestError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

const NOT_FOUND = () =>
  new TaskRequestError(
    -32602,
    "Unknown task: no task with this taskId belongs to you. Task ids come from a task-backed start_coding_agent or start_agent_task_coding_run.",
  );

function refuseNonCanonical(taskId: string): void {
  const why = nonCanonicalTaskId(taskId);
  if (why !== null) throw new TaskRequestError(-32602, `params.taskId ${why}.`);
}

export class RunTasks {
  readonly #key: Buffer;
  readonly #runs: RunsApi;
  readonly #records: RunRecordTimes;

  constructor(options: { serverSecret: Buffer; runs: RunsApi; records: RunRecordTimes }) {
    this.#key = createHmac("sha256", options.serverSecret).update(KEY_DOMAIN).digest();
    this.#runs = options.runs;
    this.#records = options.records;
  }

  #mac(principalId: string, runId: string): Buffer {
    return createHmac("sha256", this.#key).update(`${principalId}\n${runId}`).digest().subarray(0, MAC_BYTES);
  }

  /** The task id of `runId` as `principal` sees it. */
  taskId(principal: Principal, runId: string): string {
    if (!RUN_ID_PATTERN.test(runId)) throw new Error("not a run id");
    return `${TASK_ID_PREFIX}${runId.slice(RUN_ID_PREFIX.length)}_${this.#mac(principal.id, runId).toString("base64url")}`;
  }

  /** The run behind a task id, when the id is well formed and was issued to this principal; else null. */
  runIdOf(principal: Principal, taskId: string): string | null {
    const m = TASK_ID_PATTERN.exec(taskId);
    if (m === null || !isCanonicalBase64url(m[2] ?? "")) return null;
    const runId = `${RUN_ID_PREFIX}${m[1]}`;
    const presented = Buffer.from(m[2] ?? "", "base64url");
    const expected = this.#mac(principal.id, runId);
    if (presented.length !== expected.length || !timingSafeEqual(presented, expected)) return null;
    return runId;
  }

  /** The answer to a task-backed start: the task bound to the run it started (or replayed), and that start's output. */
  async created(principal: Principal, runId: string, started: unknown): Promise<Record<string, unknown>> {
    const { task } = await this.#view(principal, runId);
    return { resultType: "task", ...task, _meta: { [RUN_META]: started } };
  }

  /** `tasks/get`: the task and, once terminal, its result or error. */
  async get(principal: Principal, taskId: string): Promise<Record<string, unknown>> {
    refuseNonCanonical(taskId);
    const runId = this.runIdOf(principal, taskId);
    if (runId === null) throw NOT_FOUND();
    const { task, terminal } = await this.#view(principal, runId);
    return { resultType: "complete", ...task, ...terminal, _meta: { [RUN_META]: { run_id: runId } } };
  }

  /** The run id behind `taskId` for cancelling (the caller cancels it as cancel_coding_agent). */
  runToCancel(principal: Principal, taskId: string): string {
    refuseNonCanonical(taskId);
    const runId = this.runIdOf(principal, taskId);
    if (runId === null) throw NOT_FOUND();
    return runId;
  }

  /** The run behind a task id issued to this principal whose record exists and is theirs; else null. */
  async ownedRun(principal: Principal, taskId: string): Promise<string | null> {
    const runId = this.runIdOf(principal, taskId);
    if (runId === null) return null;
    return (await this.#records.get(runId))?.principal_id === principal.id ? runId : null;
  }

  /** The detailed task of `runId` for one observe view of it, as `tasks/get` would answer it (no lookup of the run's events). */
  async snapshot(principal: Principal, runId: string, o: ObserveOutput): Promise<Record<string, unknown>> {
    const record = await this.#records.get(runId);
    if (record === undefined || record.principal_id !== principal.id) throw NOT_FOUND();
    const { task, terminal } = this.#build(principal, runId, record, o);
    return { ...task, ...terminal };
  }

  async #view(
    principal: Principal,
    runId: string,
  ): Promise<{ task: Record<string, unknown>; terminal: Record<string, unknown> }> {
    const record = await this.#records.get(runId);
    // The run's own ownership rule, as observe applies it; the MAC already bound the id to this principal.
    if (record === undefined || record.principal_id !== principal.id) throw NOT_FOUND();
    const observed = await this.#runs.observe(principal, { run_id: runId });
    if (!observed.ok) throw NOT_FOUND();
    return this.#build(principal, runId, record, observed.value);
  }

  #build(
    principal: Principal,
    runId: string,
    record: { created_at: string; updated_at: string },
    o: ObserveOutput,
  ): { task: Record<string, unknown>; terminal: Record<string, unknown> } {
    const status = taskStatus(o);
    const task: Record<string, unknown> = {
      taskId: this.taskId(principal, runId),
      status,
      statusMessage: statusMessage(o, this.#runs.lastToolStep(runId)),
      createdAt: record.created_at,
      lastUpdatedAt: record.updated_at,
      // Admitted run records never expire (runs/record-expiry.ts), so neither does the task.
      ttlMs: null,
      pollIntervalMs: TASK_POLL_INTERVAL_MS,
    };
    return { task, terminal: terminalFields(status, o) };
  }
}

/** Whether a task status is final (no further change will be reported). */
export function isTerminalTaskStatus(status: unknown): boolean {
  return status === "completed" || status === "failed" || status === "cancelled";
}

function taskStatus(o: ObserveOutput): TaskStatus {
  switch (o.state) {
    case "starting":
    case "running":
    case "waiting_permission":
      return "working";
    case "completed":
      return "completed";
    case "cancelled":
      return "cancelled";
    case "failed":
    case "lost":
      return "failed";
  }
}

/** Characters of a tool step's title kept in a status message (the title is the agent's own label). */
export const STATUS_TOOL_TITLE_MAX_CHARS = 120;

/** One line: state, execution stage, the last tool step, and why the state may be stale. */
function statusMessage(o: ObserveOutput, step: ToolStep | null): string {
  const parts = [`run ${o.state}`, `execution ${o.execution_state}`];
  if (o.stop_reason !== undefined) parts.push(`stop reason ${o.stop_reason}`);
  if (o.failure_kind !== undefined) parts.push(`failure ${o.failure_kind}`);
  if (step !== null) {
    const title = step.title.replace(/\s+/g, " ").trim();
    const shown =
      title.length > STATUS_TOOL_TITLE_MAX_CHARS ? `${title.slice(0, STATUS_TOOL_TITLE_MAX_CHARS)}…` : title;
    parts.push(`last tool step ${step.tool_kind} ${step.status}: ${shown}`);
  }
  if (o.runner_offline) parts.push("Runner offline: last known state");
  return parts.join("; ");
}

/**
 * The observe-shaped terminal result: the run's final status fields, without events, and `history_lost` — true
 * when some of the run's events are gone (a Runner restart, a pruned run, a bounded ring), so a host that
 * follows a task knows the run's event history can no longer be read whole.
 */
function terminalResult(o: ObserveOutput): Record<string, unknown> {
  return {
    run_id: o.run_id,
    state: o.state,
    execution_state: o.execution_state,
    ...(o.stop_reason !== undefined ? { stop_reason: o.stop_reason } : {}),
    ...(o.failure_kind !== undefined ? { failure_kind: o.failure_kind } : {}),
    recovery_kind: o.recovery_kind,
    ...(o.message !== undefined ? { message: o.message } : {}),
    ...(o.usage !== undefined ? { usage: o.usage } : {}),
    history_lost: o.history_lost,
    ...(o.parent_run_id !== undefined ? { parent_run_id: o.parent_run_id } : {}),
    ...(o.continued_by !== undefined ? { continued_by: o.continued_by } : {}),
  };
}

function terminalFields(status: TaskStatus, o: ObserveOutput): Record<string, unknown> {
  if (status === "completed") {
    const structured = terminalResult(o);
    return {
      result: {
        resultType: "complete",
        content: [{ type: "text", text: JSON.stringify(structured) }],
        structuredContent: structured,
      },
    };
  }
  if (status !== "failed") return {};
  if (o.state === "lost") {
    return {
      error: {
        code: TASK_RUN_LOST,
        message:
          "The run is lost: the Server cannot tell whether the agent finished or what it changed. Inspect the project's working tree; start again with a new idempotency_key if the work is not there.",
        data: terminalResult(o),
      },
    };
  }
  return {
    error: {
      code: TASK_RUN_FAILED,
      message: `The run failed${o.failure_kind !== undefined ? ` (${o.failure_kind})` : ""}${o.message !== undefined ? `: ${o.message}` : "."}`,
      data: terminalResult(o),
    },
  };
}
