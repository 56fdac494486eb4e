/**
 * The shapes the CLI reads from the agent-task tools (design §10), lenient
 * like wire.ts: extra fields are kept out, missing optional ones are fine.
 */
import { z } from "zod";
import { RunState } from "./wire.js";

const TaskView = z.object({
  task_id: z.string(),
  project_id: z.string(),
  title: z.string().default(""),
  state: z.string(),
  outcome: z.string().optional(),
  current_attempt_id: z.string().optional(),
});

export const CreateTaskResult = TaskView.extend({ replayed: z.boolean() });
export type CreateTaskResult = z.infer<typeof CreateTaskResult>;

export const AttemptResult = z.object({
  task_id: z.string(),
  attempt_id: z.string(),
  attempt_ref: z.string(),
  assignee: z.string(),
  fence: z.number(),
  controller_generation: z.number(),
  lease_expires_at: z.string(),
  renewed: z.boolean().default(false),
  superseded_run_id: z.string().optional(),
});
export type AttemptResult = z.infer<typeof AttemptResult>;

export const TaskRunResult = z.object({
  run_id: z.string(),
  state: RunState,
  replayed: z.boolean(),
  task_id: z.string(),
  attempt_id: z.string(),
});
export type TaskRunResult = z.infer<typeof TaskRunResult>;

export const ReconcileResult = z.object({
  task: TaskView,
  attempts: z.number(),
  attempt: AttemptResult.omit({ renewed: true })
    .extend({
      state: z.string(),
      lease_live: z.boolean(),
      run: z
        .object({
          run_id: z.string(),
          state: RunState,
          stop_reason: z.string().optional(),
          failure_kind: z.string().optional(),
          message: z.string().optional(),
        })
        .nullable(),
    })
    .nullable(),
});
export type ReconcileResult = z.infer<typeof ReconcileResult>;

export const CloseTaskResult = z.object({ task: TaskView, already_closed: z.boolean() });
export type CloseTaskResult = z.infer<typeof CloseTaskResult>;
