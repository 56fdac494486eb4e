/**
 * MCP over Streamable HTTP at `/mcp`, both protocol eras (2025-11-25 and
 * older, 2026-07-28), on the v2 SDK's low-level `Server` (`@modelcontextprotocol/server`):
 * one long-lived `Server` per era, each connected once to its own `PostMux`
 * (mcp/post.ts: the SDK transport's stateless JSON-response checks on the
 * Node request, without the Web Request/Response conversion).
 *
 * Mode: **stateless**. Every HTTP request carries its bearer token and is
 * authenticated on its own; its JSON-RPC request enters its era's SDK Server
 * under an internal id whose context holds that request's Principal and
 * abort signal (`PostMux`), so no caller's identity is ever Server state and
 * there is no session id that could be replayed by another caller. POST answers with
 * a plain JSON body, except a 2026-07-28 `subscriptions/listen`, whose answer is its own SSE stream of
 * task status (mcp/task-listen.ts); GET/DELETE answer 405 (there is no session stream to open) — the SDK's
 * `StreamableHTTPClientTransport` handles both.
 *
 * Per request: Origin check → 403 when an Origin header is present and is
 * not the Server's own origin, not a loopback origin matching the request's
 * loopback Host, and not in `allowed_origins` (the Streamable HTTP
 * transport's DNS-rebinding defence); CORS for `cors_origins` (corsHeaders: a preflight OPTIONS is
 * answered 204 before authentication, every other answer to such an Origin carries the CORS headers,
 * including 401s, so a browser client can read `WWW-Authenticate`); bearer auth → 401 + `WWW-Authenticate` + `Connection: close`
 * when missing or invalid (refusals logged at most REFUSAL_LOG_PER_SECOND per address); Accept 406, Content-Type 415, body limit 413, JSON 400 (mcp/post.ts); then tools/list, tools/call, resources/list,
 * resources/read. A client disconnect aborts a waiting observe.
 */

import type { IncomingMessage, ServerResponse } from "node:http";
import {
  ProtocolErrorCode as ErrorCode,
  isTaskAugmentedRequestParams,
  type JSONRPCMessage,
  type JSONRPCRequest,
  ProtocolError,
  type RequestId,
  Server,
  SUPPORTED_PROTOCOL_VERSIONS,
} from "@modelcontextprotocol/server";
import type { Logger } from "pino";
import { RUN_VIEW_RESOURCE, RUN_VIEW_URI, RunViewMissingError } from "../app/run-view.js";
import { type ClientAddressOf, clientAddressResolver } from "../client-address.js";
import { isLoopbackHost } from "../config.js";
import { bearerToken } from "../principals/tokens.js";
import { RefusalLog } from "../refusal-log.js";
import type { Principal, RunsApi, StartHooks } from "../runs/api.js";
import { ObserveLimits } from "../runs/observe-limits.js";
import { RunTools } from "../runs/tools.js";
import type { ToolModule } from "../tools/contract.js";
import type { AuditLog } from "./audit.js";
import {
  type Era,
  MISSING_REQUIRED_CLIENT_CAPABILITY,
  MODERN_PROTOCOL_VERSIONS,
  PROTOCOL_VERSION_META,
  SERVER_INFO_META,
} from "./era.js";
import { PostMux, readMcpPost, sendJsonRpcError } from "./post.js";
import { PROJECTS_RESOURCE, PROJECTS_RESOURCE_URI } from "./resource.js";
import { declaresTasks, type RunTasks, TASKS_EXTENSION, TaskRequestError } from "./run-tasks.js";
import { ListenRefusal, TaskListens } from "./task-listen.js";
import { McpTools } from "./tools.js";

/** Largest HTTP request body /mcp accepts (a 64 KiB prompt JSON-escaped fits with room). */
export const MCP_MAX_BODY_BYTES = 1024 * 1024;
export const MCP_PATH = "/mcp";
export const MCP_SERVER_INFO = { name: "webcodex", version: "0.1.0" } as const;

/** Request headers a browser MCP client may send cross-origin (both protocol eras). */
export const CORS_ALLOW_HEADERS = [
  "Authorization",
  "Content-Type",
  "Mcp-Session-Id",
  "MCP-Protocol-Version",
  "Mcp-Method",
  "Mcp-Name",
  "Last-Event-ID",
] as const;
/** Response headers a browser MCP client must be able to read. */
export const CORS_EXPOSE_HEADERS = ["WWW-Authenticate", "Mcp-Session-Id", "MCP-Protocol-Version"] as const;
/** How long a browser may cache a preflight answer. */
export const CORS_MAX_AGE_SECS = 600;

export const MCP_INSTRUCTIONS =
  "Delegate coding tasks to operator-configured coding agents. Read webcodex://projects to find project_id and " +
  "provider_id, call start_coding_agent with a fresh idempotency_key, then observe_coding_agent with the returned " +
  "observation_token (wait_secs up to 30) until the state is completed, failed, cancelled or lost.";

export interface McpHttpOptions {
  runs: RunsApi;
  /** Bearer token → Principal, or null when unknown/revoked/malformed. */
  authenticate: (token: string) => Promise<Principal | null>;
  audit: AuditLog;
  logger: Logger;
  observeLimits?: ObserveLimits;
  /** Tools beyond the three run tools (agent tasks, workflow sessions). */
  toolModules?: readonly ToolModule[];
  /** Workflow-session selectors of start_coding_agent. */
  startHooks?: StartHooks;
  /** Runs as MCP Tasks for 2026-07-28 clients that declare the extension (mcp/run-tasks.ts); absent: no Tasks. */
  runTasks?: RunTasks;
  maxBodyBytes?: number;
  /** Origin header values accepted besides the Server's own origin (config `[server] allowed_origins`). */
  allowedOrigins?: readonly string[];
  /** Origins answered with CORS headers (config `[server] cors_origins`); each is also an allowed Origin. */
  corsOrigins?: readonly string[];
  /** The request's client address for refusal logs (config `[server] trusted_proxies`); default the socket peer. */
  clientAddress?: ClientAddressOf;
  /** The listen host (config `[server] host`): an Origin naming it, on the Server's port, is same-origin. */
  listenHost?: string;
  /**
   * OAuth (oauth/index.ts): the `WWW-Authenticate` value of a 401, pointing at the RFC 9728
   * metadata. Absent: the static-token challenge `Bearer realm="webcodex"`.
   */
  unauthorizedChallenge?: (invalidToken: boolean) => string;
  /**
   * OAuth: the scopes to ask for when this principal's token lacks what the named tools need
   * (→ 403 insufficient_scope with `challenge(scopes)`, and an audit row per refused tools/call: outcome
   * `forbidden`), or null to proceed. Static tokens get null.
   */
  insufficientScope?: {
    check: (principal: Principal, toolNames: readonly string[]) => readonly string[] | null;
    challenge: (scopes: readonly string[]) => string;
  };
}

/** Cache hints (2026-07-28 `ttlMs`/`cacheScope`) of answers that are the same for every caller while this Server runs. */
export const STATIC_LIST_CACHE = { ttlMs: 300_000, cacheScope: "public" } as const;
/** Cache hints of the caller's webcodex://projects (per principal; Runner presence changes it). */
export const PROJECTS_READ_CACHE = { ttlMs: 5_000, cacheScope: "private" } as const;
/** What `server/discover` advertises. */
const MODERN_CAPABILITIES = { tools: {}, resources: {} } as const;

/**
 * A result answered outside the SDK `Server` (the Tasks paths) as its era expects it: unchanged for a
 * 2025-era request; for a 2026-07-28 one with `resultType: "complete"`.
 */
function modernResult<T extends object>(era: Era, result: T): T {
  if (era.kind !== "modern") return result;
  return { ...result, resultType: "complete" };
}

/** A result's own cache hints on the 2026-07-28 era (the SDK adds `resultType` and keeps these). */
function withCache<T extends object>(modern: boolean, result: T, cache: { ttlMs: number; cacheScope: string }): T {
  return modern ? { ...result, ...cache } : result;
}

/**
 * A JSON-RPC error a handler throws, worded as this Server has always worded it on the wire: the message
 * carries the `MCP error <code>: ` prefix (the v1 SDK's `McpError` put it there, and clients may match it).
 */
function mcpError(code: number, message: string, data?: unknown): ProtocolError {
  return new ProtocolError(code, `MCP error ${code}: ${message}`, data);
}

/** Whether a 2026-07-28 request is a Tasks request or a task-backed start (answered by answerTaskRequest). */
function isTaskRequest(message: JSONRPCMessage, era: Era, tools: McpTools): boolean {
  if (!("method" in message) || !("id" in message)) return false;
  if (message.method.startsWith("tasks/")) return true;
  if (message.method !== "tools/call" || !declaresTasks(era)) return false;
  const name = (message.params as { name?: unknown } | undefined)?.name;
  return typeof name === "string" && tools.startsRun(name);
}

/** The params object of a parsed body, or an empty one. */
function paramsOf(raw: unknown): Readonly<Record<string, unknown>> {
  const params = (raw as { params?: unknown } | null)?.params;
  return typeof params === "object" && params !== null && !Array.isArray(params)
    ? (params as Record<string, unknown>)
    : {};
}

/** The run tool whose authority each Tasks method exercises (for the OAuth scope check and the audit). */
const TASK_METHOD_TOOL: Readonly<Record<string, string>> = {
  "tasks/get": "observe_coding_agent",
  "tasks/cancel": "cancel_coding_agent",
  "tasks/update": "observe_coding_agent",
  // The only notifications a listen carries are task status.
  "subscriptions/listen": "observe_coding_agent",
};

/** Names of the tools a POST calls. */
function calledTools(messages: readonly JSONRPCMessage[]): string[] {
  const names: string[] = [];
  for (const m of messages) {
    if (!("method" in m)) continue;
    // A task request acts on a run as the run tool would: it needs what that tool needs.
    const asTool = TASK_METHOD_TOOL[m.method];
    if (asTool !== undefined) names.push(asTool);
    if (m.method !== "tools/call") continue;
    const name = (m.params as { name?: unknown } | undefined)?.name;
    if (typeof name === "string") names.push(name);
  }
  return names;
}

/**
 * Whether a request's Origin header is acceptable (DNS-rebinding defence). Absent: yes (not a browser).
 * Present, only:
 * - an exact entry of `allowed`;
 * - the Server's own origin: http(s) on the port this request arrived on, host loopback or the configured
 *   listen host;
 * - a loopback origin whose host is the request's own loopback `Host` (any port): a browser-based MCP tool
 *   served from localhost talking to a Server on localhost (`http://localhost:6274` → `Host: localhost:7420`).
 * A rebinding page is never one of these: its Origin names its own domain (`http://evil.example`), and so does
 * the Host its requests carry.
 */
export function originAllowed(
  origin: string | undefined,
  localPort: number | undefined,
  allowed: readonly string[],
  listenHost: string,
  requestHost?: string,
): boolean {
  if (origin === undefined) return true;
  if (allowed.includes(origin)) return true;
  let u: URL;
  try {
    u = new URL(origin);
  } catch {
    return false;
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") return false;
  const host = bareHost(u.hostname);
  if (isLoopbackHost(host) && host === hostOfHeader(requestHost)) return true;
  const port = u.port === "" ? (u.protocol === "https:" ? 443 : 80) : Number(u.port);
  if (localPort === undefined || port !== localPort) return false;
  return isLoopbackHost(host) || (host === listenHost.toLowerCase() && host !== "0.0.0.0" && host !== "::");
}

function bareHost(hostname: string): string {
  return hostname.replace(/^\[|\]$/g, "").toLowerCase();
}

/** The host name of a `Host` header (`name[:port]`, `[v6][:port]`), or undefined when absent or malformed. */
function hostOfHeader(header: string | undefined): string | undefined {
  if (header === undefined || header === "") return undefined;
  try {
    const u = new URL(`http://${header}`);
    // Exactly host[:port]: anything else (credentials, a path) is not a Host header.
    if (u.username !== "" || u.password !== "" || u.pathname !== "/" || u.search !== "" || u.hash !== "") {
      return undefined;
    }
    if (header.includes("/") || header.includes("@")) return undefined;
    return bareHost(u.hostname);
  } catch {
    return undefined;
  }
}

/**
 * Why a tools/call's params are malformed (no string `name`, or `arguments` that is not an object), or null.
 * The SDK's request schema would refuse such a call as an *internal* error (-32603) whose message is a raw
 * schema dump; it is answered here instead as invalid params (-32602) naming the field, and audited, since
 * no tool sees it.
 */
function malformedToolCall(m: JSONRPCMessage): string | null {
  if (!("method" in m) || m.method !== "tools/call") return null;
  const p = m.params as Record<string, unknown> | undefined;
  if (typeof p !== "object" || p === null || Array.isArray(p)) return "params: must be an object with a string name";
  if (typeof p.name !== "string") return "params.name: must be a string (the tool's name)";
  const args = p.arguments;
  if (args !== undefined && (typeof args !== "object" || args === null || Array.isArray(args)))
    return "params.arguments: must be an object of the tool's arguments";
  return null;
}

/** The 2025-era methods the Server answers (the v2 SDK's codec answers any other "Method not found"). */
const LEGACY_METHODS: ReadonlySet<string> = new Set([
  "initialize",
  "ping",
  "tools/list",
  "tools/call",
  "resources/list",
  "resources/templates/list",
  "resources/read",
  "server/discover",
]);

/**
 * What this Server has always answered to two 2025-era requests the v2 SDK's 2025 codec answers otherwise,
 * or null for every other request:
 * - a request asking for 2025 task creation (`params.task`): this Server offers no 2025 Tasks capability, so
 *   it is refused (-32603) as the v1 SDK refused it; the v2 SDK no longer knows 2025 Tasks and would run it;
 * - `server/discover` without the 2026 `_meta` claim: -32601 saying what to send, not a bare "Method not found".
 */
function legacyRefusal(m: JSONRPCMessage): { code: number; message: string } | null {
  if (!("method" in m) || !("id" in m) || !LEGACY_METHODS.has(m.method)) return null;
  if (isTaskAugmentedRequestParams(m.params) && m.params.task) {
    return {
      code: ErrorCode.InternalError,
      message: `Server does not support task creation (required for ${m.method})`,
    };
  }
  if (m.method === "server/discover") {
    return {
      code: ErrorCode.MethodNotFound,
      message: `MCP error ${ErrorCode.MethodNotFound}: server/discover is a 2026-07-28 request: send _meta["${PROTOCOL_VERSION_META}"] and the MCP-Protocol-Version header (2025-era clients: initialize).`,
    };
  }
  return null;
}

/** A Node request handler for `/mcp`; hand it every request whose path is /mcp. */
export interface McpHttpHandler {
  (req: IncomingMessage, res: ServerResponse): Promise<void>;
  /** Abort in-flight requests (waiting observes) and refuse new ones. */
  close(): Promise<void>;
}

export function createMcpHttpHandler(options: McpHttpOptions): McpHttpHandler {
  const { runs, authenticate, audit, logger } = options;
  const maxBodyBytes = options.maxBodyBytes ?? MCP_MAX_BODY_BYTES;
  const corsOrigins = options.corsOrigins ?? [];
  const allowedOrigins = [...(options.allowedOrigins ?? []), ...corsOrigins];
  const clientAddress = options.clientAddress ?? clientAddressResolver([]);
  const listenHost = options.listenHost ?? "127.0.0.1";
  // One bound for waiting observes and listens alike (a listen holds one slot while it is open).
  const observeLimits = options.observeLimits ?? new ObserveLimits();
  const runTools = new RunTools({
    runs,
    observeLimits,
    ...(options.startHooks ? { startHooks: options.startHooks } : {}),
  });
  const tools = new McpTools({ runs, audit, logger, modules: [runTools, ...(options.toolModules ?? [])] });
  const runTasks = options.runTasks;
  const listens = runTasks
    ? new TaskListens({
        tasks: runTasks,
        runs,
        observeLimits,
        logger,
        serverInfoMeta: SERVER_INFO_META,
        serverInfo: MCP_SERVER_INFO,
      })
    : null;
  const inFlight = new Set<AbortController>();
  const refusals = new RefusalLog(logger);
  let closed = false;

  /** What a request's handler needs of its POST, found by the id the request has inside its Server. */
  interface RequestContext {
    principal: Principal;
    signal: AbortSignal;
    /** The MCP era the request speaks (mcp/era.ts). */
    era: Era;
    /** The request's params as JSON.parse built them: the SDK's schemas drop `_wc` (the recorder envelope). */
    rawParams: Readonly<Record<string, unknown>>;
  }
  // One long-lived v2 SDK Server per era, each connected once to its own mux; each request's principal and
  // signal come from its own context, never from the Server. Era is Server state in the v2 SDK (its wire
  // codec: the 2026-07-28 one adds `resultType`, the cache hints, `_meta` serverInfo, checks the `_meta`
  // envelope and knows `server/discover`), so the two eras cannot share one Server.
  const muxes = {
    legacy: new PostMux<RequestContext>(),
    modern: new PostMux<RequestContext>({ era: "modern", revision: MODERN_PROTOCOL_VERSIONS[0] }),
  };
  const servers = {
    // The 2025 era: capabilities as `initialize` has always answered them.
    legacy: new Server(MCP_SERVER_INFO, { capabilities: { tools: {}, resources: {} }, instructions: MCP_INSTRUCTIONS }),
    // The 2026-07-28 era: `server/discover` (the SDK's) advertises the Tasks extension when runs are tasks.
    modern: new Server(MCP_SERVER_INFO, {
      capabilities: runTasks ? { ...MODERN_CAPABILITIES, extensions: { [TASKS_EXTENSION]: {} } } : MODERN_CAPABILITIES,
      instructions: MCP_INSTRUCTIONS,
      supportedProtocolVersions: [...SUPPORTED_PROTOCOL_VERSIONS, ...MODERN_PROTOCOL_VERSIONS],
      cacheHints: {
        "server/discover": STATIC_LIST_CACHE,
        "tools/list": STATIC_LIST_CACHE,
        "resources/list": STATIC_LIST_CACHE,
        "resources/templates/list": STATIC_LIST_CACHE,
      },
    }),
  };
  for (const kind of ["legacy", "modern"] as const) {
    const mux = muxes[kind];
    const modern = kind === "modern";
    const contextOf = (requestId: RequestId): RequestContext => {
      const context = mux.context(requestId);
      // Delivered requests keep their context until answered or abandoned; an abandoned one is not answered.
      if (!context) throw mcpError(ErrorCode.InternalError, "The request is no longer waiting for an answer.");
      return context;
    };
    const server = servers[kind];
    server.setRequestHandler("tools/list", () => ({ tools: tools.definitions(modern) }));
    server.setRequestHandler("tools/call", async (request, ctx) => {
      const { principal, signal, rawParams } = contextOf(ctx.mcpReq.id);
      const name = request.params.name;
      if (!tools.has(name)) {
        tools.recordRefusedCall(principal, "unknown_tool");
        throw mcpError(ErrorCode.InvalidParams, "Unknown tool; see tools/list.");
      }
      // Stateless: a notifications/cancelled could only arrive in another POST (and is never delivered),
      // so the request's own signal (client disconnect, shutdown) is the only one that can fire.
      const envelope = { modern, params: rawParams };
      // The arguments as JSON.parse built them (the SDK's copy drops a top-level `__proto__`): the router
      // checks their shape, once.
      return tools.call(principal, name, rawParams.arguments, signal, envelope);
    });
    server.setRequestHandler("resources/list", () => ({ resources: [PROJECTS_RESOURCE, RUN_VIEW_RESOURCE] }));
    server.setRequestHandler("resources/templates/list", () => ({ resourceTemplates: [] }));
    server.setRequestHandler("resources/read", async (request, ctx) => {
      const { principal } = contextOf(ctx.mcpReq.id);
      const uri = request.params.uri;
      if (uri === RUN_VIEW_URI) {
        try {
          return withCache(modern, tools.readRunView(principal), STATIC_LIST_CACHE);
        } catch (err) {
          if (err instanceof RunViewMissingError) throw mcpError(ErrorCode.InternalError, err.message);
          throw err;
        }
      }
      if (uri !== PROJECTS_RESOURCE_URI) {
        tools.recordRefusedCall(principal, "unknown_resource");
        const known = `${PROJECTS_RESOURCE_URI} and ${RUN_VIEW_URI}`;
        // 2026-07-28 (SEP-2164): invalid params whose data names the URI that was not found.
        if (modern) throw mcpError(ErrorCode.InvalidParams, `Resource not found. The resources are ${known}.`, { uri });
        throw mcpError(ErrorCode.InvalidParams, `Unknown resource. The resources are ${known}.`);
      }
      return withCache(modern, await tools.readProjects(principal), PROJECTS_READ_CACHE);
    });
  }
  const connected = Promise.all([servers.legacy.connect(muxes.legacy), servers.modern.connect(muxes.modern)]);

  const handler = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (closed) {
      sendJsonRpcError(res, 503, -32000, "Server is shutting down");
      return;
    }
    const origin = req.headers.origin;
    if (origin !== undefined && corsOrigins.includes(origin)) {
      res.setHeader("Access-Control-Allow-Origin", origin);
      res.setHeader("Vary", "Origin");
      res.setHeader("Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS.join(", "));
      if (req.method === "OPTIONS") {
        res.setHeader("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        res.setHeader("Access-Control-Allow-Headers", CORS_ALLOW_HEADERS.join(", "));
        res.setHeader("Access-Control-Max-Age", String(CORS_MAX_AGE_SECS));
        res.writeHead(204).end();
        return;
      }
    }
    if (!originAllowed(origin, req.socket.localPort, allowedOrigins, listenHost, req.headers.host)) {
      refusals.refused(
        clientAddress(req),
        { path: MCP_PATH, origin: origin?.slice(0, 128) },
        "mcp request refused: origin not allowed",
      );
      sendJsonRpcError(res, 403, -32000, "Forbidden: this Origin is not allowed (server allowed_origins)");
      return;
    }
    const token = bearerToken(req.headers.authorization);
    const principal = token === null ? null : await authenticate(token);
    if (!principal) {
      // Never log the presented token, not even a prefix.
      refusals.refused(
        clientAddress(req),
        { path: MCP_PATH, reason: token === null ? "missing" : "invalid" },
        "mcp request unauthorized",
      );
      const challenge = options.unauthorizedChallenge
        ? options.unauthorizedChallenge(token !== null)
        : token === null
          ? 'Bearer realm="webcodex"'
          : 'Bearer realm="webcodex", error="invalid_token", error_description="The bearer token is not valid"';
      res.setHeader("WWW-Authenticate", challenge);
      // An unauthenticated caller does not keep the socket: it is closed once the 401 is written.
      res.setHeader("Connection", "close");
      sendJsonRpcError(res, 401, -32001, "Unauthorized: send Authorization: Bearer <token> issued by the operator");
      return;
    }
    if (req.method !== "POST") {
      res.setHeader("Allow", "POST");
      sendJsonRpcError(res, 405, -32000, "Method not allowed: this server is stateless; use POST");
      return;
    }
    const post = await readMcpPost(req, res, maxBodyBytes);
    if (post === null) return;
    const scopeCheck = options.insufficientScope;
    const called = calledTools([post.message]);
    const wanted = scopeCheck ? scopeCheck.check(principal, called) : null;
    if (scopeCheck && wanted) {
      for (const name of called) tools.recordScopeRefusal(principal, name);
      res.setHeader("WWW-Authenticate", scopeCheck.challenge(wanted));
      sendJsonRpcError(res, 403, -32001, `Forbidden: insufficient_scope (this call needs: ${wanted.join(" ")})`);
      return;
    }
    const abort = new AbortController();
    const malformed = malformedToolCall(post.message);
    if (malformed !== null) {
      tools.recordRefusedCall(principal, "malformed_call");
      const id = "id" in post.message ? post.message.id : null;
      sendJsonRpcError(res, 200, -32602, `Invalid params: ${malformed}`, id);
      return;
    }
    // A notification or a client's response: nothing for a stateless Server to do (mcp/post.ts PostMux).
    if (post.request === null) {
      res.writeHead(202).end();
      return;
    }
    if (
      post.era.kind === "modern" &&
      "method" in post.message &&
      post.message.method.startsWith("tasks/") &&
      !(runTasks && declaresTasks(post.era))
    ) {
      // A Tasks request from a client that did not declare the extension (or to a Server without Tasks).
      sendJsonRpcError(
        res,
        400,
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        runTasks
          ? `${post.message.method} needs the ${TASKS_EXTENSION} extension: declare it in _meta["io.modelcontextprotocol/clientCapabilities"].extensions`
          : `${post.message.method}: this Server offers no Tasks`,
        post.request,
        { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } },
      );
      return;
    }
    if (
      listens &&
      post.era.kind === "modern" &&
      "method" in post.message &&
      post.message.method === "subscriptions/listen"
    ) {
      await answerListen(res, post.message as JSONRPCRequest, post.era, principal, paramsOf(post.raw));
      return;
    }
    if (runTasks && post.era.kind === "modern" && isTaskRequest(post.message, post.era, tools)) {
      await answerTaskRequest(res, post.message as JSONRPCRequest, post.era, principal, paramsOf(post.raw));
      return;
    }
    const legacyRefused = post.era.kind === "legacy" ? legacyRefusal(post.message) : null;
    if (legacyRefused !== null) {
      sendJsonRpcError(res, 200, legacyRefused.code, legacyRefused.message, post.request);
      return;
    }
    const mux = muxes[post.era.kind];
    inFlight.add(abort);
    let internal: number | null = null;
    res.once("close", () => {
      inFlight.delete(abort);
      // Not answered: the client went away (or the Server is closing) — stop the waiting work.
      if (internal === null || !mux.waiting(internal)) return;
      mux.abandon(internal);
      abort.abort(new Error("client closed the request"));
    });
    try {
      await connected;
      internal = mux.deliver(res, post.message as JSONRPCMessage & { id: RequestId }, {
        principal,
        signal: abort.signal,
        era: post.era,
        rawParams: paramsOf(post.raw),
      });
    } catch (err) {
      logger.error({ err: err instanceof Error ? err.name : typeof err }, "mcp request failed");
      sendJsonRpcError(res, 500, -32603, "Internal server error");
    }
  };

  /**
   * Task requests (`tasks/get`, `tasks/cancel`, `tasks/update`) and the task-backed start of a run are
   * answered here rather than by the SDK `Server`: the v2 server SDK has no side of the Tasks extension
   * (`@modelcontextprotocol/ext-tasks` ships the client side only), and its `tools/call` wrapper validates
   * every answer as a `CallToolResult`, which a task answer is not. The task-backed start is the same audited
   * `tools.call` as any start; only its answer is the task.
   */
  async function answerTaskRequest(
    res: ServerResponse,
    message: JSONRPCRequest,
    era: Era,
    principal: Principal,
    rawParams: Readonly<Record<string, unknown>>,
  ): Promise<void> {
    const tasks = runTasks as RunTasks;
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
      logger.error({ err: err instanceof Error ? err.name : typeof err }, "mcp task request failed");
      sendJsonRpcError(res, 200, -32603, "Internal error", message.id);
    }
  }

  /** `subscriptions/listen` (mcp/task-listen.ts): task status as an SSE stream; one audit row when it ends. */
  async function answerListen(
    res: ServerResponse,
    message: JSONRPCRequest,
    era: Era,
    principal: Principal,
    rawParams: Readonly<Record<string, unknown>>,
  ): Promise<void> {
    const started = performance.now();
    try {
      const streamed = await (listens as TaskListens).serve(res, message.id, era, principal, rawParams);
      tools.recordTaskRequest(
        principal,
        "task:listen",
        null,
        "ok",
        started,
        streamed,
        Buffer.byteLength(JSON.stringify(rawParams)),
      );
    } catch (err) {
      if (!(err instanceof ListenRefusal)) throw err;
      tools.recordTaskRequest(
        principal,
        "task:listen",
        null,
        err.outcome,
        started,
        0,
        Buffer.byteLength(JSON.stringify(rawParams)),
      );
      sendJsonRpcError(res, 200, err.code, err.message, message.id, err.data);
    }
  }

  return Object.assign(handler, {
    async close(): Promise<void> {
      closed = true;
      listens?.closeAll();
      for (const abort of inFlight) abort.abort(new Error("server closing"));
      inFlight.clear();
    },
  });
}
