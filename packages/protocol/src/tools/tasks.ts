/**
 * The managed-path tools' contract (design §10): task and attempt ids, the bounds of a title, an assignee, an
 * attempt_ref and a lease, the task outcomes, and the closed input and exact output schemas of the five agent-task
 * tools. The Server's tools (server tasks/tools.ts) check with them and the CLI reads their results with them.
 */
import { z } from "zod";
import { MAX_PROMPT_BYTES, MAX_RUN_TIMEOUT_SECS, MIN_RUN_TIMEOUT_SECS } from "../bounds.js";
import { utf8Length } from "../events.js";
import { ConfigMap } from "../frames.js";
import { ProjectId, ProviderId, RunId } from "../ids.js";
import { BaseRef } from "../workspace.js";
import { OpaqueKey, RunChainFields, RunStatusFields, StartToolOutput } from "./runs.js";
import { SessionId } from "./sessions.js";

export const TASK_TOOL_NAMES = {
  create: "create_agent_task",
  attempt: "start_agent_task_attempt",
  run: "start_agent_task_coding_run",
  reconcile: "reconcile_agent_task_coding_run",
  close: "close_agent_task",
} as const;
export type TaskToolName = (typeof TASK_TOOL_NAMES)[keyof typeof TASK_TOOL_NAMES];

export const TASK_ID_PATTERN = /^wc_task_[a-z2-7]{26}$/;
export const ATTEMPT_ID_PATTERN = /^wc_attempt_[a-z2-7]{26}$/;
/** Longest attempt_ref the Server issues or reads (the assignee is ≤ 128 bytes). */
export const MAX_ATTEMPT_REF_LENGTH = 512;
export const MAX_TITLE_LENGTH = 200;
export const MAX_ASSIGNEE_LENGTH = 128;
export const MIN_LEASE_SECS = 1;
export const MAX_LEASE_SECS = 3600;

export const TASK_OUTCOMES = ["succeeded", "failed", "abandoned"] as const;
export type TaskOutcome = (typeof TASK_OUTCOMES)[number];

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

/** A task as every task tool shows it. */
export const TaskView = z
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
    base_ref: BaseRef.optional(),
    continue_run_id: RunId.optional().describe(
      "Continue the conversation of this earlier run of yours (a terminal run on the task's project and this provider): the agent resumes that run's session, then gets the task's instruction. The same rules and refusals as start_coding_agent's continue_run_id.",
    ),
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

const RunOutcome = RunStatusFields.extend({
  reconciled_at: Timestamp,
  ...RunChainFields,
}).strict();

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
