/**
 * The shapes the CLI reads from the Server's MCP tools and the projects resource (design §6.3). The run
 * vocabulary and the tools' output schemas come from the protocol package (`tools/runs.ts`), the same schemas
 * the Server's tools write their results with; every result is validated with them at the boundary, read
 * tolerantly (tolerant.ts) so that a Server one version apart does not break the CLI. An event the CLI cannot
 * read (a newer kind or body) is kept as `other` and rendered generically, never fatal.
 */
import {
  CancelToolOutput,
  type ConfigValue,
  isTerminalState,
  ObserveToolOutput,
  OUTSIDE_PROJECT_PATH,
  RunEvent as ProtocolRunEvent,
  RUN_STATES,
  RunState,
  type StartToolInput,
  StartToolOutput,
} from "@webcodex/protocol";
import { z } from "zod";
import { type Read, readAs, tolerant } from "./tolerant.js";

export { type ConfigValue, isTerminalState as isTerminal, OUTSIDE_PROJECT_PATH, RUN_STATES, RunState };

/** A field the protocol sends as `null` is absent for the CLI, which always read `null` as "not said". */
type NullAsAbsent<T> = T extends unknown
  ? { [K in keyof T as null extends T[K] ? never : K]: T[K] } & {
      [K in keyof T as null extends T[K] ? K : never]?: Exclude<T[K], null>;
    }
  : never;
export type KnownEvent = Read<NullAsAbsent<z.infer<typeof ProtocolRunEvent>>>;
export interface OtherEvent {
  seq: number;
  at: string;
  kind: "other";
  original_kind: string;
}
export type RunEvent = KnownEvent | OtherEvent;

/** Each event kind's protocol schema read tolerantly, and which of its fields the protocol lets be null. */
const EVENT_KINDS = new Map(
  ProtocolRunEvent.options.map((option) => {
    const shape = option.shape as Record<string, z.ZodType>;
    const nullable = Object.keys(shape).filter((key) => shape[key]?.safeParse(null).success === true);
    return [option.shape.kind.value as string, { schema: tolerant(option), nullable }];
  }),
);

/**
 * An event: its kind's protocol schema, where a nullable field may also be absent (both read as "not said"; a
 * Server may leave it out). An event the CLI cannot read is kept as `other`, never fatal.
 */
const AnyEvent = z.looseObject({ seq: z.number(), at: z.string(), kind: z.string() }).transform((raw): RunEvent => {
  const kind = EVENT_KINDS.get(raw.kind);
  if (kind !== undefined) {
    const filled: Record<string, unknown> = { ...raw };
    for (const key of kind.nullable) filled[key] ??= null;
    const known = kind.schema.safeParse(filled);
    if (known.success) {
      const fields = Object.entries(known.data as Record<string, unknown>).filter(([, v]) => v !== null);
      return Object.fromEntries(fields) as KnownEvent;
    }
  }
  return { seq: raw.seq, at: raw.at, kind: "other", original_kind: raw.kind };
});

export const StartResult = (tolerant(StartToolOutput) as z.ZodObject).extend({
  /** The run's MCP task (a task-backed start, MCP Tasks): `webcodex observe TASK_ID` follows it again later. */
  task_id: z.string().optional(),
}) as unknown as z.ZodType<Read<z.infer<typeof StartToolOutput>> & { task_id?: string }>;
export type StartResult = z.infer<typeof StartResult>;

/** What the CLI reads of observe's result: all of it but the effective config, which it does not show. */
const ObserveRead = ObserveToolOutput.omit({ effective_config: true });
export const Observation = (tolerant(ObserveRead) as z.ZodObject).extend({
  events: z.array(AnyEvent).default([]),
  // Fields a Server older than them does not send.
  history_lost: z.boolean().default(false),
  has_more: z.boolean().default(false),
}) as unknown as z.ZodType<Read<Omit<z.infer<typeof ObserveRead>, "events">> & { events: RunEvent[] }>;
export type Observation = z.infer<typeof Observation>;

export const CancelResult = readAs(CancelToolOutput);
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

const opt = <T extends z.ZodType>(schema: T) => schema.nullish().transform((v) => v ?? undefined);
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

/** What `start_coding_agent` takes (the protocol package's schema; the Server checks it). */
export type StartInput = z.input<typeof StartToolInput>;
