/**
 * Normalized run events (design §4.5). The Runner turns ACP `session/update`
 * notifications into these bounded bodies; nothing raw is forwarded.
 */
import { z } from "zod";
import {
  MAX_AGENT_STATE_ITEMS,
  MAX_EVENT_LABEL_BYTES,
  MAX_EVENT_TEXT_BYTES,
  MAX_MESSAGE_LENGTH,
  MAX_PERMISSION_OPTIONS,
  MAX_PLAN_ENTRIES,
} from "./bounds.js";
import { ExecutionState, FailureKindSchema, RunState, StopReason } from "./vocab.js";

export const EVENT_KINDS = [
  "agent_message",
  "reasoning",
  "plan",
  "tool_activity",
  "file_change",
  "terminal_activity",
  "usage",
  "permission_request",
  "agent_state",
  "terminal",
] as const;
export type EventKind = (typeof EVENT_KINDS)[number];

const utf8 = new TextEncoder();
export function utf8Length(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

/** A string whose UTF-8 length is at most `max` bytes. */
export const boundedText = (max: number) =>
  z.string().refine((s) => s.length <= max && utf8Length(s) <= max, { message: `must be at most ${max} UTF-8 bytes` });

/** Cut `text` to at most `maxBytes` UTF-8 bytes without splitting a character. */
export function truncateUtf8(text: string, maxBytes: number): { text: string; truncated: boolean } {
  if (text.length <= maxBytes / 3) return { text, truncated: false };
  const bytes = utf8.encode(text);
  if (bytes.byteLength <= maxBytes) return { text, truncated: false };
  let end = maxBytes;
  // Step back over UTF-8 continuation bytes (10xxxxxx) so no character is split.
  while (end > 0 && ((bytes[end] ?? 0) & 0xc0) === 0x80) end--;
  return { text: new TextDecoder().decode(bytes.subarray(0, end)), truncated: true };
}

const Text = boundedText(MAX_EVENT_TEXT_BYTES);
const Label = boundedText(MAX_EVENT_LABEL_BYTES);
const Seq = z.number().int().min(1);
const At = z.string().max(40);

const base = { seq: Seq, at: At };

export const AgentMessageEvent = z
  .object({ ...base, kind: z.literal("agent_message"), text: Text, truncated: z.boolean() })
  .strict();
export const ReasoningEvent = z
  .object({ ...base, kind: z.literal("reasoning"), text: Text, truncated: z.boolean() })
  .strict();
export const PlanEntry = z
  .object({
    content: Text,
    status: z.enum(["pending", "in_progress", "completed"]),
    priority: z.enum(["high", "medium", "low"]),
  })
  .strict();
export const PlanEvent = z
  .object({
    ...base,
    kind: z.literal("plan"),
    entries: z.array(PlanEntry).max(MAX_PLAN_ENTRIES),
    truncated: z.boolean(),
  })
  .strict();
export const TOOL_KINDS = [
  "read",
  "edit",
  "delete",
  "move",
  "search",
  "execute",
  "think",
  "fetch",
  "switch_mode",
  "other",
] as const;
export const TOOL_STATUSES = ["pending", "in_progress", "completed", "failed"] as const;
export const ToolActivityEvent = z
  .object({
    ...base,
    kind: z.literal("tool_activity"),
    tool_call_id: Label,
    title: Label,
    tool_kind: z.enum(TOOL_KINDS),
    status: z.enum(TOOL_STATUSES),
  })
  .strict();
/** `path` is relative to the project root; paths outside it are masked as OUTSIDE_PROJECT_PATH. */
export const OUTSIDE_PROJECT_PATH = "<outside project>";
export const FileChangeEvent = z
  .object({ ...base, kind: z.literal("file_change"), tool_call_id: Label, path: Label })
  .strict();
export const TerminalActivityEvent = z
  .object({ ...base, kind: z.literal("terminal_activity"), tool_call_id: Label, terminal_id: Label })
  .strict();
export const UsageEvent = z
  .object({
    ...base,
    kind: z.literal("usage"),
    used_tokens: z.number().int().min(0).nullable(),
    context_size: z.number().int().min(0).nullable(),
    cost_amount: z.number().min(0).nullable(),
    cost_currency: z.string().max(8).nullable(),
  })
  .strict();
export const PermissionOption = z
  .object({
    option_id: Label,
    name: Label,
    kind: z.enum(["allow_once", "allow_always", "reject_once", "reject_always"]),
  })
  .strict();
export const PermissionRequestEvent = z
  .object({
    ...base,
    kind: z.literal("permission_request"),
    tool_call_id: Label,
    title: Label,
    options: z.array(PermissionOption).max(MAX_PERMISSION_OPTIONS),
  })
  .strict();
/**
 * A change of the agent's own session state (ACP `current_mode_update`,
 * `config_option_update`, `available_commands_update`, `session_info_update`,
 * and Gemini's `[MODE_UPDATE] <mode>` message). `change` says which field is
 * set; each is the new current state (a snapshot, not a delta). Command
 * descriptions and input hints are not forwarded; `truncated` says a list was
 * cut to MAX_AGENT_STATE_ITEMS.
 */
export const AGENT_STATE_CHANGES = ["mode", "config_options", "commands", "session_info"] as const;
export const AgentStateConfigOption = z.object({ id: Label, value: z.union([Label, z.boolean()]) }).strict();
export const AgentStateEvent = z
  .object({
    ...base,
    kind: z.literal("agent_state"),
    change: z.enum(AGENT_STATE_CHANGES),
    mode_id: Label.optional(),
    config_options: z.array(AgentStateConfigOption).max(MAX_AGENT_STATE_ITEMS).optional(),
    commands: z.array(Label).max(MAX_AGENT_STATE_ITEMS).optional(),
    title: Label.nullable().optional(),
    truncated: z.boolean(),
  })
  .strict();
export const TerminalEvent = z
  .object({
    ...base,
    kind: z.literal("terminal"),
    state: RunState,
    execution_state: ExecutionState,
    stop_reason: StopReason.nullable(),
    failure_kind: FailureKindSchema.nullable(),
    message: z.string().max(MAX_MESSAGE_LENGTH),
  })
  .strict();

export const RunEvent = z.discriminatedUnion("kind", [
  AgentMessageEvent,
  ReasoningEvent,
  PlanEvent,
  ToolActivityEvent,
  FileChangeEvent,
  TerminalActivityEvent,
  UsageEvent,
  PermissionRequestEvent,
  AgentStateEvent,
  TerminalEvent,
]);
export type RunEvent = z.infer<typeof RunEvent>;
/** An event body before the ring assigns `seq` and `at`. */
export type RunEventBody = RunEvent extends infer E ? (E extends RunEvent ? Omit<E, "seq" | "at"> : never) : never;
