/**
 * The three model-facing MCP tools (DESIGN §6.3): closed zod input schemas,
 * exact output schemas, and one `call()` that validates, checks authority,
 * calls the RunsApi and writes an audit row. Transport-free: mcp-http.ts and
 * the tests drive it with an already-authenticated Principal.
 *
 * Results are `structuredContent` plus the same JSON as one text block.
 * Tool-level errors are `isError: true` results whose text is
 * `{"error":{code,message,recovery_kind}}` and which carry no
 * structuredContent (it would not match the tool's outputSchema, and the
 * SDK client validates structuredContent against it).
 */

import type { CallToolResult, ReadResourceResult, Tool } from "@modelcontextprotocol/sdk/types.js";
import {
  ConfigMap,
  ConfigOptionId,
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
import type { Logger } from "pino";
import { z } from "zod";
import type { AuditLog, AuditOutcome } from "./audit.js";
import { type AuditSubjects, auditSubjects, NO_SUBJECTS } from "./audit-subjects.js";
import { checkStartGrant, checkToolScope } from "./authority.js";
import { readProjectsResource } from "./mcp-resource.js";
import type { ObserveLimits } from "./observe-limits.js";
import {
  type AdmissionHooks,
  type ApiError,
  type ApiResult,
  OpaqueKey,
  type Principal,
  type RunsApi,
} from "./runs-api.js";
import { SESSION_ID_PATTERN } from "./session-service.js";
import { checkArgumentShape } from "./tool-arguments.js";

export const TOOL_NAMES = {
  start: "start_coding_agent",
  observe: "observe_coding_agent",
  cancel: "cancel_coding_agent",
} as const;
export type ToolName = (typeof TOOL_NAMES)[keyof typeof TOOL_NAMES];

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
    workflow_session_id: z
      .string()
      .regex(SESSION_ID_PATTERN, "must be wc_sess_ followed by 26 base32 characters")
      .optional()
      .describe(
        "Record this run's lifecycle (started, waiting for permission, terminal; never bodies) in your workflow session on the same project.",
      ),
    context_session_id: z
      .string()
      .regex(SESSION_ID_PATTERN, "must be wc_sess_ followed by 26 base32 characters")
      .optional()
      .describe(
        "Start from your workflow session's handoff and goal on the same project (needs runtime:read): quoted before the prompt as context, not instructions.",
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

export interface ToolSpec<N extends string = ToolName> {
  name: N;
  title: string;
  description: string;
  input: z.ZodType;
  output: z.ZodType;
  annotations: NonNullable<Tool["annotations"]>;
}

const TOOL_SPECS: readonly ToolSpec[] = [
  {
    name: TOOL_NAMES.start,
    title: "Start a coding agent run",
    description:
      "Hand a coding task to an operator-configured ACP coding agent working in a registered project. " +
      "Returns a run_id and an observation_token; follow the run with observe_coding_agent. " +
      "Never starts the same idempotency_key twice: a retry with identical inputs returns the original run (replayed: true). " +
      "Discover project and provider ids by reading the webcodex://projects resource.",
    input: StartToolInput,
    output: StartToolOutput,
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  },
  {
    name: TOOL_NAMES.observe,
    title: "Observe a coding agent run",
    description:
      "Return the run's state and the events new since after_observation_token, then a fresh observation_token. " +
      "With wait_secs, waits once for anything new. has_more means call again at once. " +
      "history_lost means older events are gone; the state is still authoritative.",
    input: ObserveToolInput,
    output: ObserveToolOutput,
    annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  },
  {
    name: TOOL_NAMES.cancel,
    title: "Cancel a coding agent run",
    description:
      "Ask the run's agent to stop. Idempotent; a terminal run is reported as already_terminal. " +
      "Observe the run to see it reach cancelled.",
    input: CancelToolInput,
    output: CancelToolOutput,
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
  },
];

function jsonSchema(schema: z.ZodType, io: "input" | "output"): Tool["inputSchema"] {
  // draft-7 like the SDK's own McpServer, so SDK clients (Ajv) validate it as-is.
  return z.toJSONSchema(schema, { target: "draft-7", io }) as Tool["inputSchema"];
}

/** A tools/list entry for one spec: input and output schema. */
export function toolDefinition(spec: ToolSpec<string>): Tool {
  return {
    name: spec.name,
    title: spec.title,
    description: spec.description,
    inputSchema: jsonSchema(spec.input, "input"),
    outputSchema: jsonSchema(spec.output, "output") as NonNullable<Tool["outputSchema"]>,
    annotations: spec.annotations,
  };
}

let definitions: Tool[] | null = null;

/** The three run tools, each with input and output schema (computed once). */
export function toolDefinitions(): Tool[] {
  definitions ??= TOOL_SPECS.map(toolDefinition);
  return definitions;
}

/**
 * More tools registered next to the run tools (agent tasks, workflow sessions), each in its own
 * file. Calls go through McpTools.call, so they get the same error envelope, the same
 * catch-all for unexpected failures and one audit row each.
 */
export interface ToolModule {
  readonly specs: readonly ToolSpec<string>[];
  call(principal: Principal, name: string, args: unknown, signal?: AbortSignal): Promise<ToolCallOutcome>;
}

export function isToolName(name: string): name is ToolName {
  return TOOL_SPECS.some((s) => s.name === name);
}

/** Default recovery advice for codes raised by this layer. */
const RECOVERY_FOR: Record<ApiError["code"], z.infer<typeof RecoveryKind>> = {
  unauthorized: "none",
  forbidden: "none",
  not_found: "none",
  invalid_input: "fix_input",
  idempotency_conflict: "fix_input",
  runner_unavailable: "retry_same",
  provider_unavailable: "fix_input",
  stale_runner: "retry_same",
  stale_provider: "retry_same",
  capacity: "retry_same",
  start_in_progress: "retry_same",
  invalid_observation_token: "reobserve",
  too_many_observers: "wait",
  stale_claim: "reconcile",
  claim_conflict: "wait",
  version_conflict: "reobserve",
  internal: "none",
};

export function apiError(code: ApiError["code"], message: string): ApiError {
  return { code, message, recovery_kind: RECOVERY_FOR[code] };
}

/** Unknown or config key names are cut to this many characters in error messages... */
export const MAX_ECHOED_KEY_LENGTH = 64;
/** ...and at most this many unknown keys are named ("and N more" for the rest). */
export const MAX_ECHOED_UNKNOWN_KEYS = 8;

function cutKey(key: string): string {
  return key.length > MAX_ECHOED_KEY_LENGTH ? `${key.slice(0, MAX_ECHOED_KEY_LENGTH)}…` : key;
}

/** A field path for a message: schema field names as they are; a config key only when it is a valid option id. */
function describePath(path: readonly PropertyKey[]): string {
  return path
    .map((seg, i) => {
      const name = String(seg);
      if (i === 1 && path[0] === "config" && !ConfigOptionId.safeParse(name).success) return "<invalid option id>";
      return cutKey(name);
    })
    .join(".");
}

/**
 * Turn a zod failure into one secret-free message. Unknown keys come first and
 * are named (each cut to MAX_ECHOED_KEY_LENGTH, at most MAX_ECHOED_UNKNOWN_KEYS of
 * them); otherwise the first issue's field path and reason. Input values are never echoed.
 */
export function describeInputError(error: z.ZodError, args?: unknown): string {
  const unknown: string[] = [];
  for (const issue of error.issues) {
    if (issue.code === "unrecognized_keys") {
      const prefix = issue.path.length > 0 ? `${describePath(issue.path)}.` : "";
      for (const key of issue.keys) unknown.push(`${prefix}${cutKey(key)}`);
    }
  }
  if (unknown.length > 0) {
    const shown = unknown.slice(0, MAX_ECHOED_UNKNOWN_KEYS).map((k) => `'${k}'`);
    const more = unknown.length - shown.length;
    const names = more > 0 ? `${shown.join(", ")} and ${more} more` : shown.join(", ");
    return `unknown field${unknown.length > 1 ? "s" : ""} ${names} not allowed`;
  }
  const issue = error.issues[0];
  if (!issue) return "invalid arguments";
  const path = issue.path.length > 0 ? describePath(issue.path) : "arguments";
  let reason = issue.message;
  if (issue.code === "invalid_type") {
    // zod does not keep the input on an issue: look the field up to tell "missing" from "wrong type".
    if (valueAt(args, issue.path) === undefined) reason = "required";
    else if (reason.startsWith("Invalid input: expected ")) reason = `must be ${withArticle(issue.expected)}`;
  }
  if (issue.code === "too_big" && path === "prompt") reason = `must be at most ${MAX_PROMPT_BYTES} UTF-8 bytes`;
  return `${path}: ${reason}`;
}

/** The value at a zod issue path inside `root`, or undefined (own properties only). */
function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let cur = root;
  for (const seg of path) {
    if (typeof cur !== "object" || cur === null || !Object.hasOwn(cur, seg)) return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[seg];
  }
  return cur;
}

function withArticle(expected: string): string {
  if (expected === "int") return "an integer";
  return /^[aeiou]/.test(expected) ? `an ${expected}` : `a ${expected}`;
}

export function parseToolInput<T>(schema: z.ZodType<T>, args: unknown): ApiResult<T> {
  const result = schema.safeParse(args ?? {});
  if (result.success) return { ok: true, value: result.data };
  return { ok: false, error: apiError("invalid_input", describeInputError(result.error, args ?? {})) };
}

/** UTF-8 size of the arguments as JSON; 0 when they cannot be serialized (refused by their shape first). */
function jsonBytes(value: unknown, shapeOk: boolean): number {
  if (value === undefined || !shapeOk) return 0;
  try {
    return utf8Length(JSON.stringify(value));
  } catch {
    return 0;
  }
}

export function successResult(value: Record<string, unknown>): CallToolResult {
  return { content: [{ type: "text", text: JSON.stringify(value) }], structuredContent: value };
}

export function errorResult(error: ApiError & { available_providers?: unknown }): CallToolResult {
  return { content: [{ type: "text", text: JSON.stringify({ error }) }], isError: true };
}

/**
 * What start_coding_agent asks of Workflow Sessions (session-service.ts), checked before anything
 * reaches the run core: the recorder and context selectors, and the prompt with quoted context.
 */
export interface StartHooks {
  prepare(
    principal: Principal,
    input: { project_id: string; prompt: string; workflow_session_id?: string; context_session_id?: string },
  ): ApiResult<{ prompt: string }>;
  /** The recorder link, run by the run core inside the admission transaction (before dispatch). */
  recorderBind(
    principal: Principal,
    input: { workflow_session_id: string; project_id: string; provider_id: string },
  ): NonNullable<AdmissionHooks["bind"]>;
}

export interface McpToolsOptions {
  runs: RunsApi;
  /** Workflow-session selectors on start_coding_agent; without them those arguments are refused. */
  startHooks?: StartHooks;
  /** Tool modules beyond the three run tools. */
  modules?: readonly ToolModule[];
  audit: AuditLog;
  observeLimits: ObserveLimits;
  logger: Logger;
  /** Monotonic milliseconds; injectable for tests. */
  now?: () => number;
}

export interface ToolCallOutcome {
  result: CallToolResult;
  /** `ok` or the error code, as audited. */
  outcome: AuditOutcome;
  run_id: string | null;
}

export class McpTools {
  readonly #runs: RunsApi;
  readonly #audit: AuditLog;
  readonly #observeLimits: ObserveLimits;
  readonly #logger: Logger;
  readonly #now: () => number;
  readonly #modules: ReadonlyMap<string, ToolModule>;
  readonly #startHooks: StartHooks | undefined;
  readonly #definitions: Tool[];

  constructor(options: McpToolsOptions) {
    this.#runs = options.runs;
    const modules = new Map<string, ToolModule>();
    for (const m of options.modules ?? []) for (const spec of m.specs) modules.set(spec.name, m);
    this.#modules = modules;
    this.#startHooks = options.startHooks;
    this.#definitions = [...toolDefinitions(), ...(options.modules ?? []).flatMap((m) => m.specs.map(toolDefinition))];
    this.#audit = options.audit;
    this.#observeLimits = options.observeLimits;
    this.#logger = options.logger;
    this.#now = options.now ?? (() => performance.now());
  }

  /** tools/list: the run tools and every module's tools. */
  definitions(): Tool[] {
    return this.#definitions;
  }

  has(name: string): boolean {
    return isToolName(name) || this.#modules.has(name);
  }

  /**
   * Run one tool call for an authenticated principal and audit it. `name` must satisfy has().
   * `rawShape`: the verdict of checkArgumentShape on the arguments as they were parsed from the
   * request, before the SDK's request schema rebuilt them (it drops a top-level `__proto__` key).
   */
  async call(
    principal: Principal,
    name: string,
    args: unknown,
    signal?: AbortSignal,
    rawShape: string | null = null,
  ): Promise<CallToolResult> {
    const started = this.#now();
    let outcome: ToolCallOutcome;
    // Before anything recursive (zod, JSON.stringify) sees the arguments: depth and reserved keys.
    const shape = rawShape ?? checkArgumentShape(args);
    try {
      const module = this.#modules.get(name);
      if (shape !== null) outcome = fail(apiError("invalid_input", shape), null);
      else if (module) outcome = await module.call(principal, name, args, signal);
      else if (isToolName(name)) outcome = await this.#dispatch(principal, name, args, signal);
      else throw new Error("unknown tool");
    } catch (err) {
      // Never leak internals to the caller; the log keeps the class of failure only.
      this.#logger.error({ tool: name, err: describeFailure(err) }, "tool call failed unexpectedly");
      const error = apiError(
        "internal",
        "The Server failed to handle this call. Retrying it is safe: the same idempotency_key never starts a second run.",
      );
      outcome = { result: errorResult(error), outcome: "internal", run_id: null };
    }
    const output = outcome.result.content[0];
    this.#record(
      principal,
      name,
      outcome.run_id,
      auditSubjects(args, outcome.result),
      outcome.outcome,
      jsonBytes(args, shape === null),
      output?.type === "text" ? output.text : "",
      started,
    );
    return outcome.result;
  }

  /**
   * Audit a call refused before it reached a tool: an unknown tool name or resource (the name itself is not
   * kept), or a tools/call whose params the SDK refuses.
   */
  recordRefusedCall(principal: Principal, what: "unknown_tool" | "unknown_resource" | "malformed_call"): void {
    this.#record(principal, what, null, NO_SUBJECTS, "invalid_input", 0, "", this.#now());
  }

  /**
   * Audit a tools/call refused before it reached the tool because the (OAuth) token lacks a scope the tool
   * needs (HTTP 403 insufficient_scope): an authenticated call, so it has its row like any other.
   */
  recordScopeRefusal(principal: Principal, toolName: string): void {
    this.#record(
      principal,
      this.has(toolName) ? toolName : "unknown_tool",
      null,
      NO_SUBJECTS,
      "forbidden",
      0,
      "",
      this.#now(),
    );
  }

  /** The webcodex://projects resource for this principal; audited like a tool call. */
  readProjects(principal: Principal): ReadResourceResult {
    const started = this.#now();
    const result = readProjectsResource(this.#runs, principal);
    const first = result.contents[0];
    this.#record(
      principal,
      "resource:projects",
      null,
      NO_SUBJECTS,
      "ok",
      0,
      first && "text" in first ? first.text : "",
      started,
    );
    return result;
  }

  #record(
    principal: Principal,
    tool: string,
    runId: string | null,
    subjects: AuditSubjects,
    outcome: AuditOutcome,
    inputBytes: number,
    outputText: string,
    started: number,
  ): void {
    const row = {
      principal_id: principal.id,
      tool,
      run_id: runId,
      ...subjects,
      outcome,
      input_bytes: inputBytes,
      output_bytes: utf8Length(outputText),
      duration_ms: Math.max(0, Math.round(this.#now() - started)),
    };
    try {
      this.#audit.record(row);
    } catch (err) {
      this.#logger.error({ tool, err: describeFailure(err) }, "audit row not recorded");
    }
    this.#logger.debug(row, tool.startsWith("resource:") ? "resource read" : "tool call");
  }

  async #dispatch(principal: Principal, name: ToolName, args: unknown, signal?: AbortSignal): Promise<ToolCallOutcome> {
    switch (name) {
      case TOOL_NAMES.start:
        return this.#start(principal, args);
      case TOOL_NAMES.observe:
        return this.#observe(principal, args, signal);
      case TOOL_NAMES.cancel:
        return this.#cancel(principal, args);
      default: {
        const unreachable: never = name;
        throw new Error(`unknown tool ${String(unreachable)}`);
      }
    }
  }

  async #start(principal: Principal, args: unknown): Promise<ToolCallOutcome> {
    // Validation (prompt size included) happens before anything reaches the run core or its store.
    const input = parseToolInput(StartToolInput, args);
    if (!input.ok) return fail(input.error, null);
    const denied = checkToolScope(principal) ?? checkStartGrant(principal, input.value.project_id);
    if (denied) return fail(denied, null);
    const { workflow_session_id, context_session_id, ...runInput } = input.value;
    let prompt = runInput.prompt;
    if (context_session_id !== undefined || workflow_session_id !== undefined) {
      if (!this.#startHooks) {
        return fail(
          apiError("invalid_input", "Workflow sessions are not available on this Server; nothing was started."),
          null,
        );
      }
      const prepared = this.#startHooks.prepare(
        principal,
        stripUndefined({
          project_id: runInput.project_id,
          prompt: runInput.prompt,
          workflow_session_id,
          context_session_id,
        }),
      );
      if (!prepared.ok) return fail(prepared.error, null);
      prompt = prepared.value.prompt;
    }
    const bind =
      workflow_session_id !== undefined
        ? this.#startHooks?.recorderBind(principal, {
            workflow_session_id,
            project_id: runInput.project_id,
            provider_id: runInput.provider_id,
          })
        : undefined;
    const result = await this.#runs.start(principal, stripUndefined({ ...runInput, prompt }), bind ? { bind } : {});
    if (!result.ok) {
      if (result.error.code === "provider_unavailable") {
        return fail(this.#withProviders(principal, input.value, result.error), null);
      }
      return fail(result.error, null);
    }
    return ok(StartToolOutput.parse(result.value), result.value.run_id);
  }

  async #observe(principal: Principal, args: unknown, signal?: AbortSignal): Promise<ToolCallOutcome> {
    const input = parseToolInput(ObserveToolInput, args);
    if (!input.ok) return fail(input.error, null);
    const denied = checkToolScope(principal);
    if (denied) return fail(denied, input.value.run_id);
    const waits = (input.value.wait_secs ?? 0) > 0;
    const slot = waits ? this.#observeLimits.acquire(principal.id) : null;
    if (waits && !slot) {
      return fail(
        apiError(
          "too_many_observers",
          `Too many observe calls are waiting for this principal (limit ${this.#observeLimits.limit}). Wait for one to return, or observe without wait_secs.`,
        ),
        input.value.run_id,
      );
    }
    try {
      const result = await this.#runs.observe(principal, stripUndefined(input.value), signal);
      if (!result.ok) return fail(result.error, input.value.run_id);
      return ok(ObserveToolOutput.parse(stripUndefined(result.value)), input.value.run_id);
    } finally {
      slot?.release();
    }
  }

  async #cancel(principal: Principal, args: unknown): Promise<ToolCallOutcome> {
    const input = parseToolInput(CancelToolInput, args);
    if (!input.ok) return fail(input.error, null);
    const denied = checkToolScope(principal);
    if (denied) return fail(denied, input.value.run_id);
    const result = await this.#runs.cancel(principal, input.value);
    if (!result.ok) return fail(result.error, input.value.run_id);
    return ok(CancelToolOutput.parse(result.value), input.value.run_id);
  }

  /**
   * An unknown provider is answered with the providers that project's Runner
   * advertises — ids and names only — as a structured list next to the message.
   */
  #withProviders(
    principal: Principal,
    input: StartToolInput,
    error: ApiError,
  ): ApiError & { available_providers?: { provider_id: string; name: string }[] } {
    const project = this.#runs.listProjects(principal).find((p) => p.project_id === input.project_id);
    if (!project?.runner_online) return error;
    return {
      ...error,
      available_providers: project.providers.map((p) => ({ provider_id: p.provider_id, name: p.name })),
    };
  }
}

export function ok(value: Record<string, unknown>, runId: string | null): ToolCallOutcome {
  return { result: successResult(value), outcome: "ok", run_id: runId };
}

export function fail(error: ApiError, runId: string | null): ToolCallOutcome {
  return { result: errorResult(error), outcome: error.code, run_id: runId };
}

/** exactOptionalPropertyTypes: drop keys whose value is undefined. */
export function stripUndefined<T extends object>(value: T): { [K in keyof T]: Exclude<T[K], undefined> } {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) if (v !== undefined) out[k] = v;
  return out as { [K in keyof T]: Exclude<T[K], undefined> };
}

/** A secret-free description of an unexpected failure: the error class, and for zod the failing field path. */
function describeFailure(err: unknown): string {
  if (err instanceof z.ZodError)
    return `ZodError at ${err.issues[0]?.path.join(".") ?? "?"}: ${err.issues[0]?.code ?? ""}`;
  return err instanceof Error ? err.name : typeof err;
}
