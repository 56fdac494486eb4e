/**
 * The three model-facing MCP tools (DESIGN §6.3) and the tool modules next
 * to them: one `call()` that validates, checks authority,
 * calls the RunsApi and writes an audit row. Transport-free: mcp/http.ts and
 * the tests drive it with an already-authenticated Principal. The schemas
 * are in runs/tool-schemas.ts; the result and error envelopes every tool
 * module shares, in mcp/tool-shared.ts.
 */

import type { CallToolResult, ReadResourceResult, Tool } from "@modelcontextprotocol/sdk/types.js";
import { utf8Length } from "@webcodex/protocol";
import type { Logger } from "pino";
import { z } from "zod";
import { checkStartGrant, checkToolScope } from "../principals/authority.js";
import type { AdmissionHooks, ApiError, ApiResult, Principal, RunsApi } from "../runs/api.js";
import type { ObserveLimits } from "../runs/observe-limits.js";
import {
  CancelToolInput,
  CancelToolOutput,
  ObserveToolInput,
  ObserveToolOutput,
  StartToolInput,
  StartToolOutput,
} from "../runs/tool-schemas.js";
import type { AuditLog, AuditOutcome } from "./audit.js";
import { type AuditSubjects, auditSubjects, NO_SUBJECTS } from "./audit-subjects.js";
import { readProjectsResource } from "./resource.js";
import { checkArgumentShape } from "./tool-arguments.js";
import {
  apiError,
  errorResult,
  fail,
  ok,
  parseToolInput,
  stripUndefined,
  type ToolCallOutcome,
  type ToolModule,
  type ToolSpec,
  toolDefinition,
} from "./tool-shared.js";

export const TOOL_NAMES = {
  start: "start_coding_agent",
  observe: "observe_coding_agent",
  cancel: "cancel_coding_agent",
} as const;
export type ToolName = (typeof TOOL_NAMES)[keyof typeof TOOL_NAMES];

const TOOL_SPECS: readonly ToolSpec<ToolName>[] = [
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

let definitions: Tool[] | null = null;

/** The three run tools, each with input and output schema (computed once). */
export function toolDefinitions(): Tool[] {
  definitions ??= TOOL_SPECS.map(toolDefinition);
  return definitions;
}

export function isToolName(name: string): name is ToolName {
  return TOOL_SPECS.some((s) => s.name === name);
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

/**
 * What start_coding_agent asks of Workflow Sessions (sessions/service.ts), checked before anything
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

/** A secret-free description of an unexpected failure: the error class, and for zod the failing field path. */
function describeFailure(err: unknown): string {
  if (err instanceof z.ZodError)
    return `ZodError at ${err.issues[0]?.path.join(".") ?? "?"}: ${err.issues[0]?.code ?? ""}`;
  return err instanceof Error ? err.name : typeof err;
}
