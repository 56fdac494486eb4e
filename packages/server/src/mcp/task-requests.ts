/**
 * The Tasks answers of `/mcp` (2026-07-28 only), beside the runs-as-tasks view (run-tasks.ts) and the listen
 * streams (task-listen.ts): `tasks/get`, `tasks/cancel`, `tasks/update`, `subscriptions/listen` and the
 * task-backed start of a run. They are answered here rather than by the SDK `Server`: the v2 server SDK has no
 * side of the Tasks extension (`@modelcontextprotocol/ext-tasks` ships the client side only), and its
 * `tools/call` wrapper validates every answer as a `CallToolResult`, which a task answer is not. The
 * task-backed start is the same audited `tools.call` as any start; only its answer is the task.
 */

import type { ServerResponse } from "node:http";
import type { JSONRPCRequest } from "@modelcontextprotocol/server";
import type { Logger } from "pino";
import type { Principal, RunsApi } from "../runs/api.js";
import type { ObserveLimits } from "../runs/observe-limits.js";
import { type Era, MISSING_REQUIRED_CLIENT_CAPABILITY, SERVER_INFO_META } from "./era.js";
import { type CheckedPost, paramsOf, sendJsonRpcError } from "./post.js";
import { declaresTasks, type RunTasks, TASKS_EXTENSION, TaskRequestError } from "./run-tasks.js";
import { ListenRefusal, TaskListens } from "./task-listen.js";
import type { McpTools } from "./tools.js";

/**
 * A Tasks request from a client that did not declare the extension (or to a Server without Tasks): answered
 * 400 with MISSING_REQUIRED_CLIENT_CAPABILITY. Returns true when it answered.
 */
export function refuseUndeclaredTasks(res: ServerResponse, post: CheckedPost, runTasks: RunTasks | undefined): boolean {
  const message = post.message;
  if (post.era.kind !== "modern" || !("method" in message) || !message.method.startsWith("tasks/")) return false;
  if (runTasks && declaresTasks(post.era)) return false;
  sendJsonRpcError(
    res,
    400,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    runTasks
      ? `${message.method} needs the ${TASKS_EXTENSION} extension: declare it in _meta["io.modelcontextprotocol/clientCapabilities"].extensions`
      : `${message.method}: this Server offers no Tasks`,
    post.request,
    { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } },
  );
  return true;
}

/**
 * A result answered outside the SDK `Server` as its era expects it: unchanged for a 2025-era request; for a
 * 2026-07-28 one with `resultType: "complete"`.
 */
function modernResult<T extends object>(era: Era, result: T): T {
  if (era.kind !== "modern") return result;
  return { ...result, resultType: "complete" };
}

export interface TaskRequestsOptions {
  runTasks: RunTasks;
  tools: McpTools;
  runs: RunsApi;
  observeLimits: ObserveLimits;
  logger: Logger;
  serverInfo: { name: string; version: string };
}

/** The Tasks answers of one `/mcp` handler (present only when runs are tasks). */
export class TaskRequests {
  readonly #tasks: RunTasks;
  readonly #tools: McpTools;
  readonly #logger: Logger;
  readonly #listens: TaskListens;

  constructor(options: TaskRequestsOptions) {
    this.#tasks = options.runTasks;
    this.#tools = options.tools;
    this.#logger = options.logger;
    this.#listens = new TaskListens({
      tasks: options.runTasks,
      runs: options.runs,
      observeLimits: options.observeLimits,
      logger: options.logger,
      serverInfoMeta: SERVER_INFO_META,
      serverInfo: options.serverInfo,
    });
  }

  /**
   * Answers the POST when it is a 2026-07-28 Tasks request, a listen, or a task-backed start from a client that
   * declared the extension; returns false (nothing written) for any other request.
   */
  async answer(res: ServerResponse, post: CheckedPost, principal: Principal): Promise<boolean> {
    const message = post.message;
    if (post.era.kind !== "modern" || !("method" in message) || !("id" in message)) return false;
    const request = message as JSONRPCRequest;
    if (request.method === "subscriptions/listen") {
      await this.#listen(res, request, post.era, principal, paramsOf(post.raw));
      return true;
    }
    if (!this.#isTaskRequest(request, post.era)) return false;
    await this.#answerTaskRequest(res, request, post.era, principal, paramsOf(post.raw));
    return true;
  }

  /** End every open listen stream (Server shutdown). */
  closeAll(): void {
    this.#listens.closeAll();
  }

  /** Whether a 2026-07-28 request is a Tasks request or a task-backed start. */
  #isTaskRequest(message: JSONRPCRequest, era: Era): boolean {
    if (message.method.startsWith("tasks/")) return true;
    if (message.method !== "tools/call" || !declaresTasks(era)) return false;
    const name = (message.params as { name?: unknown } | undefined)?.name;
    return typeof name === "string" && this.#tools.startsRun(name);
  }

  async #answerTaskRequest(
    res: ServerResponse,
    message: JSONRPCRequest,
    era: Era,
    principal: Principal,
    rawParams: Readonly<Record<string, unknown>>,
  ): Promise<void> {
    const tasks = this.#tasks;
    const tools = this.#tools;
    const answer = (result: Record<string, unknown>): string => {
      const body = JSON.stringify({ jsonrpc: "2.0", id: message.id, result });
      if (res.writableEnded || res.destroyed) return body;
      res.writeHead(200, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
      res.end(body);
      return body;
    };
    const taskId = () => {
      const id = rawParams.taskId;
      if (typeof id !== "string") throw new TaskRequestError(-32602, "params.taskId: must be a string (a task id)");
      return id;
    };
    try {
      switch (message.method) {
        case "tools/call": {
          const name = rawParams.name as string;
          const envelope = { modern: true, params: rawParams };
          const result = await tools.call(principal, name, rawParams.arguments, undefined, envelope);
          const runId = (result.structuredContent as { run_id?: unknown } | undefined)?.run_id;
          // A refused start is the tool's own error result, as without Tasks: no run, so no task.
          if (result.isError || typeof runId !== "string") answer(modernResult(era, result));
          else answer(await tasks.created(principal, runId, result.structuredContent));
          return;
        }
        case "tasks/get": {
          // Audited like observe_coding_agent: the run (only when the id is this principal's), outcome, sizes.
          const started = performance.now();
          const id = taskId();
          const runId = await tasks.ownedRun(principal, id);
          const inputBytes = Buffer.byteLength(JSON.stringify(rawParams));
          let body: string;
          try {
            body = answer(await tasks.get(principal, id));
          } catch (err) {
            const outcome = err instanceof TaskRequestError ? "not_found" : "internal";
            tools.recordTaskRequest(principal, "task:get", runId, outcome, started, 0, inputBytes);
            throw err;
          }
          tools.recordTaskRequest(principal, "task:get", runId, "ok", started, Buffer.byteLength(body), inputBytes);
          return;
        }
        case "tasks/cancel": {
          const runId = tasks.runToCancel(principal, taskId());
          const result = await tools.call(principal, "cancel_coding_agent", { run_id: runId });
          if (result.isError) {
            const text = result.content[0]?.type === "text" ? result.content[0].text : "";
            throw new TaskRequestError(-32603, `The run could not be cancelled: ${text}`);
          }
          answer({ resultType: "complete" });
          return;
        }
        case "tasks/update":
          taskId();
          throw new TaskRequestError(
            -32602,
            "tasks/update: a run's task never asks for input (permission requests follow the Runner's policy).",
          );
        default:
          throw new TaskRequestError(-32601, `Method not found: ${message.method}`);
      }
    } catch (err) {
      if (err instanceof TaskRequestError) {
        sendJsonRpcError(res, 200, err.code, err.message, message.id);
        return;
      }
      this.#logger.error({ err: err instanceof Error ? err.name : typeof err }, "mcp task request failed");
      sendJsonRpcError(res, 200, -32603, "Internal error", message.id);
    }
  }

  /** `subscriptions/listen` (task-listen.ts): task status as an SSE stream; one audit row when it ends. */
  async #listen(
    res: ServerResponse,
    message: JSONRPCRequest,
    era: Era,
    principal: Principal,
    rawParams: Readonly<Record<string, unknown>>,
  ): Promise<void> {
    const started = performance.now();
    const inputBytes = Buffer.byteLength(JSON.stringify(rawParams));
    try {
      const streamed = await this.#listens.serve(res, message.id, era, principal, rawParams);
      this.#tools.recordTaskRequest(principal, "task:listen", null, "ok", started, streamed, inputBytes);
    } catch (err) {
      if (!(err instanceof ListenRefusal)) throw err;
      this.#tools.recordTaskRequest(principal, "task:listen", null, err.outcome, started, 0, inputBytes);
      sendJsonRpcError(res, 200, err.code, err.message, message.id, err.data);
    }
  }
}
