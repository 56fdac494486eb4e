/**
 * The shapes the CLI reads from the agent-task tools (design §10): the protocol package's output schemas
 * (`tools/tasks.ts`), which the Server's task tools write their results with, read tolerantly (tolerant.ts).
 */
import {
  CloseTaskOutput,
  CreateTaskOutput,
  ReconcileOutput,
  StartAttemptOutput,
  StartTaskRunOutput,
} from "@webcodex/protocol";
import type { z } from "zod";
import { readAs } from "./tolerant.js";

export const CreateTaskResult = readAs(CreateTaskOutput);
export type CreateTaskResult = z.infer<typeof CreateTaskResult>;

export const AttemptResult = readAs(StartAttemptOutput);
export type AttemptResult = z.infer<typeof AttemptResult>;

export const TaskRunResult = readAs(StartTaskRunOutput);
export type TaskRunResult = z.infer<typeof TaskRunResult>;

export const ReconcileResult = readAs(ReconcileOutput);
export type ReconcileResult = z.infer<typeof ReconcileResult>;

export const CloseTaskResult = readAs(CloseTaskOutput);
export type CloseTaskResult = z.infer<typeof CloseTaskResult>;
