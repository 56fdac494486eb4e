/**
 * The run tools' contract (design §6.3): the run core's start input, the closed input schemas of
 * `start_coding_agent`, `observe_coding_agent` and `cancel_coding_agent` (their JSON Schema is what tools/list
 * shows) and the exact shapes of their results. The Server's tools (server runs/tools.ts) check with them and the
 * CLI reads their results with them.
 */
import { z } from "zod";
import {
  MAX_EFFECTIVE_CONFIG_ENTRIES,
  MAX_OBSERVE_WAIT_SECS,
  MAX_PROMPT_BYTES,
  MAX_RUN_TIMEOUT_SECS,
  MIN_RUN_TIMEOUT_SECS,
} from "../bounds.js";
import { RunEvent, utf8Length } from "../events.js";
import { ConfigMap, EffectiveConfigEntry, RunUsage } from "../frames.js";
import { ProjectId, ProviderId, RunId } from "../ids.js";
import { ExecutionState, FailureKindSchema, RecoveryKind, RunState, StopReason } from "../vocab.js";
import { BaseRef, RunWorkspace } from "../workspace.js";
import { SessionId } from "./sessions.js";

export const RUN_TOOL_NAMES = {
  start: "start_coding_agent",
  observe: "observe_coding_agent",
  cancel: "cancel_coding_agent",
} as const;
export type RunToolName = (typeof RUN_TOOL_NAMES)[keyof typeof RUN_TOOL_NAMES];

/**
 * The one rule for caller-chosen opaque strings (idempotency keys, workflow session ids): 1-128 printable
 * ASCII characters without spaces. Every tool schema that takes such a string uses it.
 */
export const MAX_OPAQUE_KEY_LENGTH = 128;
export const OPAQUE_KEY_RULE = `1-${MAX_OPAQUE_KEY_LENGTH} printable ASCII characters without spaces`;
export const OpaqueKey = z
  .string()
  .min(1)
  .max(MAX_OPAQUE_KEY_LENGTH)
  .regex(/^[\x21-\x7e]+$/, `must be ${OPAQUE_KEY_RULE}`);

const Prompt = z
  .string()
  .min(1)
  .max(MAX_PROMPT_BYTES)
  .refine((s) => utf8Length(s) <= MAX_PROMPT_BYTES, { message: `must be at most ${MAX_PROMPT_BYTES} UTF-8 bytes` })
  .describe(`The task for the coding agent, at most ${MAX_PROMPT_BYTES} UTF-8 bytes.`);

/**
 * The run core's start input and its only validator. start_coding_agent's schema (StartToolInput) extends it
 * with the Workflow-Session selectors, which the MCP tools resolve and never pass on; every other caller of the
 * Server's `RunsApi.start` (the test API) parses with it. After it, the run core trusts the types.
 */
export const StartInput = z
  .object({
    project_id: ProjectId.describe("A project id from the webcodex://projects resource."),
    provider_id: ProviderId.describe("A provider id that project's Runner advertises (webcodex://projects)."),
    idempotency_key: OpaqueKey.describe(
      "Chosen by you, unique per intended run. Retrying with the same key and the same inputs returns the same run instead of starting a second one.",
    ),
    prompt: Prompt,
    config: ConfigMap.optional().describe(
      "Provider config option values (only ids the provider lists in allowed_config_options).",
    ),
    timeout_secs: z
      .number({ error: (issue) => (issue.code === "invalid_type" ? "must be an integer" : undefined) })
      .int({ error: "must be an integer" })
      .min(MIN_RUN_TIMEOUT_SECS)
      .max(MAX_RUN_TIMEOUT_SECS)
      .optional()
      .describe("Run deadline; the Runner clamps it to its own maximum."),
    base_ref: BaseRef.optional(),
    continue_run_id: RunId.optional().describe(
      "Continue the conversation of this earlier run of yours: a terminal run on the same project and provider. The new run resumes that run's agent session (the agent remembers the earlier turns), then gets this prompt. One follow-up per run: a second one with another idempotency key is refused (continuation_conflict); an agent that cannot resume sessions is refused (continuation_unsupported). Nothing starts on a refusal.",
    ),
  })
  .strict();
export type StartInput = z.infer<typeof StartInput>;

/** start_coding_agent: the run core's StartInput plus the Workflow-Session selectors (the Server's sessions/service.ts resolves them). */
export const StartToolInput = StartInput.extend({
  workflow_session_id: SessionId.optional().describe(
    "Record this run's lifecycle (started, waiting for permission, terminal; never bodies) in your workflow session on the same project.",
  ),
  context_session_id: SessionId.optional().describe(
    "Start from your workflow session's handoff and goal on the same project (needs runtime:read): quoted before the prompt as context, not instructions.",
  ),
  context_session_version: z
    .number({ error: (issue) => (issue.code === "invalid_type" ? "must be an integer" : undefined) })
    .int({ error: "must be an integer" })
    .min(1)
    .max(Number.MAX_SAFE_INTEGER)
    .optional()
    .describe(
      "The context session's `version` you reviewed (read_workflow_session). If the session is at another version now, nothing starts (context_version_conflict). Needs context_session_id.",
    ),
}).strict();
export type StartToolInput = z.infer<typeof StartToolInput>;

export const StartToolOutput = z
  .object({
    run_id: RunId,
    state: RunState,
    execution_state: ExecutionState,
    replayed: z.boolean(),
    observation_token: z.string(),
  })
  .strict();

export const ObserveToolInput = z
  .object({
    run_id: RunId,
    after_observation_token: z
      .string()
      .min(1)
      .max(1024)
      .optional()
      .describe("The observation_token of the previous result for this run; omit for a bounded baseline."),
    wait_secs: z
      .number()
      .min(0)
      .max(MAX_OBSERVE_WAIT_SECS)
      .optional()
      .describe(
        `Wait up to this long (≤ ${MAX_OBSERVE_WAIT_SECS}) for something new; returns as soon as anything exists.`,
      ),
  })
  .strict();
export type ObserveToolInput = z.infer<typeof ObserveToolInput>;

/** Longest ISO-8601 time a result carries (the protocol's Timestamp bound). */
const MAX_TIMESTAMP_CHARS = 40;

/** A run's status as the tools report it: observe's output and an agent task attempt's run outcome extend it. */
export const RunStatusFields = z.object({
  run_id: RunId,
  state: RunState,
  execution_state: ExecutionState,
  stop_reason: StopReason.optional(),
  failure_kind: FailureKindSchema.optional(),
  recovery_kind: RecoveryKind,
  message: z.string().optional(),
  usage: RunUsage.optional().describe(
    "The latest context usage and cost the agent reported (ACP usage_update): token counts, amount and ISO 4217 currency; absent until it reported any.",
  ),
});

/**
 * Continuation (design §17): the run this one continues, and the run that continues it. One definition for
 * every output that names a run's chain (observe, a managed task attempt's run).
 */
export const RunChainFields = {
  parent_run_id: RunId.optional(),
  continued_by: RunId.optional(),
};

export const ObserveToolOutput = RunStatusFields.extend({
  events: z.array(RunEvent),
  observation_token: z.string(),
  history_lost: z.boolean(),
  has_more: z.boolean(),
  runner_offline: z.boolean().optional(),
  effective_config: z.array(EffectiveConfigEntry).max(MAX_EFFECTIVE_CONFIG_ENTRIES),
  /** The run's admission and end on the Runner's clock (ISO 8601); absent while unknown. */
  started_at: z.string().max(MAX_TIMESTAMP_CHARS).optional(),
  ended_at: z.string().max(MAX_TIMESTAMP_CHARS).optional(),
  workspace: RunWorkspace.optional().describe(
    "A run of a `worktree` project: the commit its checkout started from, its branch, and once its change is recorded the branch's head (get_coding_agent_changes shows it).",
  ),
  ...RunChainFields,
}).strict();

export const CancelToolInput = z.object({ run_id: RunId }).strict();
export type CancelToolInput = z.infer<typeof CancelToolInput>;

export const CancelToolOutput = z
  .object({
    run_id: RunId,
    state: RunState,
    cancel_requested: z.boolean(),
    already_terminal: z.boolean(),
  })
  .strict();
