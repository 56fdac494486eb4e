/**
 * The Workflow Session MCP tools (design §11), registered as a ToolModule
 * next to the run tools: `create_workflow_session`, `update_workflow_session`
 * (optimistic concurrency with expected_version), `read_workflow_session`.
 * Scopes are the service's to check: `runtime:write` / `runtime:read`, never
 * `coding_agent:run`.
 */
import { ProjectId, RunId, utf8Length } from "@webcodex/protocol";
import { z } from "zod";
import { fail, ok, parseToolInput, type ToolCallOutcome, type ToolModule, type ToolSpec } from "../mcp/tool-shared.js";
import type { Principal } from "../principals/principal.js";
import { SessionId } from "./ids.js";
import { MAX_GOAL_BYTES, MAX_HANDOFF_BYTES, type SessionService } from "./service.js";
import { EVIDENCE_KINDS } from "./store.js";

export const SESSION_TOOL_NAMES = {
  create: "create_workflow_session",
  update: "update_workflow_session",
  read: "read_workflow_session",
} as const;
type SessionToolName = (typeof SESSION_TOOL_NAMES)[keyof typeof SESSION_TOOL_NAMES];

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

const SessionView = z
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

const Evidence = z
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
  evidence: z.array(Evidence),
  evidence_dropped: z.number().int(),
  has_more: z.boolean(),
}).strict();

export const SESSION_TOOL_SPECS: readonly ToolSpec<SessionToolName>[] = [
  {
    name: SESSION_TOOL_NAMES.create,
    title: "Create a workflow session",
    description:
      "Create a bounded evidence and handoff ledger on a project (needs runtime:write). Pass its id as workflow_session_id " +
      "to record a run's lifecycle, or as context_session_id to start a run from its handoff. It grants no authority.",
    input: CreateSessionInput,
    output: SessionView,
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
  },
  {
    name: SESSION_TOOL_NAMES.update,
    title: "Update a workflow session's handoff or goal",
    description:
      "Replace the handoff (≤ 16 KiB) and/or goal (≤ 4 KiB); each bumps its version. With expected_version the update " +
      "is refused if the session changed since you read it.",
    input: UpdateSessionInput,
    output: SessionView,
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
  },
  {
    name: SESSION_TOOL_NAMES.read,
    title: "Read a workflow session",
    description:
      "The session's handoff, goal, versions and lifecycle evidence entries after `after` (bounded; has_more), " +
      "with the count of entries dropped past the bound. Needs runtime:read.",
    input: ReadSessionInput,
    output: ReadSessionOutput,
    annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  },
];

export class SessionTools implements ToolModule {
  readonly specs = SESSION_TOOL_SPECS;
  readonly #sessions: SessionService;

  constructor(sessions: SessionService) {
    this.#sessions = sessions;
  }

  async call(principal: Principal, name: string, args: unknown): Promise<ToolCallOutcome> {
    switch (name as SessionToolName) {
      case SESSION_TOOL_NAMES.create: {
        const input = parseToolInput(CreateSessionInput, args);
        if (!input.ok) return fail(input.error, null);
        const r = await this.#sessions.create(principal, input.value);
        return r.ok ? ok(SessionView.parse(r.value), null) : fail(r.error, null);
      }
      case SESSION_TOOL_NAMES.update: {
        const input = parseToolInput(UpdateSessionInput, args);
        if (!input.ok) return fail(input.error, null);
        const v = input.value;
        const r = await this.#sessions.update(principal, {
          session_id: v.session_id,
          ...(v.handoff !== undefined ? { handoff: v.handoff } : {}),
          ...(v.goal !== undefined ? { goal: v.goal } : {}),
          ...(v.expected_version !== undefined ? { expected_version: v.expected_version } : {}),
        });
        return r.ok ? ok(SessionView.parse(r.value), null) : fail(r.error, null);
      }
      case SESSION_TOOL_NAMES.read: {
        const input = parseToolInput(ReadSessionInput, args);
        if (!input.ok) return fail(input.error, null);
        const r = await this.#sessions.read(principal, {
          session_id: input.value.session_id,
          ...(input.value.after !== undefined ? { after: input.value.after } : {}),
        });
        return r.ok ? ok(ReadSessionOutput.parse(r.value), null) : fail(r.error, null);
      }
      default:
        throw new Error("unknown session tool");
    }
  }
}
