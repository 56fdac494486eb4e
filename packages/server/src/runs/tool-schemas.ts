/**
 * Input and output schemas of the three run tools (DESIGN §6.3): closed zod objects (`.strict()`)
 * whose JSON Schema is what tools/list shows, and the exact shapes of their results. The tools
 * themselves: mcp/tools.ts.
 */

import {
  ConfigMap,
  EffectiveConfigEntry,
  ExecutionState,
  FailureKindSchema,
  MAX_EFFECTIVE_CONFIG_ENTRIES,
  MAX_OBSERVE_WAIT_SECS,
  MAX_PROMPT_BYTES,
  MAX_RUN_TIMEOUT_SECS,
  MIN_RUN_TIMEOUT_SECS,
  ProjectId,
  ProviderId,
  RecoveryKind,
  RunEvent,
  RunId,
  RunState,
  StopReason,
  utf8Length,
} from "@webcodex/protocol";
import { z } from "zod";
import { SessionId } from "../sessions/ids.js";
import { OpaqueKey } from "./api.js";

const Prompt = z
  .string()
  .min(1)
  .max(MAX_PROMPT_BYTES)
  .refine((s) => utf8Length(s) <= MAX_PROMPT_BYTES, { message: `must be at most ${MAX_PROMPT_BYTES} UTF-8 bytes` })
  .describe(`The task for the coding agent, at most ${MAX_PROMPT_BYTES} UTF-8 bytes.`);

export const StartToolInput = z
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
  })
  .strict();
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

/** A run's status as the tools report it: observe's output and an agent task attempt's run outcome extend it. */
export const RunStatusFields = z.object({
  run_id: RunId,
  state: RunState,
  execution_state: ExecutionState,
  stop_reason: StopReason.optional(),
  failure_kind: FailureKindSchema.optional(),
  recovery_kind: RecoveryKind,
  message: z.string().optional(),
});

export const ObserveToolOutput = RunStatusFields.extend({
  events: z.array(RunEvent),
  observation_token: z.string(),
  history_lost: z.boolean(),
  has_more: z.boolean(),
  runner_offline: z.boolean().optional(),
  effective_config: z.array(EffectiveConfigEntry).max(MAX_EFFECTIVE_CONFIG_ENTRIES),
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
