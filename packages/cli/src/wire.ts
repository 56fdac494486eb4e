/**
 * The shapes the CLI reads from the Server's MCP tools and the projects
 * resource (design §6.3). The CLI talks MCP only and does not import the
 * protocol package, so it keeps this small local copy and validates every
 * result at the boundary. Schemas are lenient about extra fields so a newer
 * Server does not break an older CLI; unknown event kinds are kept as
 * `other` and rendered generically.
 */
import { z } from "zod";

export const RUN_STATES = [
  "starting",
  "running",
  "waiting_permission",
  "completed",
  "failed",
  "cancelled",
  "lost",
] as const;
export const RunState = z.enum(RUN_STATES);
export type RunState = z.infer<typeof RunState>;

/** The path a file_change event carries for a file outside the project root (the Runner masks it). */
export const OUTSIDE_PROJECT_PATH = "<outside project>";

const TERMINAL: ReadonlySet<RunState> = new Set<RunState>(["completed", "failed", "cancelled", "lost"]);
export function isTerminal(state: RunState): boolean {
  return TERMINAL.has(state);
}

const opt = <T extends z.ZodType>(schema: T) => schema.nullish().transform((v) => v ?? undefined);

const base = { seq: z.number().int(), at: z.string() };

const AgentMessage = z.object({
  ...base,
  kind: z.literal("agent_message"),
  text: z.string(),
  truncated: opt(z.boolean()),
});
const Reasoning = z.object({ ...base, kind: z.literal("reasoning"), text: z.string(), truncated: opt(z.boolean()) });
const Plan = z.object({
  ...base,
  kind: z.literal("plan"),
  entries: z.array(z.object({ content: z.string(), status: z.string(), priority: opt(z.string()) })),
  truncated: opt(z.boolean()),
});
const ToolActivity = z.object({
  ...base,
  kind: z.literal("tool_activity"),
  tool_call_id: z.string(),
  title: z.string(),
  tool_kind: opt(z.string()),
  status: z.string(),
});
const FileChange = z.object({
  ...base,
  kind: z.literal("file_change"),
  tool_call_id: opt(z.string()),
  path: z.string(),
});
const TerminalActivity = z.object({
  ...base,
  kind: z.literal("terminal_activity"),
  tool_call_id: opt(z.string()),
  terminal_id: z.string(),
});
const Usage = z.object({
  ...base,
  kind: z.literal("usage"),
  used_tokens: opt(z.number()),
  context_size: opt(z.number()),
  cost_amount: opt(z.number()),
  cost_currency: opt(z.string()),
});
const PermissionRequest = z.object({
  ...base,
  kind: z.literal("permission_request"),
  tool_call_id: opt(z.string()),
  title: z.string(),
  options: z.array(z.object({ option_id: opt(z.string()), name: z.string(), kind: opt(z.string()) })).default([]),
});
const AgentState = z.object({
  ...base,
  kind: z.literal("agent_state"),
  change: z.string(),
  mode_id: opt(z.string()),
  config_options: opt(z.array(z.object({ id: z.string(), value: z.union([z.string(), z.boolean()]) }))),
  commands: opt(z.array(z.string())),
  title: opt(z.string()),
  truncated: opt(z.boolean()),
});
const Terminal = z.object({
  ...base,
  kind: z.literal("terminal"),
  state: RunState,
  execution_state: z.string(),
  stop_reason: opt(z.string()),
  failure_kind: opt(z.string()),
  message: opt(z.string()),
});
const KnownEvent = z.discriminatedUnion("kind", [
  AgentMessage,
  Reasoning,
  Plan,
  ToolActivity,
  FileChange,
  TerminalActivity,
  Usage,
  PermissionRequest,
  AgentState,
  Terminal,
]);
export type KnownEvent = z.infer<typeof KnownEvent>;
export interface OtherEvent {
  seq: number;
  at: string;
  kind: "other";
  original_kind: string;
}
export type RunEvent = KnownEvent | OtherEvent;

/** An event the CLI cannot read (a newer kind or body) is kept as `other`, never fatal. */
const AnyEvent = z.looseObject({ ...base, kind: z.string() }).transform((raw): RunEvent => {
  const known = KnownEvent.safeParse(raw);
  if (known.success) return known.data;
  return { seq: raw.seq, at: raw.at, kind: "other", original_kind: raw.kind };
});

export const StartResult = z.object({
  run_id: z.string(),
  state: RunState,
  execution_state: z.string(),
  replayed: z.boolean(),
  observation_token: z.string(),
  /** The run's MCP task (a task-backed start): `webcodex observe TASK_ID` follows it again later. */
  task_id: z.string().optional(),
});
export type StartResult = z.infer<typeof StartResult>;

export const Observation = z.object({
  run_id: z.string(),
  state: RunState,
  execution_state: z.string(),
  stop_reason: opt(z.string()),
  failure_kind: opt(z.string()),
  recovery_kind: z.string().default("none"),
  message: opt(z.string()),
  events: z.array(AnyEvent).default([]),
  observation_token: z.string(),
  history_lost: z.boolean().default(false),
  has_more: z.boolean().default(false),
  runner_offline: opt(z.boolean()),
  /** The run's admission and end on the Runner's clock (ISO 8601); absent while unknown. */
  started_at: opt(z.string()),
  ended_at: opt(z.string()),
});
export type Observation = z.infer<typeof Observation>;

export const CancelResult = z.object({
  run_id: z.string(),
  state: RunState,
  cancel_requested: z.boolean(),
  already_terminal: z.boolean(),
});
export type CancelResult = z.infer<typeof CancelResult>;

/** A scope name as the Server spells them (`coding_agent:run`, `runtime:write`). */
const SCOPE_NAME = /^[a-z_]{1,32}:[a-z_]{1,32}$/;
/** More than this many missing scopes is not an answer this CLI knows how to advise on. */
const MAX_MISSING_SCOPES = 8;
export const ToolErrorBody = z.object({
  error: z.object({
    code: z.string(),
    message: z.string(),
    recovery_kind: z.string().default("none"),
    /** On `forbidden` for want of scopes: the scopes this token lacks (anything else in it is ignored). */
    missing_scopes: z.array(z.string().regex(SCOPE_NAME)).max(MAX_MISSING_SCOPES).optional().catch(undefined),
  }),
});

const ProviderView = z.object({
  provider_id: z.string(),
  name: z.string().default(""),
  allowed_config_options: z.array(z.string()).default([]),
});
export const ProjectView = z.object({
  project_id: z.string(),
  runner_online: z.boolean(),
  allow_patch: opt(z.boolean()),
  /** true: the Runner's agents run as its own OS user; null/absent: offline, not stated, or an older Server. */
  agents_share_runner_user: z.boolean().nullish(),
  providers: z.array(ProviderView).default([]),
});
export type ProjectView = z.infer<typeof ProjectView>;
/** The projects resource is either a bare list or `{ projects: [...] }`. */
export const ProjectsResource = z
  .union([z.array(ProjectView), z.object({ projects: z.array(ProjectView) })])
  .transform((v) => (Array.isArray(v) ? v : v.projects));

export type ConfigValue = string | boolean;
export interface StartInput {
  project_id: string;
  provider_id: string;
  idempotency_key: string;
  prompt: string;
  config?: Record<string, ConfigValue>;
  timeout_secs?: number;
  /** Record the run's lifecycle in this workflow session. */
  workflow_session_id?: string;
  /** Quote this workflow session's handoff and goal before the prompt. */
  context_session_id?: string;
  /** The context session's version the caller reviewed; another current version refuses the start. */
  context_session_version?: number;
}
