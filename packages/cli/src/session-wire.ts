/** The shapes the CLI reads from the workflow-session tools (design §11), lenient like wire.ts. */
import { z } from "zod";

export const SessionResult = z.object({
  session_id: z.string(),
  project_id: z.string(),
  title: z.string(),
  handoff: z.string(),
  handoff_version: z.number(),
  goal: z.string(),
  goal_version: z.number(),
  version: z.number(),
});
export type SessionResult = z.infer<typeof SessionResult>;

export const SessionRead = SessionResult.extend({
  evidence: z.array(
    z.object({
      seq: z.number(),
      at: z.string(),
      kind: z.string(),
      run_id: z.string(),
      state: z.string(),
      stop_reason: z.string().optional(),
      failure_kind: z.string().optional(),
    }),
  ),
  evidence_dropped: z.number(),
  has_more: z.boolean(),
});
