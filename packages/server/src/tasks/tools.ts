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
import {
  apiError,
  fail,
  ok,
  parseToolInput,
  RECORDER_ARGUMENT,
  RECORDER_ENVELOPE,
  stripUndefined,
  type ToolCallOutcome,
  type ToolInvocation,
  type ToolModule,
  type ToolSpec,
} from "../mcp/tool-shared.js";
import { checkStartGrant, checkToolScope } from "../principals/authority.js";
import type { Principal } from "../principals/principal.js";
import { WORKFLOW_SESSIONS_UNAVAILABLE } from "../runs/api.js";
import type { SessionService } from "../sessions/service.js";
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

  async call(
    principal: Principal,
    name: string,
    args: unknown,
    _signal?: AbortSignal,
    invocation?: ToolInvocation,
  ): Promise<ToolCallOutcome> {
    const denied = checkToolScope(principal);
    switch (name as TaskToolName) {
      case TASK_TOOL_NAMES.create: {
        const input = parseToolInput(CreateTaskInput, args);
        if (!input.ok) return fail(input.error, null);
        const refused = denied ?? checkStartGrant(principal, input.value.project_id);
        if (refused) return fail(refused, null);
        const r = await this.#tasks.createTask(principal, stripUndefined(input.value));
        return r.ok ? ok(CreateTaskOutput.parse(r.value), null) : fail(r.error, null);
      }
      case TASK_TOOL_NAMES.attempt: {
        const input = parseToolInput(StartAttemptInput, args);
        if (!input.ok) return fail(input.error, null);
        const supersede = input.value.supersede_uncertain_run ?? null;
        if (denied) return fail(denied, supersede);
        const r = await this.#tasks.startAttempt(principal, stripUndefined(input.value));
        return r.ok ? ok(StartAttemptOutput.parse(r.value), supersede) : fail(r.error, supersede);
      }
      case TASK_TOOL_NAMES.run: {
        const input = parseToolInput(StartTaskRunInput, args);
        if (!input.ok) return fail(input.error, null);
        const v = input.value;
        const refused = denied ?? checkStartGrant(principal, v.project_id);
        if (refused) return fail(refused, null);
        // 2026-07-28: `_wc.record` (the router refuses the argument on such requests); same checks.
        const recorderId = invocation?.record ?? v.workflow_session_id;
        const field = invocation?.record !== undefined ? RECORDER_ENVELOPE : RECORDER_ARGUMENT;
        let recorder: Awaited<ReturnType<SessionService["recorder"]>> | undefined;
        if (recorderId !== undefined) {
          if (!this.#sessions) return fail(apiError("invalid_input", WORKFLOW_SESSIONS_UNAVAILABLE), null);
          recorder = await this.#sessions.recorder(principal, recorderId, v.project_id, v.provider_id, field);
          if (!recorder.ok) return fail(recorder.error, null);
        }
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
          ...(recorder?.ok ? { recorder: recorder.value } : {}),
        });
        if (!r.ok) return fail(r.error, null);
        return ok(StartTaskRunOutput.parse(r.value), r.value.run_id);
      }
      case TASK_TOOL_NAMES.reconcile: {
        const input = parseToolInput(ReconcileInput, args);
        if (!input.ok) return fail(input.error, null);
        if (denied) return fail(denied, null);
        const r = await this.#tasks.reconcile(principal, stripUndefined(input.value));
        if (!r.ok) return fail(r.error, null);
        return ok(ReconcileOutput.parse(r.value), r.value.attempt?.run?.run_id ?? null);
      }
      case TASK_TOOL_NAMES.close: {
        const input = parseToolInput(CloseTaskInput, args);
        if (!input.ok) return fail(input.error, null);
        if (denied) return fail(denied, null);
        const r = await this.#tasks.close(principal, input.value);
        return r.ok ? ok(CloseTaskOutput.parse(r.value), null) : fail(r.error, null);
      }
      default:
        throw new Error("unknown task tool");
    }
  }
}
