/**
 * The gates every `/mcp` request passes before its era's dispatch (mcp/http.ts), in this order, each a small
 * function that either lets the request on or answers it itself:
 *
 * 1. `corsGate` — for an Origin in `cors_origins`: the CORS headers on every answer (401s included, so a
 *    browser client can read `WWW-Authenticate`), and a preflight OPTIONS answered 204 before authentication;
 * 2. `originGate` — the Streamable HTTP transport's DNS-rebinding defence: 403 when an Origin header is present
 *    and is not the Server's own origin, not a loopback origin matching the request's loopback Host, and not
 *    in `allowed_origins` (`originAllowed`);
 * 3. `bearerGate` — bearer auth into a Principal; 401 + `WWW-Authenticate` + `Connection: close` when the
 *    token is missing or invalid;
 * 4. `scopeGate` — OAuth only: 403 `insufficient_scope` with the challenge naming the scopes to ask for, when
 *    the token lacks what the called tools need. This asks the client for a wider token; what a principal may
 *    do is still decided by the services (principals/authority.ts).
 *
 * Refusals of gates 2 and 3 are logged at most REFUSAL_LOG_PER_SECOND per address, never with the token.
 */

import type { IncomingMessage, ServerResponse } from "node:http";
import type { JSONRPCMessage } from "@modelcontextprotocol/server";
import type { ClientAddressOf } from "../client-address.js";
import { isLoopbackHost } from "../config.js";
import { bearerToken } from "../principals/tokens.js";
import type { RefusalLog } from "../refusal-log.js";
import type { Principal } from "../runs/api.js";
import { sendJsonRpcError } from "./post.js";

export const MCP_PATH = "/mcp";

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

/** Where a refused request is logged from, and at what rate (shared by the gates of one handler). */
export interface GateLog {
  refusals: RefusalLog;
  clientAddress: ClientAddressOf;
}

/**
 * Gate 1: CORS for an Origin in `corsOrigins`. Returns true when it answered the request (a preflight),
 * false when the request goes on (with the CORS headers set when its Origin is listed).
 */
export function corsGate(req: IncomingMessage, res: ServerResponse, corsOrigins: readonly string[]): boolean {
  const origin = req.headers.origin;
  if (origin === undefined || !corsOrigins.includes(origin)) return false;
  res.setHeader("Access-Control-Allow-Origin", origin);
  res.setHeader("Vary", "Origin");
  res.setHeader("Access-Control-Expose-Headers", CORS_EXPOSE_HEADERS.join(", "));
  if (req.method !== "OPTIONS") return false;
  res.setHeader("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
  res.setHeader("Access-Control-Allow-Headers", CORS_ALLOW_HEADERS.join(", "));
  res.setHeader("Access-Control-Max-Age", String(CORS_MAX_AGE_SECS));
  res.writeHead(204).end();
  return true;
}

/**
 * Gate 2: the Origin check. Returns true when the request may go on; otherwise it answered 403.
 * `allowed`: `allowed_origins` and `cors_origins`; `listenHost`: the configured listen host.
 */
export function originGate(
  req: IncomingMessage,
  res: ServerResponse,
  allowed: readonly string[],
  listenHost: string,
  log: GateLog,
): boolean {
  const origin = req.headers.origin;
  if (originAllowed(origin, req.socket.localPort, allowed, listenHost, req.headers.host)) return true;
  log.refusals.refused(
    log.clientAddress(req),
    { path: MCP_PATH, origin: origin?.slice(0, 128) },
    "mcp request refused: origin not allowed",
  );
  sendJsonRpcError(res, 403, -32000, "Forbidden: this Origin is not allowed (server allowed_origins)");
  return false;
}

/** What bearerGate needs: token → Principal, and the 401 challenge (OAuth's, or the static-token one). */
export interface BearerOptions {
  /** Bearer token → Principal, or null when unknown/revoked/malformed. */
  authenticate: (token: string) => Promise<Principal | null>;
  /** The `WWW-Authenticate` value of a 401 (OAuth: pointing at the RFC 9728 metadata); absent: `Bearer realm`. */
  unauthorizedChallenge?: ((invalidToken: boolean) => string) | undefined;
}

/** The static-token 401 challenge: a realm, and `invalid_token` when a token was presented. */
export function staticChallenge(invalidToken: boolean): string {
  return invalidToken
    ? 'Bearer realm="webcodex", error="invalid_token", error_description="The bearer token is not valid"'
    : 'Bearer realm="webcodex"';
}

/** Gate 3: the request's Principal, or null when it answered 401 (the socket is closed after it). */
export async function bearerGate(
  req: IncomingMessage,
  res: ServerResponse,
  options: BearerOptions,
  log: GateLog,
): Promise<Principal | null> {
  const token = bearerToken(req.headers.authorization);
  const principal = token === null ? null : await options.authenticate(token);
  if (principal) return principal;
  // Never log the presented token, not even a prefix.
  log.refusals.refused(
    log.clientAddress(req),
    { path: MCP_PATH, reason: token === null ? "missing" : "invalid" },
    "mcp request unauthorized",
  );
  res.setHeader("WWW-Authenticate", (options.unauthorizedChallenge ?? staticChallenge)(token !== null));
  // An unauthenticated caller does not keep the socket: it is closed once the 401 is written.
  res.setHeader("Connection", "close");
  sendJsonRpcError(res, 401, -32001, "Unauthorized: send Authorization: Bearer <token> issued by the operator");
  return null;
}

/**
 * OAuth: the scopes to ask for when this principal's token lacks what the named tools need, or null to proceed
 * (static tokens: always null), and the `WWW-Authenticate` challenge naming them.
 */
export interface ScopeChallenge {
  check: (principal: Principal, toolNames: readonly string[]) => readonly string[] | null;
  challenge: (scopes: readonly string[]) => string;
}

/** The run tool whose authority each Tasks method exercises (for the OAuth scope check and the audit). */
const TASK_METHOD_TOOL: Readonly<Record<string, string>> = {
  "tasks/get": "observe_coding_agent",
  "tasks/cancel": "cancel_coding_agent",
  "tasks/update": "observe_coding_agent",
  // The only notifications a listen carries are task status.
  "subscriptions/listen": "observe_coding_agent",
};

/** Names of the tools a POST calls (a Tasks request counts as the run tool it acts as). */
export function calledTools(messages: readonly JSONRPCMessage[]): string[] {
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
 * Gate 4: the OAuth scope challenge. Returns true when the request may go on; otherwise it answered 403
 * `insufficient_scope` and called `refused(toolName)` for each called tool (the router audits them).
 */
export function scopeGate(
  res: ServerResponse,
  principal: Principal,
  message: JSONRPCMessage,
  scopes: ScopeChallenge | undefined,
  refused: (toolName: string) => void,
): boolean {
  if (!scopes) return true;
  const called = calledTools([message]);
  const wanted = scopes.check(principal, called);
  if (!wanted) return true;
  for (const name of called) refused(name);
  res.setHeader("WWW-Authenticate", scopes.challenge(wanted));
  sendJsonRpcError(res, 403, -32001, `Forbidden: insufficient_scope (this call needs: ${wanted.join(" ")})`);
  return false;
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
