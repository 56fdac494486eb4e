/**
 * What every tool module shares (the run tools in mcp/tools.ts, agent tasks in tasks/tools.ts,
 * workflow sessions in sessions/tools.ts): a spec and its tools/list entry, input parsing whose
 * errors name the field and never echo a value, and the result and error envelopes.
 *
 * Results are `structuredContent` plus the same JSON as one text block. Tool-level errors are
 * `isError: true` results whose text is `{"error":{code,message,recovery_kind}}` and which carry no
 * structuredContent (it would not match the tool's outputSchema, and the SDK client validates
 * structuredContent against it).
 */

import type { CallToolResult, Tool } from "@modelcontextprotocol/server";
import { ConfigOptionId, MAX_PROMPT_BYTES, type RecoveryKind } from "@webcodex/protocol";
import { z } from "zod";
import { runViewToolMeta } from "../app/run-view.js";
import type { Principal } from "../principals/principal.js";
import type { ApiError, ApiResult } from "../runs/api.js";
import type { AuditOutcome } from "./audit.js";

export interface ToolSpec<N extends string = string> {
  name: N;
  title: string;
  description: string;
  input: z.ZodType;
  output: z.ZodType;
  annotations: NonNullable<Tool["annotations"]>;
  /**
   * The tool starts a run (its output has `run_id`): a Workflow Session may record it (`workflow_session_id`
   * in its arguments on 2025-era requests, `_wc.record` in the tools/call envelope on 2026-07-28 ones,
   * design §11), and for a client that declares the Tasks extension the call answers with a task (mcp/run-tasks.ts).
   */
  startsRun?: true;
  /** The tool's result is rendered by the run view (an MCP App, app/run-view.ts): tools/list names it in `_meta`. */
  runView?: true;
}

/** What a tools/call carries beside its arguments (the 2026-07-28 `_wc` envelope), as the router checked it. */
export interface ToolInvocation {
  /** `_wc.record`: the recorder session, to be checked exactly like `workflow_session_id`. */
  record?: string;
}

/** The argument that names the recorder on 2025-era requests. */
export const RECORDER_ARGUMENT = "workflow_session_id";
/** Where the recorder is named on 2026-07-28 requests. */
export const RECORDER_ENVELOPE = "_wc.record";

/**
 * Which JSON Schema dialect a tools/list answer uses: draft-7 for 2025-era clients (like the v1 SDK's own
 * McpServer, so their Ajv validates it as-is), JSON Schema 2020-12 for 2026-07-28 requests (the dialect that
 * revision names as the default).
 */
export type SchemaDialect = "draft-7" | "draft-2020-12";

function jsonSchema(schema: z.ZodType, io: "input" | "output", dialect: SchemaDialect): Tool["inputSchema"] {
  return z.toJSONSchema(schema, { target: dialect, io }) as Tool["inputSchema"];
}

/** A tools/list entry for one spec: input and output schema. */
export function toolDefinition(spec: ToolSpec<string>, dialect: SchemaDialect = "draft-7"): Tool {
  return {
    name: spec.name,
    title: spec.title,
    description: spec.description,
    inputSchema: jsonSchema(spec.input, "input", dialect),
    outputSchema: jsonSchema(spec.output, "output", dialect) as NonNullable<Tool["outputSchema"]>,
    annotations: spec.annotations,
    ...(spec.runView ? { _meta: runViewToolMeta() } : {}),
  };
}

/**
 * More tools registered next to the run tools (agent tasks, workflow sessions), each in its own
 * file. Calls go through McpTools.call, so they get the same error envelope, the same
 * catch-all for unexpected failures and one audit row each.
 */
export interface ToolModule {
  readonly specs: readonly ToolSpec<string>[];
  call(
    principal: Principal,
    name: string,
    args: unknown,
    signal?: AbortSignal,
    invocation?: ToolInvocation,
  ): Promise<ToolCallOutcome>;
}

export interface ToolCallOutcome {
  result: CallToolResult;
  /** `ok` or the error code, as audited. */
  outcome: AuditOutcome;
  run_id: string | null;
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
  start_outcome_unknown: "retry_same",
  invalid_observation_token: "reobserve",
  too_many_observers: "wait",
  stale_claim: "reconcile",
  claim_conflict: "wait",
  version_conflict: "reobserve",
  context_version_conflict: "reobserve",
  continuation_conflict: "fix_input",
  continuation_unsupported: "none",
  state_unavailable: "retry_same",
  state_busy: "retry_same",
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

export function successResult(value: Record<string, unknown>): CallToolResult {
  return { content: [{ type: "text", text: JSON.stringify(value) }], structuredContent: value };
}

export function errorResult(error: ApiError & { available_providers?: unknown }): CallToolResult {
  return { content: [{ type: "text", text: JSON.stringify({ error }) }], isError: true };
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
