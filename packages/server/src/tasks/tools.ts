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
  ConfigMap,
  MAX_PROMPT_BYTES,
  MAX_RUN_TIMEOUT_SECS,
  MIN_RUN_TIMEOUT_SECS,
  ProjectId,
  ProviderId,
  RunId,
  utf8Length,
} from "@webcodex/protocol";
import { z } from "zod";
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
import { OpaqueKey, WORKFLOW_SESSIONS_UNAVAILABLE } from "../runs/api.js";
import { RunStatusFields, StartToolOutput } from "../runs/tool-schemas.js";
import { SessionId } from "../sessions/ids.js";
import type { SessionService } from "../sessions/service.js";
import { ATTEMPT_ID_PATTERN, MAX_ATTEMPT_REF_LENGTH, TASK_ID_PATTERN } from "./claim.js";
import { MAX_LEASE_SECS, MIN_LEASE_SECS, type TaskService } from "./service.js";
import { TASK_OUTCOMES } from "./store.js";

export const TASK_TOOL_NAMES = {
  create: "create_agent_task",
  attempt: "start_agent_task_attempt",
  run: "start_agent_task_coding_run",
  reconcile: "reconcile_agent_task_coding_run",
  close: "close_agent_task",
} as const;
export type TaskToolName = (typeof TASK_TOOL_NAMES)[keyof typeof TASK_TOOL_NAMES];

export const MAX_TITLE_LENGTH = 200;
export const MAX_ASSIGNEE_LENGTH = 128;

const TaskId = z.string().regex(TASK_ID_PATTERN, "must be wc_task_ followed by 26 base32 characters");
const AttemptId = z.string().regex(ATTEMPT_ID_PATTERN, "must be wc_attempt_ followed by 26 base32 characters");
// biome-ignore lint/suspicious/noControlCharactersInRegex: rejecting control characters is the point
const NoControl = /^[^\u0000-\u001f\u007f-\u009f]*$/;
const Assignee = z
  .string()
  .min(1)
  .max(MAX_ASSIGNEE_LENGTH)
  .regex(NoControl, "must not contain control characters")
  .describe("A label for who works on the attempt (a host process, an agent name).");
const Fence = z
  .number()
  .int()
  .min(1)
  .max(2 ** 31);
const AttemptRef = z
  .string()
  .min(1)
  .max(MAX_ATTEMPT_REF_LENGTH)
  .describe("The attempt_ref returned by start_agent_task_attempt: a compact selector for one claim.");
const Timestamp = z.string();

export const CreateTaskInput = z
  .object({
    project_id: ProjectId.describe("A project id from the webcodex://projects resource."),
    instruction: z
      .string()
      .min(1)
      .max(MAX_PROMPT_BYTES)
      .refine((s) => utf8Length(s) <= MAX_PROMPT_BYTES, { message: `must be at most ${MAX_PROMPT_BYTES} UTF-8 bytes` })
      .describe(
        `What the coding agent must do; becomes the prompt of every run of this task (≤ ${MAX_PROMPT_BYTES} bytes).`,
      ),
    idempotency_key: OpaqueKey.describe("Chosen by you; the same key and inputs return the same task."),
    title: z.string().max(MAX_TITLE_LENGTH).regex(NoControl, "must not contain control characters").optional(),
  })
  .strict();

const TaskView = z
  .object({
    task_id: TaskId,
    project_id: ProjectId,
    title: z.string(),
    state: z.enum(["open", "closed"]),
    outcome: z.enum(TASK_OUTCOMES).optional(),
    instruction_bytes: z.number().int(),
    current_attempt_id: AttemptId.optional(),
    created_at: Timestamp,
    updated_at: Timestamp,
    closed_at: Timestamp.optional(),
  })
  .strict();

export const CreateTaskOutput = TaskView.extend({ replayed: z.boolean() }).strict();

export const StartAttemptInput = z
  .object({
    task_id: TaskId,
    assignee: Assignee,
    lease_secs: z
      .number()
      .int()
      .min(MIN_LEASE_SECS)
      .max(MAX_LEASE_SECS)
      .optional()
      .describe("Lease length (default 600 s). Renew before it expires."),
    renew_attempt_ref: AttemptRef.optional().describe(
      "Renew the lease of the claim this attempt_ref names instead of starting a new attempt (same assignee).",
    ),
    supersede_uncertain_run: RunId.optional().describe(
      "The id of this task's lost run, after you inspected the tree: lets a new attempt start although that run's outcome is unknown. Audited.",
    ),
  })
  .strict();

const ClaimView = z
  .object({
    task_id: TaskId,
    attempt_id: AttemptId,
    attempt_ref: z.string(),
    assignee: z.string(),
    fence: z.number().int(),
    controller_generation: z.number().int(),
    lease_expires_at: Timestamp,
  })
  .strict();

export const StartAttemptOutput = ClaimView.extend({
  renewed: z.boolean(),
  superseded_run_id: RunId.optional(),
}).strict();

const TUPLE_FIELDS = ["task_id", "attempt_id", "assignee", "fence", "controller_generation"] as const;

export const StartTaskRunInput = z
  .object({
    project_id: ProjectId.describe("The task's project."),
    provider_id: ProviderId.describe("A provider id that project's Runner advertises (webcodex://projects)."),
    attempt_ref: AttemptRef.optional(),
    task_id: TaskId.optional(),
    attempt_id: AttemptId.optional(),
    assignee: Assignee.optional(),
    fence: Fence.optional(),
    controller_generation: Fence.optional(),
    config: ConfigMap.optional().describe("Provider config option values (allowed_config_options only)."),
    timeout_secs: z.number().int().min(MIN_RUN_TIMEOUT_SECS).max(MAX_RUN_TIMEOUT_SECS).optional(),
    workflow_session_id: SessionId.optional().describe(
      "Record this run's lifecycle in your workflow session on the same project.",
    ),
  })
  .strict()
  .superRefine((v, ctx) => {
    const tuple = TUPLE_FIELDS.filter((k) => v[k] !== undefined);
    if (v.attempt_ref !== undefined && tuple.length > 0) {
      ctx.addIssue({
        code: "custom",
        path: ["attempt_ref"],
        message: `give either attempt_ref or the claim tuple (${TUPLE_FIELDS.join(", ")}), not both`,
      });
    } else if (v.attempt_ref === undefined && tuple.length < TUPLE_FIELDS.length) {
      const missing = TUPLE_FIELDS.filter((k) => v[k] === undefined);
      ctx.addIssue({
        code: "custom",
        path: [missing[0] ?? "attempt_ref"],
        message: `required: attempt_ref, or all of ${TUPLE_FIELDS.join(", ")} (missing ${missing.join(", ")})`,
      });
    }
  });

export const StartTaskRunOutput = StartToolOutput.extend({ task_id: TaskId, attempt_id: AttemptId }).strict();

export const ReconcileInput = z
  .object({
    task_id: TaskId,
    attempt_id: AttemptId.optional().describe("Default: the task's current attempt."),
  })
  .strict();

const RunOutcome = RunStatusFields.extend({ reconciled_at: Timestamp }).strict();

const AttemptView = ClaimView.extend({
  state: z.enum(["active", "superseded", "closed"]),
  lease_live: z.boolean(),
  superseded_run_id: RunId.optional(),
  run: RunOutcome.nullable().describe("The attempt's run outcome; run completion is not task success."),
}).strict();

export const ReconcileOutput = z
  .object({ task: TaskView, attempt: AttemptView.nullable(), attempts: z.number().int() })
  .strict();

export const CloseTaskInput = z
  .object({
    task_id: TaskId,
    outcome: z.enum(TASK_OUTCOMES).describe("Your verdict on the work (after your own review and tests)."),
  })
  .strict();

export const CloseTaskOutput = z.object({ task: TaskView, already_closed: z.boolean() }).strict();

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
