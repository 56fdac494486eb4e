/**
 * The shape of the Runner's TOML configuration (design §4.1): the zod schema
 * with its bounds and defaults, and how a schema issue reads — file, TOML key
 * path and rule, never the offending value (ids excepted). config/config.ts runs the
 * schema, then the filesystem and cross-field checks.
 */
import {
  CONFIG_ID_PATTERN,
  didYouMean,
  LOCAL_ID_PATTERN,
  MAX_ALLOWED_CONFIG_OPTIONS,
  MAX_CONFIG_ENTRIES,
  MAX_CONFIG_VALUE_LENGTH,
  MAX_EVENT_LABEL_BYTES,
  MAX_PROJECTS,
  MAX_PROVIDERS,
  MAX_RUN_TIMEOUT_SECS,
  utf8Length,
  WORKSPACE_MODES,
} from "@webcodex/protocol";
import { z } from "zod";
import { ACCOUNT_NAME_PATTERN, MAX_RUN_AS_POOL_USERS } from "./run-as.js";
import { SANDBOX_MODES } from "./sandbox-tools.js";

/** Most argv entries an agent may be configured with, and the longest one. */
export const MAX_AGENT_ARGS = 64;
export const MAX_AGENT_ARG_BYTES = 4096;
/** Most env_from_env mappings per agent. */
export const MAX_ENV_MAPPINGS = 128;
/** Environment variable names (child and source side). */
export const ENV_NAME_PATTERN = /^[A-Za-z_][A-Za-z0-9_]*$/;
/**
 * Longest environment variable name: a missing source's name is part of the
 * run's terminal message, which the protocol bounds (MAX_MESSAGE_LENGTH).
 */
export const MAX_ENV_NAME_LENGTH = 128;

/** `[acp] binding_idle_days`: its default and bounds (process/user-bindings.ts recycles by it). */
export const DEFAULT_BINDING_IDLE_DAYS = 30;
export const MIN_BINDING_IDLE_DAYS = 1;
export const MAX_BINDING_IDLE_DAYS = 3650;

export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

// ---- schema -------------------------------------------------------------------

const idRule = "must match ^[a-z0-9][a-z0-9_-]{0,63}$";
const Id = z.string({ error: "must be a string" }).regex(LOCAL_ID_PATTERN, idRule);
const int = (min: number, max: number) =>
  z
    .number({ error: "must be an integer" })
    .int("must be an integer")
    .min(min, `must be at least ${min}`)
    .max(max, `must be at most ${max}`);
const NonEmpty = z.string({ error: "must be a string" }).min(1, "must not be empty");
const EnvName = z
  .string({ error: "must be a string" })
  .max(MAX_ENV_NAME_LENGTH, `must be at most ${MAX_ENV_NAME_LENGTH} characters`)
  .regex(ENV_NAME_PATTERN, "must be an environment variable name (^[A-Za-z_][A-Za-z0-9_]*$)");
const AccountName = z
  .string({ error: "must be a string" })
  .regex(ACCOUNT_NAME_PATTERN, "must be a user or group name (^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$)");
/**
 * `run_as`: one user name (a pool of one) or an array of 1..MAX_RUN_AS_POOL_USERS distinct
 * user names (a pool: one user per concurrent run, see process/user-pool.ts).
 */
const RunAsUsers = z
  .union([AccountName, z.array(AccountName)], {
    error: `must be a user name or an array of 1 to ${MAX_RUN_AS_POOL_USERS} user names`,
  })
  .superRefine((value, ctx) => {
    if (!Array.isArray(value)) return;
    if (value.length === 0) ctx.addIssue({ code: "custom", message: "must name at least one user" });
    if (value.length > MAX_RUN_AS_POOL_USERS) {
      ctx.addIssue({ code: "custom", message: `must name at most ${MAX_RUN_AS_POOL_USERS} users` });
    }
    value.forEach((name, i) => {
      if (value.indexOf(name) !== i) {
        ctx.addIssue({ code: "custom", path: [i], message: `${JSON.stringify(name)} is listed twice` });
      }
    });
  });
/** An ended worktree run's worktree is kept this long by default, and at most this long (design §16). */
export const DEFAULT_WORKSPACE_KEEP_SECS = 600;
export const MAX_WORKSPACE_KEEP_SECS = 7 * 86_400;

/** Spare worktrees kept per `worktree` project by default, and at most (design §16, workspace/spares.ts). */
export const DEFAULT_WORKTREE_SPARES = 1;
export const MAX_WORKTREE_SPARES = 8;

/** Longest `[acp] keep_agent_alive_secs`: a kept agent is a live process and a leased pool user, so an hour at most. */
export const MAX_KEEP_AGENT_ALIVE_SECS = 3600;
/** The identity the Runner commits a worktree run's leftover changes as (design §16). */
export const DEFAULT_WORKSPACE_AUTHOR = "WebCodex Runner <runner@webcodex.invalid>";
export const WORKSPACE_AUTHOR_PATTERN = /^([^<>\n\r\0]{1,100}) <([^<>\s]{1,200})>$/;
const WorkspaceAuthor = z
  .string({ error: "must be a string" })
  .regex(
    WORKSPACE_AUTHOR_PATTERN,
    'must be "Name <email>" (a name of 1-100 characters without < or >, an email without spaces)',
  );
const ConfigId = z
  .string()
  .regex(CONFIG_ID_PATTERN, "must be 1-128 characters of [A-Za-z0-9_.:/-] starting with a letter or digit");

const ForcedValue = z.union([z.string().max(MAX_CONFIG_VALUE_LENGTH), z.boolean()], {
  error: (issue) =>
    typeof issue.input === "number" || typeof issue.input === "bigint"
      ? "numeric values are not allowed (forced values are strings (select ids) or booleans)"
      : `must be a string of at most ${MAX_CONFIG_VALUE_LENGTH} characters or a boolean`,
});

/** A forced-config table: provider-defined ids → string (select id) or boolean; bounded. */
const ForcedTable = z
  .record(ConfigId, ForcedValue, { error: "must be a table" })
  .refine((m) => Object.keys(m).length <= MAX_CONFIG_ENTRIES, `must have at most ${MAX_CONFIG_ENTRIES} entries`)
  .default({});

const AgentSchema = z
  .object({
    id: Id,
    name: z
      .string({ error: "must be a string" })
      .min(1, "must not be empty")
      .refine((s) => utf8Length(s) <= MAX_EVENT_LABEL_BYTES, `must be at most ${MAX_EVENT_LABEL_BYTES} bytes`)
      .optional(),
    executable: NonEmpty,
    args: z
      .array(
        z
          .string({ error: "must be a string" })
          .refine((s) => utf8Length(s) <= MAX_AGENT_ARG_BYTES, `must be at most ${MAX_AGENT_ARG_BYTES} bytes`),
        { error: "must be an array of strings" },
      )
      .max(MAX_AGENT_ARGS, `must have at most ${MAX_AGENT_ARGS} entries`)
      .default([]),
    allowed_config_options: z
      .array(ConfigId, { error: "must be an array of strings" })
      .max(MAX_ALLOWED_CONFIG_OPTIONS, `must have at most ${MAX_ALLOWED_CONFIG_OPTIONS} entries`)
      .default([]),
    env_from_env: z
      .record(EnvName, EnvName, { error: 'must be a table of CHILD_NAME = "SOURCE_NAME"' })
      .refine((m) => Object.keys(m).length <= MAX_ENV_MAPPINGS, `must have at most ${MAX_ENV_MAPPINGS} entries`)
      .default({}),
    forced_config: ForcedTable,
    run_as: RunAsUsers.optional(),
    run_as_group: AccountName.optional(),
    continuation: z
      .enum(["none", "load", "resume", "both"], { error: "must be one of none, load, resume, both" })
      .default("none"),
  })
  .strict();

export const ConfigSchema = z
  .object({
    runner: z
      .object({
        state_dir: NonEmpty.default(".webcodex/runner"),
        log_level: z.enum(LOG_LEVELS, { error: `must be one of ${LOG_LEVELS.join(", ")}` }).default("info"),
        retain_terminal_days: int(1, 3650).default(7),
        retain_terminal_max: int(1, 1_000_000).default(1000),
        /** How long an ended worktree run's worktree stays after its change is recorded (design §16); 0: removed at once. */
        workspace_keep_secs: int(0, MAX_WORKSPACE_KEEP_SECS).default(DEFAULT_WORKSPACE_KEEP_SECS),
        /** Checkouts made ahead per `worktree` project, so a run's start needs none (design §16); 0: none. */
        worktree_spares: int(0, MAX_WORKTREE_SPARES).default(DEFAULT_WORKTREE_SPARES),
        /** Where runs' worktrees are made (default `<state_dir>/workspaces`); needed for run_as worktree runs. */
        workspaces_dir: NonEmpty.optional(),
      })
      .strict()
      .default({
        state_dir: ".webcodex/runner",
        log_level: "info",
        retain_terminal_days: 7,
        retain_terminal_max: 1000,
        workspace_keep_secs: DEFAULT_WORKSPACE_KEEP_SECS,
        worktree_spares: DEFAULT_WORKTREE_SPARES,
      }),
    server: z
      .object({
        url: z.string({ error: "must be a string" }).regex(/^wss?:\/\/[^\s]+$/, "must be a ws:// or wss:// URL"),
        token_env: EnvName.optional(),
        token_file: NonEmpty.optional(),
        /** PEM file of a private CA to trust for wss:// (besides the system CAs). */
        ca_file: NonEmpty.optional(),
        /** Allow ws:// (no TLS) to a host that is not loopback; warned at every connect. */
        allow_insecure_transport: z.boolean({ error: "must be a boolean" }).default(false),
      })
      .strict()
      .optional(),
    projects: z
      .array(
        z
          .object({
            id: Id,
            root: NonEmpty,
            allow_patch: z.boolean({ error: "must be a boolean" }).default(false),
            /**
             * The operator accepts that run_as runs of different callers share this project's tree (what one
             * writes, another's runs read and may execute). Without it the project serves the caller of its
             * first run only (runs/project-callers.ts).
             */
            shared_between_callers: z.boolean({ error: "must be a boolean" }).default(false),
            /** `worktree`: each run works in a git worktree of its own and its change is recorded (design §16). */
            workspace: z
              .enum(WORKSPACE_MODES, { error: `must be one of ${WORKSPACE_MODES.join(", ")}` })
              .default("shared"),
            /** Overrides `[acp] workspace_author` for this project. */
            workspace_author: WorkspaceAuthor.optional(),
          })
          .strict(),
        { error: "must be an array of tables ([[projects]])" },
      )
      .min(1, "must configure at least one [[projects]] entry")
      .max(MAX_PROJECTS, `must have at most ${MAX_PROJECTS} entries`),
    acp: z
      .object({
        max_concurrent_runs: int(1, 64).default(1),
        setup_timeout_secs: int(1, 3600).default(60),
        permission_timeout_secs: int(1, 86_400).default(120),
        cancel_grace_secs: int(1, 600).default(15),
        /** Seconds a completed run's agent is kept for a follow-up of it (runs/kept-agents.ts); 0: never kept. */
        keep_agent_alive_secs: int(0, MAX_KEEP_AGENT_ALIVE_SECS).default(0),
        default_run_timeout_secs: int(1, MAX_RUN_TIMEOUT_SECS).default(1800),
        max_run_timeout_secs: int(1, MAX_RUN_TIMEOUT_SECS).default(14_400),
        forced_config: ForcedTable,
        /**
         * The operator's explicit opt-in for agents without `run_as` (they run as the Runner's own user, can
         * read its token and stop it): without it such a Runner refuses to start (config/exposure.ts).
         */
        agents_share_runner_user: z.boolean({ error: "must be a boolean" }).default(false),
        /**
         * The operator's statement that every caller of this Runner may see every other caller's runs: run_as pool
         * users then serve any caller. Without it a pool user serves the caller of its first run only
         * (process/user-bindings.ts).
         */
        single_tenant: z.boolean({ error: "must be a boolean" }).default(false),
        /**
         * `namespaces`: every run_as agent gets its own mount and IPC namespace (process/sandbox.ts), and a
         * Runner that cannot make them refuses to start; `none`: the operator's explicit opt-out.
         */
        sandbox: z.enum(SANDBOX_MODES, { error: `must be one of ${SANDBOX_MODES.join(", ")}` }).default("namespaces"),
        /**
         * Most users of one agent's run_as pool one caller may be bound to (process/user-pool.ts); default:
         * half the pool, at least 1.
         */
        max_users_per_caller: int(1, MAX_RUN_AS_POOL_USERS).optional(),
        /** Days a pool user bound to a caller may go unused before it may be recycled for another caller. */
        binding_idle_days: int(MIN_BINDING_IDLE_DAYS, MAX_BINDING_IDLE_DAYS).default(DEFAULT_BINDING_IDLE_DAYS),
        /** A directory copied into a recycled pool user's new HOME (agent logins); relative to the config file. */
        home_template: NonEmpty.optional(),
        /** Who the Runner commits what a worktree run left uncommitted as (`Name <email>`). */
        workspace_author: WorkspaceAuthor.default(DEFAULT_WORKSPACE_AUTHOR),
        agents: z
          .array(AgentSchema, { error: "must be an array of tables ([[acp.agents]])" })
          .min(1, "must configure at least one [[acp.agents]] entry (there is no default agent)")
          .max(MAX_PROVIDERS, `must have at most ${MAX_PROVIDERS} entries`),
      })
      .strict(),
  })
  .strict();

export type RawConfig = z.infer<typeof ConfigSchema>;
// ---- issues ---------------------------------------------------------------------

function keyPath(path: ReadonlyArray<PropertyKey>): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out === "" ? "(root)" : out;
}

function valueAt(root: unknown, path: ReadonlyArray<PropertyKey>): unknown {
  let cur: unknown = root;
  for (const part of path) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[part];
  }
  return cur;
}

/** One line per schema issue: `file: key.path: rule`. */
export function describeIssues(file: string, raw: unknown, error: z.ZodError): string[] {
  const out: string[] = [];
  for (const issue of error.issues) {
    if (issue.code === "unrecognized_keys") {
      for (const key of issue.keys) {
        out.push(
          `${file}: ${keyPath([...issue.path, key])}: unknown key (not allowed)${didYouMean(ConfigSchema, issue.path, key)}`,
        );
      }
      continue;
    }
    if (issue.code === "invalid_key") {
      out.push(`${file}: ${keyPath(issue.path)}: ${issue.issues[0]?.message ?? "invalid key"}`);
      continue;
    }
    let message = issue.message;
    if (issue.code === "invalid_type" && valueAt(raw, issue.path) === undefined) message = "is required";
    // Echo the offending value only for ids, which are never secrets.
    const last = issue.path[issue.path.length - 1];
    const value = valueAt(raw, issue.path);
    const echo = last === "id" && typeof value === "string" && value.length <= 80 ? `${JSON.stringify(value)} ` : "";
    out.push(`${file}: ${keyPath(issue.path)}: ${echo}${message}`);
  }
  return out;
}
