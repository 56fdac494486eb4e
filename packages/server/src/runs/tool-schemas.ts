/**
 * Input and output schemas of the three run tools (design §6.3): closed zod objects (`.strict()`)
 * whose JSON Schema is what tools/list shows, and the exact shapes of their results. The tools
 * themselves: runs/tools.ts.
 */

import {
  EffectiveConfigEntry,
  ExecutionState,
  FailureKindSchema,
  MAX_EFFECTIVE_CONFIG_ENTRIES,
  MAX_OBSERVE_WAIT_SECS,
  RecoveryKind,
  RunEvent,
  RunId,
  RunState,
  StopReason,
} from "@webcodex/protocol";
import { z } from "zod";
import { SessionId } from "../sessions/ids.js";
import { StartInput } from "./api.js";

/** start_coding_agent: the run core's StartInput plus the Workflow-Session selectors (sessions/service.ts resolves them). */
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
});

export const ObserveToolOutput = RunStatusFields.extend({
  events: z.array(RunEvent),
  observation_token: z.string(),
  history_lost: z.boolean(),
  has_more: z.boolean(),
  runner_offline: z.boolean().optional(),
  effective_config: z.array(EffectiveConfigEntry).max(MAX_EFFECTIVE_CONFIG_ENTRIES),
  started_at: z.string().max(MAX_TIMESTAMP_CHARS).optional(),
  ended_at: z.string().max(MAX_TIMESTAMP_CHARS).optional(),
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
