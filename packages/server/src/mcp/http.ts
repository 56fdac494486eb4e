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
 * Per request, the gates of mcp/gate.ts (CORS, Origin, bearer — each answers its own refusal), then the
 * stateless POST checks (405 for other methods; Accept 406, Content-Type 415, body limit 413, JSON 400:
 * mcp/post.ts), the OAuth scope challenge (gate.ts), a malformed tools/call (-32602 naming the field), and
 * the era dispatch: the Tasks answers (mcp/task-requests.ts) or the era's SDK `Server` (tools/list,
 * tools/call, resources/list, resources/read). A client disconnect aborts a waiting observe.
 */

import type { IncomingMessage, ServerResponse } from "node:http";
import {
  ProtocolErrorCode as ErrorCode,
  isTaskAugmentedRequestParams,
  type JSONRPCMessage,
  ProtocolError,
  type RequestId,
  Server,
  SUPPORTED_PROTOCOL_VERSIONS,
} from "@modelcontextprotocol/server";
import type { Logger } from "pino";
import { RUN_VIEW_RESOURCE, RUN_VIEW_URI, RunViewMissingError } from "../app/run-view.js";
import { type ClientAddressOf, clientAddressResolver } from "../client-address.js";
import { RefusalLog } from "../refusal-log.js";
import type { Principal, RunsApi, StartHooks } from "../runs/api.js";
import { ObserveLimits } from "../runs/observe-limits.js";
import { RunTools } from "../runs/tools.js";
import type { ToolModule } from "../tools/contract.js";
import type { AuditLog } from "./audit.js";
import { type Era, MODERN_PROTOCOL_VERSIONS, PROTOCOL_VERSION_META } from "./era.js";
import { bearerGate, corsGate, type GateLog, originGate, type ScopeChallenge, scopeGate } from "./gate.js";
import { type CheckedPost, PostMux, paramsOf, readMcpPost, sendJsonRpcError } from "./post.js";
import { PROJECTS_RESOURCE, PROJECTS_RESOURCE_URI } from "./resource.js";
import { type RunTasks, TASKS_EXTENSION } from "./run-tasks.js";
import { refuseUndeclaredTasks, TaskRequests } from "./task-requests.js";
import { McpTools } from "./tools.js";

/** Largest HTTP request body /mcp accepts (a 64 KiB prompt JSON-escaped fits with room). */
export const MCP_MAX_BODY_BYTES = 1024 * 1024;
export const MCP_SERVER_INFO = { name: "webcodex", version: "0.1.0" } as const;

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
  insufficientScope?: ScopeChallenge;
}

/** Cache hints (2026-07-28 `ttlMs`/`cacheScope`) of answers that are the same for every caller while this Server runs. */
export const STATIC_LIST_CACHE = { ttlMs: 300_000, cacheScope: "public" } as const;
/** Cache hints of the caller's webcodex://projects (per principal; Runner presence changes it). */
export const PROJECTS_READ_CACHE = { ttlMs: 5_000, cacheScope: "private" } as const;
/** What `server/discover` advertises. */
const MODERN_CAPABILITIES = { tools: {}, resources: {} } as const;

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

/** What a request's handler needs of its POST, found by the id the request has inside its era's Server. */
interface RequestContext {
  principal: Principal;
  signal: AbortSignal;
  /** The MCP era the request speaks (mcp/era.ts). */
  era: Era;
  /** The request's params as JSON.parse built them: the SDK's schemas drop `_wc` (the recorder envelope). */
  rawParams: Readonly<Record<string, unknown>>;
}

/**
 * One era's SDK `Server` with its request handlers: tools/list, tools/call (the router), resources/list,
 * resources/templates/list, resources/read. `offersTasks`: the 2026-07-28 `server/discover` advertises the
 * Tasks extension.
 */
function eraServer(kind: Era["kind"], mux: PostMux<RequestContext>, tools: McpTools, offersTasks: boolean): Server {
  const modern = kind === "modern";
  const server = modern
    ? new Server(MCP_SERVER_INFO, {
        capabilities: offersTasks
          ? { ...MODERN_CAPABILITIES, extensions: { [TASKS_EXTENSION]: {} } }
          : MODERN_CAPABILITIES,
        instructions: MCP_INSTRUCTIONS,
        supportedProtocolVersions: [...SUPPORTED_PROTOCOL_VERSIONS, ...MODERN_PROTOCOL_VERSIONS],
        cacheHints: {
          "server/discover": STATIC_LIST_CACHE,
          "tools/list": STATIC_LIST_CACHE,
          "resources/list": STATIC_LIST_CACHE,
          "resources/templates/list": STATIC_LIST_CACHE,
        },
      })
    : // The 2025 era: capabilities as `initialize` has always answered them.
      new Server(MCP_SERVER_INFO, { capabilities: { tools: {}, resources: {} }, instructions: MCP_INSTRUCTIONS });
  const contextOf = (requestId: RequestId): RequestContext => {
    const context = mux.context(requestId);
    // Delivered requests keep their context until answered or abandoned; an abandoned one is not answered.
    if (!context) throw mcpError(ErrorCode.InternalError, "The request is no longer waiting for an answer.");
    return context;
  };
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
  return server;
}

/** A Node request handler for `/mcp`; hand it every request whose path is /mcp. */
export interface McpHttpHandler {
  (req: IncomingMessage, res: ServerResponse): Promise<void>;
  /** Abort in-flight requests (waiting observes) and refuse new ones. */
  close(): Promise<void>;
}

export function createMcpHttpHandler(options: McpHttpOptions): McpHttpHandler {
  const { runs, audit, logger } = options;
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
  const taskRequests = runTasks
    ? new TaskRequests({ runTasks, tools, runs, observeLimits, logger, serverInfo: MCP_SERVER_INFO })
    : null;
  const inFlight = new Set<AbortController>();
  const gateLog: GateLog = { refusals: new RefusalLog(logger), clientAddress };
  let closed = false;

  // One long-lived v2 SDK Server per era, each connected once to its own mux; each request's principal and
  // signal come from its own context, never from the Server. Era is Server state in the v2 SDK (its wire
  // codec: the 2026-07-28 one adds `resultType`, the cache hints, `_meta` serverInfo, checks the `_meta`
  // envelope and knows `server/discover`), so the two eras cannot share one Server.
  const muxes = {
    legacy: new PostMux<RequestContext>(),
    modern: new PostMux<RequestContext>({ era: "modern", revision: MODERN_PROTOCOL_VERSIONS[0] }),
  };
  const servers = {
    legacy: eraServer("legacy", muxes.legacy, tools, false),
    modern: eraServer("modern", muxes.modern, tools, !!runTasks),
  };
  const connected = Promise.all([servers.legacy.connect(muxes.legacy), servers.modern.connect(muxes.modern)]);

  /** The era dispatch of an authenticated, checked POST that is a request: Tasks answers, or the era's Server. */
  async function dispatch(res: ServerResponse, post: CheckedPost & { request: RequestId }, principal: Principal) {
    if (refuseUndeclaredTasks(res, post, runTasks)) return;
    if (taskRequests && (await taskRequests.answer(res, post, principal))) return;
    const legacyRefused = post.era.kind === "legacy" ? legacyRefusal(post.message) : null;
    if (legacyRefused !== null) {
      sendJsonRpcError(res, 200, legacyRefused.code, legacyRefused.message, post.request);
      return;
    }
    const mux = muxes[post.era.kind];
    const abort = new AbortController();
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
  }

  const handler = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (closed) {
      sendJsonRpcError(res, 503, -32000, "Server is shutting down");
      return;
    }
    if (corsGate(req, res, corsOrigins)) return;
    if (!originGate(req, res, allowedOrigins, listenHost, gateLog)) return;
    const principal = await bearerGate(req, res, options, gateLog);
    if (!principal) return;
    if (req.method !== "POST") {
      res.setHeader("Allow", "POST");
      sendJsonRpcError(res, 405, -32000, "Method not allowed: this server is stateless; use POST");
      return;
    }
    const post = await readMcpPost(req, res, maxBodyBytes);
    if (post === null) return;
    const scopeRefused = (name: string) => tools.recordScopeRefusal(principal, name);
    if (!scopeGate(res, principal, post.message, options.insufficientScope, scopeRefused)) return;
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
    await dispatch(res, { ...post, request: post.request }, principal);
  };

  return Object.assign(handler, {
    async close(): Promise<void> {
      closed = true;
      taskRequests?.closeAll();
      for (const abort of inFlight) abort.abort(new Error("server closing"));
      inFlight.clear();
    },
  });
}
