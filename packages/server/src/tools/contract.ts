/**
 * The tool contract every tool module implements (the run tools in runs/tools.ts, agent tasks in tasks/tools.ts,
 * workflow sessions in sessions/tools.ts) and the router serves (mcp/tools.ts): a spec and its tools/list entry,
 * the module's `call`, and the result and error envelopes.
 *
 * A module's `call` receives its arguments already parsed by the tool's `spec.input` schema: the router checks the
 * shape once, at the edge (mcp/tool-arguments.ts, then the schema, tools/input.ts), and a module trusts the type.
 *
 * Results are `structuredContent` plus the same JSON as one text block. Tool-level errors are
 * `isError: true` results whose text is `{"error":{code,message,recovery_kind}}` and which carry no
 * structuredContent (it would not match the tool's outputSchema, and the SDK client validates
 * structuredContent against it).
 */

import type { CallToolResult, Tool } from "@modelcontextprotocol/server";
import { z } from "zod";
import { runViewToolMeta } from "../app/run-view.js";
import type { Principal } from "../principals/principal.js";
import type { ApiError, ApiErrorCode } from "./errors.js";

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
  /** `input` is what `spec.input` of the tool `name` parsed (the router never calls with anything else). */
  call(
    principal: Principal,
    name: string,
    input: unknown,
    signal?: AbortSignal,
    invocation?: ToolInvocation,
  ): Promise<ToolCallOutcome>;
}

/** What a tool's input schema `S` parsed: the type a module's `call` trusts its `input` to have. */
export type Parsed<S extends z.ZodType> = z.output<S>;

export interface ToolCallOutcome {
  result: CallToolResult;
  /** `ok` or the error code, as audited. */
  outcome: "ok" | ApiErrorCode;
  run_id: string | null;
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
