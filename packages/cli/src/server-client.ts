/**
 * The CLI's only way to the Server: the MCP SDK client over Streamable HTTP
 * with a bearer token — the same path a model uses. Tool results are
 * validated here; error results become CliError("tool").
 */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { z } from "zod";
import { CliError, toCliError } from "./errors.js";
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
  /** Any other tool (agent tasks): its structured result, validated by `schema`; errors as for the run tools. */
  callTool?<T extends z.ZodType>(name: string, args: Record<string, unknown>, schema: T): Promise<z.infer<T>>;
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
    const client = new Client(CLIENT_INFO, { capabilities: {} });
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
      result = await client.callTool({ name, arguments: args }, undefined, {
        signal: request.signal,
        timeout: options.timeoutMs ?? 60_000,
      });
    } catch (err) {
      throw toCliError(err, this.#connection.url);
    } finally {
      parent?.removeEventListener("abort", forward);
    }
    const body = structuredBody(result as { structuredContent?: unknown; content?: unknown });
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

  start(input: StartInput, signal?: AbortSignal): Promise<StartResult> {
    return this.#call("start_coding_agent", { ...input }, StartResult, { signal });
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

  callTool<T extends z.ZodType>(name: string, args: Record<string, unknown>, schema: T): Promise<z.infer<T>> {
    return this.#call(name, args, schema);
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
