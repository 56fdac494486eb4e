/**
 * The tool router: one `call()` that checks the arguments' shape once — the walk for depth and reserved
 * keys (tool-arguments.ts), the tools/call envelope, then the tool's own zod schema (the protocol
 * package's) — hands the parsed input to the ToolModule that owns the tool name (runs/tools.ts,
 * tasks/tools.ts, sessions/tools.ts), and writes one audit row per call. Authority is not decided here:
 * the modules' services do it (principals/authority.ts). Transport-free: mcp/http.ts and the tests drive
 * it with an already-authenticated Principal. The contract and envelopes every module shares are in
 * tools/contract.ts.
 */

import type { CallToolResult, ReadResourceResult, Tool } from "@modelcontextprotocol/server";
import { utf8Length } from "@webcodex/protocol";
import type { Logger } from "pino";
import { z } from "zod";
import { readRunViewResource } from "../app/run-view.js";
import type { Principal } from "../principals/principal.js";
import type { RunsApi } from "../runs/api.js";
import { SessionId } from "../sessions/ids.js";
import {
  errorResult,
  fail,
  RECORDER_ARGUMENT,
  RECORDER_ENVELOPE,
  type ToolCallOutcome,
  type ToolInvocation,
  type ToolModule,
  type ToolSpec,
  toolDefinition,
} from "../tools/contract.js";
import { apiError } from "../tools/errors.js";
import { parseToolInput } from "../tools/input.js";
import type { AuditLog, AuditOutcome } from "./audit.js";
import { type AuditSubjects, auditSubjects, NO_SUBJECTS } from "./audit-subjects.js";
import { readProjectsResource } from "./resource.js";
import { checkArgumentShape } from "./tool-arguments.js";

/** A tools/call's params as JSON.parse built them (the SDK's schema drops `_wc`), and whether it is 2026-07-28. */
export interface CallEnvelope {
  modern: boolean;
  params: Readonly<Record<string, unknown>>;
}

const RECORDER_TOOLS_HINT = "only the run-starting tools (start_coding_agent, start_agent_task_coding_run) take one";

/**
 * The recorder of a tools/call (design §11): on 2026-07-28 `_wc.record` in the envelope, beside name and
 * arguments; on 2025-era requests `workflow_session_id` in the arguments (checked by the tool). Every other
 * place a caller might put it is refused by name. Returns the invocation, or why the call is refused.
 */
function checkEnvelope(
  spec: ToolSpec<string> | undefined,
  args: unknown,
  envelope: CallEnvelope,
): { invocation: ToolInvocation } | { refusal: string } {
  const { modern, params } = envelope;
  const argObject = typeof args === "object" && args !== null ? (args as Record<string, unknown>) : {};
  if (Object.hasOwn(argObject, "_wc")) {
    return {
      refusal: modern
        ? `arguments._wc: the recorder goes in the tools/call envelope as params.${RECORDER_ENVELOPE} (beside name and arguments), never inside arguments. Nothing was started.`
        : `arguments._wc: not an argument; on this 2025-era request name the recorder with arguments.${RECORDER_ARGUMENT}. Nothing was started.`,
    };
  }
  if (Object.hasOwn(params, "recording_session_id")) {
    return {
      refusal: `params.recording_session_id: not a recorder selector; name the recorder with params.${RECORDER_ENVELOPE} (2026-07-28) or arguments.${RECORDER_ARGUMENT} (2025-era). Nothing was started.`,
    };
  }
  const wc = params._wc;
  if (!modern) {
    if (wc === undefined) return { invocation: {} };
    return {
      refusal: `params._wc: the 2026-07-28 envelope; on this 2025-era request name the recorder with arguments.${RECORDER_ARGUMENT}. Nothing was started.`,
    };
  }
  if (spec?.startsRun && Object.hasOwn(argObject, RECORDER_ARGUMENT)) {
    return {
      refusal: `arguments.${RECORDER_ARGUMENT}: on a 2026-07-28 request the recorder is params.${RECORDER_ENVELOPE} in the tools/call envelope. Nothing was started.`,
    };
  }
  if (wc === undefined) return { invocation: {} };
  if (typeof wc !== "object" || wc === null || Array.isArray(wc)) {
    return { refusal: `params._wc: must be an object {record: <session id>}. Nothing was started.` };
  }
  const unknownKey = Object.keys(wc).find((k) => k !== "record");
  if (unknownKey !== undefined) {
    return {
      refusal: `params._wc: only "record" is allowed (got ${JSON.stringify(unknownKey.slice(0, 64))}). Nothing was started.`,
    };
  }
  const record = (wc as { record?: unknown }).record;
  if (record === undefined) return { invocation: {} };
  if (!spec?.startsRun) {
    return { refusal: `params.${RECORDER_ENVELOPE}: this tool starts no run; ${RECORDER_TOOLS_HINT}.` };
  }
  const parsed = SessionId.safeParse(record);
  if (!parsed.success) {
    return {
      refusal: `params.${RECORDER_ENVELOPE}: ${typeof record === "string" ? "must be wc_sess_ followed by 26 base32 characters" : "must be a string (a workflow session id)"}. Nothing was started.`,
    };
  }
  return { invocation: { record: parsed.data } };
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

export interface McpToolsOptions {
  /** For the webcodex://projects resource. */
  runs: RunsApi;
  /** Every tool this router serves, in tools/list order; a name belongs to exactly one module. */
  modules: readonly ToolModule[];
  audit: AuditLog;
  logger: Logger;
  /** Monotonic milliseconds; injectable for tests. */
  now?: () => number;
}

export class McpTools {
  readonly #runs: RunsApi;
  readonly #audit: AuditLog;
  readonly #logger: Logger;
  readonly #now: () => number;
  readonly #modules: ReadonlyMap<string, ToolModule>;
  readonly #specs: ReadonlyMap<string, ToolSpec<string>>;
  readonly #definitions: Tool[];
  readonly #modernDefinitions: Tool[];

  constructor(options: McpToolsOptions) {
    this.#runs = options.runs;
    const modules = new Map<string, ToolModule>();
    const specs = new Map<string, ToolSpec<string>>();
    for (const m of options.modules) {
      for (const spec of m.specs) {
        if (modules.has(spec.name)) throw new Error(`tool ${spec.name} is registered by two modules`);
        modules.set(spec.name, m);
        specs.set(spec.name, spec);
      }
    }
    this.#modules = modules;
    this.#specs = specs;
    this.#definitions = options.modules.flatMap((m) => m.specs.map((spec) => toolDefinition(spec)));
    this.#modernDefinitions = options.modules.flatMap((m) =>
      m.specs.map((spec) => toolDefinition(spec, "draft-2020-12")),
    );
    this.#audit = options.audit;
    this.#logger = options.logger;
    this.#now = options.now ?? (() => performance.now());
  }

  /**
   * tools/list: every module's tools, in module order (always the same order). `modern`: schemas in JSON
   * Schema 2020-12 for 2026-07-28 requests; otherwise draft-7 as 2025-era clients have always had them.
   */
  definitions(modern = false): Tool[] {
    return modern ? this.#modernDefinitions : this.#definitions;
  }

  /** Whether the tool starts a run (ToolSpec.startsRun). */
  startsRun(name: string): boolean {
    return this.#specs.get(name)?.startsRun === true;
  }

  has(name: string): boolean {
    return this.#modules.has(name);
  }

  /**
   * Run one tool call for an authenticated principal and audit it. `name` must satisfy has(). `args` are
   * the arguments as JSON.parse built them from the request (mcp/http.ts hands over the raw params, not
   * the SDK's copy, which silently drops a top-level `__proto__` key): this is the one place their shape
   * is checked, and the module gets what the tool's schema parsed.
   */
  async call(
    principal: Principal,
    name: string,
    args: unknown,
    signal?: AbortSignal,
    envelope: CallEnvelope = { modern: false, params: {} },
  ): Promise<CallToolResult> {
    const started = this.#now();
    let outcome: ToolCallOutcome;
    // Before anything recursive (zod, JSON.stringify) sees the arguments: depth and reserved keys.
    const shape = checkArgumentShape(args ?? {});
    try {
      outcome =
        shape !== null
          ? fail(apiError("invalid_input", shape), null)
          : await this.#dispatch(principal, name, args, signal, envelope);
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

  /** The envelope, then the tool's schema; the module gets the parsed input. */
  async #dispatch(
    principal: Principal,
    name: string,
    args: unknown,
    signal: AbortSignal | undefined,
    envelope: CallEnvelope,
  ): Promise<ToolCallOutcome> {
    const module = this.#modules.get(name);
    const spec = this.#specs.get(name);
    if (!module || !spec) throw new Error("unknown tool");
    const checked = checkEnvelope(spec, args, envelope);
    if ("refusal" in checked) return fail(apiError("invalid_input", checked.refusal), null);
    const input = parseToolInput(spec.input, args);
    if (!input.ok) return fail(input.error, null);
    return await module.call(principal, name, input.value, signal, checked.invocation);
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

  /**
   * Audit a Tasks request answered outside a tool (`task:get` for tasks/get, `task:listen` for a
   * subscriptions/listen stream, recorded when it ends): ids and sizes only, like a tool call.
   * `started` is a reading of the same clock (`performance.now()`).
   */
  recordTaskRequest(
    principal: Principal,
    what: "task:get" | "task:listen",
    runId: string | null,
    outcome: AuditOutcome,
    started: number,
    outputBytes: number,
    inputBytes = 0,
  ): void {
    this.#record(principal, what, runId, NO_SUBJECTS, outcome, inputBytes, outputBytes, started);
  }

  /** The webcodex://projects resource for this principal; audited like a tool call. */
  async readProjects(principal: Principal): Promise<ReadResourceResult> {
    const started = this.#now();
    const result = await readProjectsResource(this.#runs, principal);
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

  /**
   * The run view (ui://webcodex/run, app/run-view.ts); audited like a tool call, `internal` when the bundle
   * is missing (then RunViewMissingError propagates to the caller).
   */
  readRunView(principal: Principal): ReadResourceResult {
    const started = this.#now();
    let result: ReadResourceResult;
    try {
      result = readRunViewResource();
    } catch (err) {
      this.#record(principal, "resource:run-view", null, NO_SUBJECTS, "internal", 0, "", started);
      throw err;
    }
    const first = result.contents[0];
    this.#record(
      principal,
      "resource:run-view",
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
    output: string | number,
    started: number,
  ): void {
    const row = {
      principal_id: principal.id,
      tool,
      run_id: runId,
      ...subjects,
      outcome,
      input_bytes: inputBytes,
      output_bytes: typeof output === "number" ? output : utf8Length(output),
      duration_ms: Math.max(0, Math.round(this.#now() - started)),
    };
    try {
      this.#audit.record(row);
    } catch (err) {
      this.#logger.error({ tool, err: describeFailure(err) }, "audit row not recorded");
    }
    this.#logger.debug(row, tool.startsWith("resource:") ? "resource read" : "tool call");
  }
}

/** A secret-free description of an unexpected failure: the error class, and for zod the failing field path. */
function describeFailure(err: unknown): string {
  if (err instanceof z.ZodError)
    return `ZodError at ${err.issues[0]?.path.join(".") ?? "?"}: ${err.issues[0]?.code ?? ""}`;
  return err instanceof Error ? err.name : typeof err;
}
