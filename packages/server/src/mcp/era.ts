/**
 * Which MCP era one POST speaks, decided per request (no state, so any
 * Server process may answer any request):
 *
 * - **modern** (2026-07-28): the request's `params._meta` carries
 *   `io.modelcontextprotocol/protocolVersion` (with client info and
 *   capabilities); no `initialize` is needed. The `MCP-Protocol-Version`,
 *   `Mcp-Method` and (for `tools/call`, `resources/read`, `tasks/*`)
 *   `Mcp-Name` headers are required and must agree with the body.
 * - **legacy** (2025-11-25, 2025-06-18, 2025-03-26): anything without that
 *   claim, served exactly as before.
 *
 * The body-primary classification, the `_meta` envelope checks and the
 * header/body cross-checks on protocol version and method are the v2 SDK's
 * own (`classifyInboundRequest`). The SDK does not export its presence and
 * `Mcp-Name` rung (`validateStandardRequestHeaders`), so that rung is
 * `missingOrMismatchedHeader` here, with the SDK's error code (-32020) and
 * its table of which body field `Mcp-Name` mirrors.
 */
import { classifyInboundRequest } from "@modelcontextprotocol/server";

/** The modern protocol revisions this Server speaks (answered by `server/discover`). */
export const MODERN_PROTOCOL_VERSIONS = ["2026-07-28"] as const;
/** JSON-RPC error code of a header/body disagreement or a missing required header (SEP-2243). */
export const HEADER_MISMATCH = -32020;
/** JSON-RPC error code of a protocol version this Server does not speak. */
export const UNSUPPORTED_PROTOCOL_VERSION = -32022;

export const PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion";
export const CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities";
export const CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo";
export const SERVER_INFO_META = "io.modelcontextprotocol/serverInfo";

/**
 * The methods a modern request may name here; anything else (`ping`, `initialize`, the 2025 `tasks/result`
 * and `tasks/list`, prompts, completion, `resources/subscribe`) is -32601 with HTTP 404, before any header check.
 * `subscriptions/listen` carries task status only (mcp/task-listen.ts).
 */
export const MODERN_METHODS: ReadonlySet<string> = new Set([
  "server/discover",
  "tools/list",
  "tools/call",
  "resources/list",
  "resources/templates/list",
  "resources/read",
  "tasks/get",
  "tasks/update",
  "tasks/cancel",
  "subscriptions/listen",
]);
/** JSON-RPC error code of a request that needs a client capability the request did not declare. */
export const MISSING_REQUIRED_CLIENT_CAPABILITY = -32021;

/** Which body field the `Mcp-Name` header mirrors, by method (SEP-2243; `tasks/*` from the Tasks binding). */
const MCP_NAME_SOURCE: Readonly<Record<string, string>> = {
  "tools/call": "name",
  "prompts/get": "name",
  "resources/read": "uri",
  "tasks/get": "taskId",
  "tasks/update": "taskId",
  "tasks/cancel": "taskId",
};

export interface ModernEra {
  kind: "modern";
  version: string;
  /** The client's declared capabilities (`_meta`), as sent; `extensions` names the extensions it speaks. */
  clientCapabilities: Record<string, unknown>;
}
export type Era = { kind: "legacy" } | ModernEra;

/** A refused POST: the HTTP status and the JSON-RPC error (answered with the request's id). */
export interface EraRefusal {
  status: number;
  code: number;
  message: string;
  data?: unknown;
}

export interface EraHeaders {
  protocolVersion?: string;
  method?: string;
  name?: string;
}

function header(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** The three MCP request headers of a Node request. */
export function eraHeaders(headers: Record<string, string | string[] | undefined>): EraHeaders {
  const protocolVersion = header(headers["mcp-protocol-version"]);
  const method = header(headers["mcp-method"]);
  const name = header(headers["mcp-name"]);
  return {
    ...(protocolVersion !== undefined ? { protocolVersion } : {}),
    ...(method !== undefined ? { method } : {}),
    ...(name !== undefined ? { name } : {}),
  };
}

/** Whether a version string names the modern era (revision identifiers are ISO dates). */
export function isModernVersion(version: string): boolean {
  return version >= "2026-07-28";
}

/** Whether a parsed body's params carry the per-request envelope claim (the protocol-version `_meta` key). */
function hasEnvelopeClaim(body: unknown): boolean {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return false;
  const params = (body as { params?: unknown }).params;
  if (typeof params !== "object" || params === null || Array.isArray(params)) return false;
  const meta = (params as { _meta?: unknown })._meta;
  return typeof meta === "object" && meta !== null && !Array.isArray(meta) && PROTOCOL_VERSION_META in meta;
}

/** A `Mcp-Name` value, `=?base64?…?=`-decoded; undefined when the sentinel is not valid base64 UTF-8. */
function decodeNameHeader(value: string): string | undefined {
  const m = /^=\?base64\?([A-Za-z0-9+/]*={0,2})\?=$/.exec(value);
  if (m === null) return value.startsWith("=?base64?") ? undefined : value;
  const bytes = Buffer.from(m[1] ?? "", "base64");
  const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
  return Buffer.from(text, "utf8").equals(bytes) ? text : undefined;
}

function mismatch(message: string): EraRefusal {
  return {
    status: 400,
    code: HEADER_MISMATCH,
    message: `Bad Request: the request headers and body disagree: ${message}`,
  };
}

/** The required-header rung of a modern request: presence, and `Mcp-Name` against the body. */
function missingOrMismatchedHeader(headers: EraHeaders, method: string, params: unknown): EraRefusal | null {
  if (headers.protocolVersion === undefined)
    return mismatch("the body names a 2026-07-28 request but the required MCP-Protocol-Version header is absent");
  if (headers.method === undefined)
    return mismatch(`the body names method ${method} but the required Mcp-Method header is absent`);
  const field = Object.hasOwn(MCP_NAME_SOURCE, method) ? MCP_NAME_SOURCE[method] : undefined;
  if (field === undefined) return null;
  const raw = typeof params === "object" && params !== null ? (params as Record<string, unknown>)[field] : undefined;
  const body = typeof raw === "string" ? raw : undefined;
  if (headers.name === undefined) {
    return body === undefined
      ? null
      : mismatch(`the body carries params.${field}="${body}" but the required Mcp-Name header is absent`);
  }
  const decoded = decodeNameHeader(headers.name.trim());
  if (decoded === undefined) return mismatch("the Mcp-Name header carries an invalid Base64 sentinel value");
  if (body !== undefined && decoded !== body)
    return mismatch(`the body carries params.${field}="${body}" but the Mcp-Name header names "${decoded}"`);
  return null;
}

/**
 * Whether classifying this POST needs the v2 SDK's classifier: the body claims the 2026 envelope or the
 * version header names a 2026 version. Anything else is 2025-era traffic (the SDK's own rule).
 */
export function claimsModernEra(body: unknown, headers: EraHeaders): boolean {
  return hasEnvelopeClaim(body) || isModernVersion((headers.protocolVersion ?? "").trim());
}

/**
 * The era of one parsed POST body, or why it is refused. Legacy traffic is
 * returned untouched (its own checks stay in mcp/post.ts, as before).
 */
export function classifyPost(body: unknown, headers: EraHeaders): { era: Era } | { refusal: EraRefusal } {
  // Fast path, the SDK's own rule for it: no envelope claim in the body and no modern version header is
  // 2025-era traffic. Skipping the SDK classifier here keeps it off every 2025 request (it costs ~20 µs a
  // call, most of a long-poll observe's own overhead); mcp/post.ts has already checked the message shape.
  if (!claimsModernEra(body, headers)) return { era: { kind: "legacy" } };
  const route = classifyInboundRequest({
    httpMethod: "POST",
    body,
    ...(headers.protocolVersion !== undefined ? { protocolVersionHeader: headers.protocolVersion } : {}),
    ...(headers.method !== undefined ? { mcpMethodHeader: headers.method } : {}),
    ...(headers.name !== undefined ? { mcpNameHeader: headers.name } : {}),
  });
  if (route.kind === "reject") {
    return {
      refusal: {
        status: route.httpStatus,
        code: route.code,
        message: route.message,
        ...(route.data !== undefined ? { data: route.data } : {}),
      },
    };
  }
  if (route.kind === "legacy" || route.classification.era === "legacy") return { era: { kind: "legacy" } };
  const { method, params } = route.message;
  const meta = (params as { _meta?: Record<string, unknown> } | undefined)?._meta ?? {};
  const claimed = meta[PROTOCOL_VERSION_META];
  const version = typeof claimed === "string" ? claimed : (headers.protocolVersion ?? "");
  if (!(MODERN_PROTOCOL_VERSIONS as readonly string[]).includes(version)) {
    return {
      refusal: {
        status: 400,
        code: UNSUPPORTED_PROTOCOL_VERSION,
        message: `Unsupported protocol version: ${version.slice(0, 64)} (supported: ${MODERN_PROTOCOL_VERSIONS.join(", ")}; 2025-era clients: initialize)`,
        data: { supported: [...MODERN_PROTOCOL_VERSIONS], requested: version.slice(0, 64) },
      },
    };
  }
  if (route.messageKind === "request") {
    if (!MODERN_METHODS.has(method)) {
      return {
        refusal: {
          status: 404,
          code: -32601,
          message: `Method not found: ${method.slice(0, 64)} (this Server answers: ${[...MODERN_METHODS].join(", ")})`,
        },
      };
    }
    const refused = missingOrMismatchedHeader(headers, method, params);
    if (refused !== null) return { refusal: refused };
  }
  const capabilities = meta[CLIENT_CAPABILITIES_META];
  return {
    era: {
      kind: "modern",
      version,
      clientCapabilities:
        typeof capabilities === "object" && capabilities !== null && !Array.isArray(capabilities)
          ? (capabilities as Record<string, unknown>)
          : {},
    },
  };
}
