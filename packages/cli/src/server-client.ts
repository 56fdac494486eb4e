/**
 * The CLI's only way to the Server: MCP 2026-07-28 over Streamable HTTP with
 * a bearer token — the same path a model uses. Plain tool calls go through
 * the v2 SDK client (pinned to 2026-07-28: `server/discover`, then per-request
 * `_meta`). `start` is task-backed (the `io.modelcontextprotocol/tasks`
 * extension): the v2 client refuses a `resultType: "task"` answer and the
 * Tasks package leaves the request to its host, so that one request is posted
 * here with the headers the 2026 transport requires, and its answer checked
 * with the Tasks package's own schema. Tool results are validated here; error
 * results become CliError("tool").
 */
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { CreateTaskResultV2Schema } from "@modelcontextprotocol/ext-tasks/core/v2";
import type { z } from "zod";
import { CliError, httpStatusError, toCliError } from "./errors.js";
import {
  CancelResult,
  Observation,
  ProjectsResource,
  type ProjectView,
  type StartInput,
  StartResult,
  ToolErrorBody,
} from "./wire.js";

export const PROJECTS_RESOURCE_URI = "webcodex://projects";
const CLIENT_INFO = { name: "webcodex-cli", version: "0.1.0" };
/** The MCP revision the CLI speaks. */
export const PROTOCOL_VERSION = "2026-07-28";
const TASKS_EXTENSION = "io.modelcontextprotocol/tasks";
/** `_meta` key of a task result that names its run (the Server's RUN_META). */
const RUN_META = "dev.webcodex/run";
/** Task ids the Server hands out (`wc_task_…`); `observe` and `cancel` accept one in place of a run id. */
const TASK_ID = /^wc_task_[a-z2-7]{26}_[A-Za-z0-9_-]{22}$/;
/** Bound on one request without a wait of its own. */
const REQUEST_TIMEOUT_MS = 60_000;

export interface ServerConnection {
  readonly url: string;
  readonly token: string;
}

/** What the commands need from the Server; tests may substitute it. */
export interface RunsClient {
  start(input: StartInput, signal?: AbortSignal): Promise<StartResult>;
  observe(
    input: { run_id: string; after_observation_token?: string; wait_secs?: number },
    signal?: AbortSignal,
  ): Promise<Observation>;
  cancel(runId: string): Promise<CancelResult>;
  projects(): Promise<ProjectView[]>;
  /** The run id behind a task id (`wc_task_…`, from a task-backed start); anything else is returned as is. */
  resolveRun?(runOrTaskId: string): Promise<string>;
  /** Any other tool (agent tasks): its structured result, validated by `schema`; errors as for the run tools. */
  /** Any tool by name; `timeoutMs` replaces the default bound of a request for a tool that may take longer. */
  callTool?<T extends z.ZodType>(
    name: string,
    args: Record<string, unknown>,
    schema: T,
    timeoutMs?: number,
  ): Promise<z.infer<T>>;
  /** Drops the MCP session so the next call reconnects (after a Server restart). */
  reset(): Promise<void>;
  close(): Promise<void>;
}

export class McpRunsClient implements RunsClient {
  readonly #connection: ServerConnection;
  #client: Client | undefined;

  constructor(connection: ServerConnection) {
    this.#connection = connection;
  }

  async #connected(): Promise<Client> {
    if (this.#client !== undefined) return this.#client;
    const url = parseUrl(this.#connection.url);
    const transport = new StreamableHTTPClientTransport(url, {
      requestInit: { headers: { Authorization: `Bearer ${this.#connection.token}` } },
    });
    const client = new Client(CLIENT_INFO, {
      capabilities: {},
      versionNegotiation: { mode: { pin: PROTOCOL_VERSION } },
    });
    try {
      await client.connect(transport);
    } catch (err) {
      await client.close().catch(() => undefined);
      throw toCliError(err, this.#connection.url);
    }
    this.#client = client;
    return client;
  }

  async #call<T extends z.ZodType>(
    name: string,
    args: Record<string, unknown>,
    schema: T,
    options: { signal?: AbortSignal | undefined; timeoutMs?: number } = {},
  ): Promise<z.infer<T>> {
    const client = await this.#connected();
    // One signal per request: the SDK listens on the signal it is given, and a
    // follow loop's long-lived signal would collect a listener per observe.
    const request = new AbortController();
    const parent = options.signal;
    const forward = () => request.abort(parent?.reason);
    if (parent?.aborted === true) forward();
    else parent?.addEventListener("abort", forward, { once: true });
    let result: Awaited<ReturnType<Client["callTool"]>>;
    try {
      result = await client.callTool(
        { name, arguments: args },
        { signal: request.signal, timeout: options.timeoutMs ?? REQUEST_TIMEOUT_MS },
      );
    } catch (err) {
      throw toCliError(err, this.#connection.url);
    } finally {
      parent?.removeEventListener("abort", forward);
    }
    return this.#toolResult(name, result as ToolResult, schema);
  }

  /** A tool result: its structured body checked by `schema`, or its error as CliError("tool"). */
  #toolResult<T extends z.ZodType>(name: string, result: ToolResult, schema: T): z.infer<T> {
    const body = structuredBody(result);
    if (result.isError === true) {
      const parsed = ToolErrorBody.safeParse(body);
      if (parsed.success) {
        const { code, message, recovery_kind, missing_scopes } = parsed.data.error;
        throw new CliError("tool", message, {
          toolCode: code,
          recoveryKind: recovery_kind,
          hint: hintForToolError(code, missing_scopes ?? []),
        });
      }
      throw new CliError("tool", `${name} failed without a readable error`, { toolCode: "unknown" });
    }
    const parsed = schema.safeParse(body);
    if (!parsed.success) {
      throw new CliError("protocol", `the Server's ${name} result is not in the expected shape`, {
        hint: "The Server and this CLI may be different versions.",
      });
    }
    return parsed.data;
  }

  /**
   * start_coding_agent as a task: the answer is the run's task, with the start's own output in
   * `_meta["dev.webcodex/run"]`; a refused start is the tool's error result, as without Tasks.
   */
  async start(input: StartInput, signal?: AbortSignal): Promise<StartResult> {
    const name = "start_coding_agent";
    // On 2026-07-28 the recorder session rides in the tools/call envelope, never in the arguments.
    const { workflow_session_id: record, ...args } = input;
    const params = { name, arguments: args, ...(record !== undefined ? { _wc: { record } } : {}) };
    const result = await this.#post("tools/call", params, name, signal);
    if (result.resultType !== "task") return this.#toolResult(name, result as ToolResult, StartResult);
    const task = CreateTaskResultV2Schema.safeParse(result);
    const parsed = StartResult.safeParse((result._meta as Record<string, unknown> | undefined)?.[RUN_META]);
    if (!task.success || !parsed.success) {
      throw new CliError("protocol", `the Server's ${name} task is not in the expected shape`, {
        hint: "The Server and this CLI may be different versions.",
      });
    }
    return { ...parsed.data, task_id: task.data.taskId };
  }

  async resolveRun(runOrTaskId: string): Promise<string> {
    if (!TASK_ID.test(runOrTaskId)) return runOrTaskId;
    const result = await this.#post("tasks/get", { taskId: runOrTaskId }, runOrTaskId);
    const runId = (
      (result._meta as Record<string, unknown> | undefined)?.[RUN_META] as { run_id?: unknown } | undefined
    )?.run_id;
    if (typeof runId !== "string") {
      throw new CliError("protocol", "the Server's tasks/get answer does not name the task's run", {
        hint: "The Server and this CLI may be different versions.",
      });
    }
    return runId;
  }

  /**
   * One 2026-07-28 request posted directly, for what the SDK client cannot carry (a task result): the
   * `_meta` envelope with the Tasks extension declared, and the `MCP-Protocol-Version` / `Mcp-Method` /
   * `Mcp-Name` headers. Resolves with the JSON-RPC result; HTTP and JSON-RPC errors become CliError.
   */
  async #post(
    method: string,
    params: Record<string, unknown>,
    mcpName: string,
    signal?: AbortSignal,
  ): Promise<Record<string, unknown>> {
    const url = parseUrl(this.#connection.url);
    const body = {
      jsonrpc: "2.0",
      id: 1,
      method,
      params: {
        ...params,
        _meta: {
          "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
          "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
          "io.modelcontextprotocol/clientCapabilities": { extensions: { [TASKS_EXTENSION]: {} } },
        },
      },
    };
    const timeout = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
    let response: Response;
    let text: string;
    try {
      response = await fetch(url, {
        method: "POST",
        headers: {
          Authorization: `Bearer ${this.#connection.token}`,
          Accept: "application/json, text/event-stream",
          "Content-Type": "application/json",
          "MCP-Protocol-Version": PROTOCOL_VERSION,
          "Mcp-Method": method,
          "Mcp-Name": mcpNameHeader(mcpName),
        },
        body: JSON.stringify(body),
        signal: signal === undefined ? timeout : AbortSignal.any([signal, timeout]),
      });
      text = await response.text();
    } catch (err) {
      throw toCliError(err, this.#connection.url);
    }
    const answer = safeJson(text) as { result?: unknown; error?: { code?: unknown; message?: unknown } } | undefined;
    if (!response.ok) {
      const message = typeof answer?.error?.message === "string" ? answer.error.message : response.statusText;
      throw httpStatusError(response.status, message, this.#connection.url);
    }
    if (answer?.error !== undefined) {
      throw new CliError(
        "protocol",
        `the Server at ${this.#connection.url} returned an MCP error (${String(answer.error.code)}): ${String(answer.error.message)}`,
        { hint: "Is this a webcodex-server? `webcodex` needs the start/observe/cancel_coding_agent tools." },
      );
    }
    if (typeof answer?.result !== "object" || answer.result === null) {
      throw new CliError("protocol", `the Server at ${this.#connection.url} answered ${method} without a result`, {
        hint: "The Server and this CLI may be different versions.",
      });
    }
    return answer.result as Record<string, unknown>;
  }

  observe(
    input: { run_id: string; after_observation_token?: string; wait_secs?: number },
    signal?: AbortSignal,
  ): Promise<Observation> {
    return this.#call("observe_coding_agent", { ...input }, Observation, {
      signal,
      timeoutMs: ((input.wait_secs ?? 0) + 30) * 1000,
    });
  }

  callTool<T extends z.ZodType>(
    name: string,
    args: Record<string, unknown>,
    schema: T,
    timeoutMs?: number,
  ): Promise<z.infer<T>> {
    return this.#call(name, args, schema, timeoutMs === undefined ? {} : { timeoutMs });
  }

  cancel(runId: string): Promise<CancelResult> {
    return this.#call("cancel_coding_agent", { run_id: runId }, CancelResult);
  }

  async projects(): Promise<ProjectView[]> {
    const client = await this.#connected();
    let contents: Awaited<ReturnType<Client["readResource"]>>["contents"];
    try {
      contents = (await client.readResource({ uri: PROJECTS_RESOURCE_URI })).contents;
    } catch (err) {
      throw toCliError(err, this.#connection.url);
    }
    const first = contents[0];
    const text = first !== undefined && "text" in first && typeof first.text === "string" ? first.text : undefined;
    const parsed = text === undefined ? undefined : ProjectsResource.safeParse(safeJson(text));
    if (parsed?.success !== true) {
      throw new CliError("protocol", `the Server's ${PROJECTS_RESOURCE_URI} resource is not in the expected shape`, {
        hint: "The Server and this CLI may be different versions.",
      });
    }
    return parsed.data;
  }

  async reset(): Promise<void> {
    const client = this.#client;
    this.#client = undefined;
    await client?.close().catch(() => undefined);
  }

  async close(): Promise<void> {
    await this.reset();
  }
}

type ToolResult = { isError?: boolean; structuredContent?: unknown; content?: unknown };

/** An `Mcp-Name` value: as is when it is printable ASCII, else the `=?base64?…?=` form headers can carry. */
function mcpNameHeader(value: string): string {
  return /^[\x20-\x7e]*$/.test(value) ? value : `=?base64?${Buffer.from(value, "utf8").toString("base64")}?=`;
}

function parseUrl(raw: string): URL {
  try {
    const url = new URL(raw);
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new Error("not http(s)");
    return url;
  } catch {
    throw new CliError("usage", `invalid Server URL: ${raw}`, {
      hint: "Use the Server's MCP URL, e.g. http://127.0.0.1:7420/mcp",
    });
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** structuredContent when present, else the JSON text copy the Server also sends. */
function structuredBody(result: { structuredContent?: unknown; content?: unknown }): unknown {
  if (result.structuredContent !== undefined) return result.structuredContent;
  if (Array.isArray(result.content)) {
    for (const item of result.content) {
      if (typeof item === "object" && item !== null && "text" in item && typeof item.text === "string") {
        const parsed = safeJson(item.text);
        if (parsed !== undefined) return parsed;
      }
    }
  }
  return undefined;
}

function hintForToolError(code: string, missingScopes: readonly string[]): string | undefined {
  switch (code) {
    case "unauthorized":
      return "Check WEBCODEX_TOKEN / --token.";
    case "forbidden":
      if (missingScopes.length > 0) {
        const flags = missingScopes.map((s) => `--scope ${s}`).join(" ");
        return `Ask the operator for a token issued with ${flags} (\`webcodex-server token issue\`; the principal's scopes in the Server config must include ${missingScopes.length > 1 ? "them" : "it"}).`;
      }
      return "This token has no grant on that project, or the project does not allow changes; `webcodex status` lists what it may use.";
    case "not_found":
      return "Runs are visible only to the principal that started them; check the run id and the token.";
    case "idempotency_conflict":
      return "That key already started a different request; use a new --key (or none) for a new run.";
    case "runner_unavailable":
      return "The project's Runner is not connected; `webcodex status` shows it. Retry the same command (same --key) when it is back.";
    case "provider_unavailable":
      return "`webcodex status` lists the providers each project's Runner advertises.";
    case "capacity":
      return "The Runner is at max_concurrent_runs. Retry the same command (same --key) later.";
    case "stale_runner":
      return "The Runner restarted meanwhile. Retry the same command with the same --key.";
    case "stale_provider":
      return "The agent provider restarted meanwhile. Retry the same command with the same --key.";
    case "start_in_progress":
      return "A start with this --key is still in progress. Retry the same command shortly.";
    case "start_outcome_unknown":
      return "The run may have started. Retry the same command (same --key) once the Server's database is back: it shows that run.";
    case "stale_claim":
      return "That claim is not the task's current one (lease expired, newer attempt or generation): `webcodex task show TASK_ID`.";
    case "claim_conflict":
      return "Another attempt or an active/lost run blocks this; `webcodex task show TASK_ID` shows which.";
    case "context_version_conflict":
      return "The session changed after the version you reviewed: `webcodex session show SESSION_ID`, review it, then pass its version to --context-version.";
    default:
      return undefined;
  }
}
