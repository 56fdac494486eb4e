/**
 * The managed-path MCP tools (design §10), registered next to the run tools
 * as a ToolModule: closed zod input schemas, exact output schemas, the same
 * error envelope and one audit row per call (McpTools.call does both).
 *
 * Five tools: the four of design §10 plus `close_agent_task`. Closing is its
 * own small tool rather than a field of reconcile because (1) a task that
 * never got an attempt must be closable too, (2) reconcile stays a safe,
 * repeatable read-and-apply call a model may make at any time, and (3) the
 * one call that ends ownership carries its own destructive annotation.
 */
import {
  CloseTaskInput,
  CloseTaskOutput,
  CreateTaskInput,
  CreateTaskOutput,
  ReconcileInput,
  ReconcileOutput,
  StartAttemptInput,
  StartAttemptOutput,
  StartTaskRunInput,
  StartTaskRunOutput,
  TASK_TOOL_NAMES,
  type TaskToolName,
} from "@webcodex/protocol";
import type { Principal } from "../principals/principal.js";
import { WORKFLOW_SESSIONS_UNAVAILABLE } from "../runs/api.js";
import type { SessionService } from "../sessions/service.js";
import {
  fail,
  ok,
  type Parsed,
  RECORDER_ARGUMENT,
  RECORDER_ENVELOPE,
  stripUndefined,
  type ToolCallOutcome,
  type ToolInvocation,
  type ToolModule,
  type ToolSpec,
} from "../tools/contract.js";
import { apiError } from "../tools/errors.js";
import type { TaskService } from "./service.js";

// The five tools' names, bounds and schemas are the MCP contract, in the protocol package (tools/tasks.ts).
export { MAX_ASSIGNEE_LENGTH, MAX_TITLE_LENGTH, TASK_TOOL_NAMES, type TaskToolName } from "@webcodex/protocol";

const WRITE = { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false } as const;

export const TASK_TOOL_SPECS: readonly ToolSpec<TaskToolName>[] = [
  {
    name: TASK_TOOL_NAMES.create,
    title: "Create an agent task",
    description:
      "Create a durable task on a project: an instruction that runs of this task will use as their prompt. " +
      "Idempotent by idempotency_key. Keep the task_id.",
    input: CreateTaskInput,
    output: CreateTaskOutput,
    annotations: WRITE,
  },
  {
    name: TASK_TOOL_NAMES.attempt,
    title: "Claim an agent task (start or renew an attempt)",
    description:
      "Claim the task for an assignee with a lease: returns attempt_id, attempt_ref, fence and controller_generation. " +
      "One live attempt per task. Refused while an earlier run of the task is starting/running/waiting_permission or lost " +
      "(a lost run needs supersede_uncertain_run after you inspected the tree). Renew with renew_attempt_ref.",
    input: StartAttemptInput,
    output: StartAttemptOutput,
    annotations: { ...WRITE, idempotentHint: false },
  },
  {
    name: TASK_TOOL_NAMES.run,
    startsRun: true,
    runView: true,
    title: "Start the coding run of an attempt",
    description:
      "Start the one coding-agent run of a claimed attempt; the task's instruction is the prompt. Give attempt_ref " +
      "or the claim tuple. Repeating the call with a current claim returns the same run (replayed: true), never a second one. " +
      "continue_run_id continues an earlier run's agent session, as on start_coding_agent. " +
      "Follow it with observe_coding_agent.",
    input: StartTaskRunInput,
    output: StartTaskRunOutput,
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  },
  {
    name: TASK_TOOL_NAMES.reconcile,
    title: "Reconcile an attempt with its run",
    description:
      "Read the stored run of an attempt (default: the current one) and record its state as the attempt's run outcome. " +
      "Works after lease expiry, host interruption and Server restart. Also shows the task.",
    input: ReconcileInput,
    output: ReconcileOutput,
    annotations: WRITE,
  },
  {
    name: TASK_TOOL_NAMES.close,
    title: "Close an agent task",
    description:
      "Close a task with your verdict (succeeded, failed, abandoned). Run completion never closes a task. " +
      "Refused while a run of the task is still active.",
    input: CloseTaskInput,
    output: CloseTaskOutput,
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  },
];

export class TaskTools implements ToolModule {
  readonly specs = TASK_TOOL_SPECS;
  readonly #tasks: TaskService;
  readonly #sessions: SessionService | undefined;

  constructor(tasks: TaskService, sessions?: SessionService) {
    this.#tasks = tasks;
    this.#sessions = sessions;
  }

  /**
   * `input` is what the tool's schema parsed (the router's one shape check, mcp/tools.ts); scopes and grants
   * are the TaskService's to decide (principals/authority.ts words the refusals).
   */
  async call(
    principal: Principal,
    name: string,
    input: unknown,
    _signal?: AbortSignal,
    invocation?: ToolInvocation,
  ): Promise<ToolCallOutcome> {
    switch (name as TaskToolName) {
      case TASK_TOOL_NAMES.create: {
        const r = await this.#tasks.createTask(principal, stripUndefined(input as Parsed<typeof CreateTaskInput>));
        return r.ok ? ok(CreateTaskOutput.parse(r.value), null) : fail(r.error, null);
      }
      case TASK_TOOL_NAMES.attempt: {
        const v = input as Parsed<typeof StartAttemptInput>;
        const supersede = v.supersede_uncertain_run ?? null;
        const r = await this.#tasks.startAttempt(principal, stripUndefined(v));
        return r.ok ? ok(StartAttemptOutput.parse(r.value), supersede) : fail(r.error, supersede);
      }
      case TASK_TOOL_NAMES.run: {
        const v = input as Parsed<typeof StartTaskRunInput>;
        // 2026-07-28: `_wc.record` (the router refuses the argument on such requests); same checks.
        const recorderId = invocation?.record ?? v.workflow_session_id;
        const field = invocation?.record !== undefined ? RECORDER_ENVELOPE : RECORDER_ARGUMENT;
        const sessions = this.#sessions;
        const recorder =
          recorderId === undefined
            ? undefined
            : !sessions
              ? async () => ({ ok: false as const, error: apiError("invalid_input", WORKFLOW_SESSIONS_UNAVAILABLE) })
              : () => sessions.recorder(principal, recorderId, v.project_id, v.provider_id, field);
        const claim =
          v.attempt_ref !== undefined
            ? { attempt_ref: v.attempt_ref }
            : {
                task_id: v.task_id ?? "",
                attempt_id: v.attempt_id ?? "",
                assignee: v.assignee ?? "",
                fence: v.fence ?? 0,
                controller_generation: v.controller_generation ?? 0,
              };
        const r = await this.#tasks.startRun(principal, {
          project_id: v.project_id,
          provider_id: v.provider_id,
          claim,
          ...(v.config !== undefined ? { config: v.config } : {}),
          ...(v.timeout_secs !== undefined ? { timeout_secs: v.timeout_secs } : {}),
          ...(v.base_ref !== undefined ? { base_ref: v.base_ref } : {}),
          ...(v.continue_run_id !== undefined ? { continue_run_id: v.continue_run_id } : {}),
          ...(recorder ? { recorder } : {}),
        });
        if (!r.ok) return fail(r.error, null);
        return ok(StartTaskRunOutput.parse(r.value), r.value.run_id);
      }
      case TASK_TOOL_NAMES.reconcile: {
        const r = await this.#tasks.reconcile(principal, stripUndefined(input as Parsed<typeof ReconcileInput>));
        if (!r.ok) return fail(r.error, null);
        return ok(ReconcileOutput.parse(r.value), r.value.attempt?.run?.run_id ?? null);
      }
      case TASK_TOOL_NAMES.close: {
        const r = await this.#tasks.close(principal, input as Parsed<typeof CloseTaskInput>);
        return r.ok ? ok(CloseTaskOutput.parse(r.value), null) : fail(r.error, null);
      }
      default:
        throw new Error("unknown task tool");
    }
  }
}
