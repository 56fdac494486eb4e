/**
 * The Workflow Session tools' contract (design §11): the session id, the bounds of a handoff and a goal, the
 * evidence kinds, and the closed input and exact output schemas of `create_workflow_session`,
 * `update_workflow_session` and `read_workflow_session`. The Server's tools (server sessions/tools.ts) check
 * with them and the CLI reads their results with them.
 */
import { z } from "zod";
import { utf8Length } from "../events.js";
import { ProjectId, RunId } from "../ids.js";

export const SESSION_TOOL_NAMES = {
  create: "create_workflow_session",
  update: "update_workflow_session",
  read: "read_workflow_session",
} as const;
export type SessionToolName = (typeof SESSION_TOOL_NAMES)[keyof typeof SESSION_TOOL_NAMES];

/**
 * The Workflow Session id (`wc_sess_` + 26 base32 characters) as a pattern and as the zod schema every
 * tool input uses (the run tools, the task tools and the audit name a session id with it).
 */
export const SESSION_ID_PATTERN = /^wc_sess_[a-z2-7]{26}$/;
export const SessionId = z.string().regex(SESSION_ID_PATTERN, "must be wc_sess_ followed by 26 base32 characters");

export const MAX_HANDOFF_BYTES = 16 * 1024;
export const MAX_GOAL_BYTES = 4 * 1024;

export const EVIDENCE_KINDS = [
  "coding_agent_started",
  "coding_agent_waiting_permission",
  "coding_agent_terminal",
] as const;
export type EvidenceKind = (typeof EVIDENCE_KINDS)[number];

// biome-ignore lint/suspicious/noControlCharactersInRegex: rejecting control characters is the point
const NoControl = /^[^\u0000-\u001f\u007f-\u009f]*$/;

const boundedText = (max: number, what: string) =>
  z
    .string()
    .max(max)
    .refine((s) => utf8Length(s) <= max, { message: `must be at most ${max} UTF-8 bytes` })
    .describe(`${what} (≤ ${max} UTF-8 bytes); replaces the current one and bumps its version.`);

export const CreateSessionInput = z
  .object({
    project_id: ProjectId,
    title: z.string().min(1).max(200).regex(NoControl, "must not contain control characters"),
  })
  .strict();

export const UpdateSessionInput = z
  .object({
    session_id: SessionId,
    handoff: boundedText(MAX_HANDOFF_BYTES, "The handoff for the next run").optional(),
    goal: boundedText(MAX_GOAL_BYTES, "The goal").optional(),
    expected_version: z
      .number()
      .int()
      .min(1)
      .optional()
      .describe("The session version you read; the update is refused (version_conflict) if it changed since."),
  })
  .strict()
  .refine((v) => v.handoff !== undefined || v.goal !== undefined, {
    message: "give handoff, goal or both",
    path: ["handoff"],
  });

export const ReadSessionInput = z
  .object({
    session_id: SessionId,
    after: z.number().int().min(0).optional().describe("Return evidence entries after this seq."),
  })
  .strict();

/** The output of create_workflow_session and update_workflow_session. */
export const SessionView = z
  .object({
    session_id: SessionId,
    project_id: ProjectId,
    title: z.string(),
    handoff: z.string(),
    handoff_version: z.number().int(),
    goal: z.string(),
    goal_version: z.number().int(),
    version: z.number().int(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .strict();

/** One evidence entry of a session (read_workflow_session): lifecycle facts of a run, never bodies. */
export const SessionEvidence = z
  .object({
    seq: z.number().int(),
    at: z.string(),
    kind: z.enum(EVIDENCE_KINDS),
    run_id: RunId,
    provider_id: z.string(),
    state: z.string(),
    execution_state: z.string(),
    stop_reason: z.string().optional(),
    failure_kind: z.string().optional(),
  })
  .strict();

export const ReadSessionOutput = SessionView.extend({
  evidence: z.array(SessionEvidence),
  evidence_dropped: z.number().int(),
  has_more: z.boolean(),
}).strict();
