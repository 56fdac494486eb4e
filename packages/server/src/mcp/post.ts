/**
 * One MCP Streamable HTTP POST, answered with a JSON body, on the Node
 * request directly, and `PostMux`: the one v2 SDK `Transport` each of the
 * Server's two long-lived v2 SDK `Server`s (one per protocol era,
 * mcp/http.ts) is connected to.
 *
 * Why not the SDK's HTTP entry (`createMcpHandler`) or its transports: in
 * Node they convert every request into a Web `Request` (@hono/node-server +
 * undici), read the body through web streams, answer through a Web
 * `Response`, and build a `Server` and a transport per request. Profiled
 * (scripts/bench/mcp-dispatch-cpu.mjs --profile), that conversion and the
 * request clone of the SDK's classification step are most of the 3–7× CPU
 * per request the SDK's entry costs against this path; constructing the
 * per-request `Server` itself is ~1–2%. So the POST checks stay here, in
 * the SDK transport's order, with its status codes and JSON-RPC error
 * codes, the message is still checked with the SDK's `JSONRPCMessageSchema`
 * (`parseJSONRPCMessage`), and JSON-RPC itself (dispatch, era codecs,
 * handler schemas, result encoding, errors) is the v2 SDK `Server`'s.
 *
 * Covered: Accept (406), Content-Type (415), body bound (413), JSON (400,
 * -32700), message shape (400, -32700), the era of the request and, for a
 * 2026-07-28 request, its `_meta` envelope and required headers (400 with the
 * request's id; mcp/era.ts), MCP-Protocol-Version of a 2025-era one (400), a
 * notification or response (202), a request (200, its JSON-RPC response).
 * Not covered, because this Server never needs them: sessions, SSE streams
 * (except `subscriptions/listen`, mcp/task-listen.ts), resumability, GET.
 *
 * One message per POST: JSON-RPC batches are not part of MCP since
 * 2025-06-18 (the SDK's own `JSONRPCMessageSchema` has no array form). An
 * array body is refused like any body that is not one JSON-RPC message:
 * `400`, `-32700`, "Parse error: Invalid JSON-RPC message" — the SDK
 * transport's answer to a message that fails that schema.
 */

import type { IncomingMessage, ServerResponse } from "node:http";
import {
  isInitializeRequest,
  type JSONRPCMessage,
  type MessageClassification,
  PerRequestHTTPServerTransport,
  parseJSONRPCMessage,
  type RequestId,
  SUPPORTED_PROTOCOL_VERSIONS,
} from "@modelcontextprotocol/server";
import { ABORTED, readBody, TOO_LARGE } from "../http-body.js";
import { classifyPost, type Era, eraHeaders } from "./era.js";

/** A JSON-RPC error as an HTTP response body (`id: null` answers the POST itself; an id answers that request). */
export function sendJsonRpcError(
  res: ServerResponse,
  status: number,
  code: number,
  message: string,
  id: string | number | null = null,
  data?: unknown,
): void {
  if (res.headersSent || res.writableEnded) return;
  const error = data === undefined ? { code, message } : { code, message, data };
  const body = JSON.stringify({ jsonrpc: "2.0", error, id });
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
  res.end(body);
}

/**
 * The one SDK `Transport` every POST's request of one era goes through, so
 * that one long-lived SDK `Server` per era serves them all (mcp/http.ts)
 * instead of one Server built per request and held for as long as a
 * long-polling observe waits (~23 KB of handlers and maps each, most of the
 * Server's live heap with 1,000 waiting observers, and the garbage that kept
 * its old generation growing).
 *
 * It is a `PerRequestHTTPServerTransport` only so that connecting a v2
 * `Server` to it binds that Server to the classification it names (the SDK
 * binds a Server to the 2026-07-28 era only through that transport class);
 * every method the protocol layer calls is its own. The modern mux hands each
 * request to the Server with that classification, which the SDK checks
 * against the Server's era before dispatch.
 *
 * Each request enters the Server under an id of its own (`deliver`), never
 * the client's: ids of different clients collide, and the Server keys its
 * in-flight handlers by id. `send` maps the response back to the client's id
 * and writes it to that POST's HTTP response; the request's context (whose
 * principal it is, its abort signal) is found by that same internal id
 * (`context`), so nothing of one caller is reachable from another's request.
 * Notifications and responses from clients are never delivered: a stateless
 * Server has nothing to do with them, and a `notifications/cancelled` naming
 * an id could otherwise reach another caller's request. Anything else the
 * Server sends (progress, logging, requests to the client) has no stream to
 * go to in JSON-response mode and is dropped, as the SDK transport does.
 */
export class PostMux<C> extends PerRequestHTTPServerTransport {
  readonly #classification: MessageClassification | undefined;

  /** `classification`: the era the connected Server is bound to (absent: 2025-era, bound by nothing). */
  constructor(classification?: MessageClassification) {
    super({ classification: classification ?? { era: "legacy" }, responseMode: "json" });
    this.#classification = classification;
  }

  readonly #pending = new Map<number, { res: ServerResponse; id: RequestId; context: C }>();
  #next = 0;

  override async start(): Promise<void> {}

  /**
   * Hand one POST's JSON-RPC request to the Server; its response is written to `res` with the client's
   * `id`. Returns the internal id (for `abandon`).
   */
  deliver(res: ServerResponse, message: JSONRPCMessage & { id: RequestId }, context: C): number {
    this.#next += 1;
    const internal = this.#next;
    this.#pending.set(internal, { res, id: message.id, context });
    const classification = this.#classification;
    this.onmessage?.({ ...message, id: internal }, classification ? { classification } : undefined);
    return internal;
  }

  /** The context of the request the Server knows as `internal`; undefined once answered or abandoned. */
  context(internal: RequestId): C | undefined {
    return typeof internal === "number" ? this.#pending.get(internal)?.context : undefined;
  }

  /** Whether the request is still waiting for its response. */
  waiting(internal: number): boolean {
    return this.#pending.has(internal);
  }

  /** The POST went away unanswered: its response, when the handler ends, goes nowhere. */
  abandon(internal: number): void {
    this.#pending.delete(internal);
  }

  override async send(message: JSONRPCMessage): Promise<void> {
    // The Server's own messages: a response is exactly one with a result or an error.
    if (!("result" in message) && !("error" in message)) return;
    const internal = message.id;
    if (typeof internal !== "number") return;
    const pending = this.#pending.get(internal);
    if (!pending) return;
    this.#pending.delete(internal);
    const { res, id } = pending;
    if (res.writableEnded || res.destroyed) return;
    const body = JSON.stringify({ ...message, id });
    res.writeHead(200, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) });
    res.end(body);
  }

  override async close(): Promise<void> {
    this.#pending.clear();
    this.onclose?.();
  }
}

/** The checked message of a POST. */
export interface CheckedPost {
  message: JSONRPCMessage;
  /** The id when it is a JSON-RPC request; null (a notification or response) means answer 202. */
  request: RequestId | null;
  /** The body as JSON.parse built it (fields the SDK's schemas would drop, such as `params._wc`, are here). */
  raw: unknown;
  /** The MCP era this request speaks (mcp/era.ts). */
  era: Era;
}

/**
 * Reads and checks one POST the way the SDK transport does. Writes the error
 * response itself and returns null when the POST is refused.
 */
export async function readMcpPost(
  req: IncomingMessage,
  res: ServerResponse,
  maxBodyBytes: number,
): Promise<CheckedPost | null> {
  // Accept is a list: both types must be offered (the SDK's substring test).
  const accept = req.headers.accept ?? "";
  if (!accept.includes("application/json") || !accept.includes("text/event-stream")) {
    sendJsonRpcError(
      res,
      406,
      -32000,
      "Not Acceptable: Client must accept both application/json and text/event-stream",
    );
    return null;
  }
  if (mediaType(req.headers["content-type"]) !== "application/json") {
    sendJsonRpcError(res, 415, -32000, "Unsupported Media Type: Content-Type must be application/json");
    return null;
  }
  const text = await readBody(req, maxBodyBytes);
  if (text === ABORTED) return null;
  if (text === TOO_LARGE) {
    res.setHeader("Connection", "close");
    sendJsonRpcError(res, 413, -32000, `Payload Too Large: Request body must not exceed ${maxBodyBytes} bytes`);
    return null;
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    sendJsonRpcError(res, 400, -32700, "Parse error: Invalid JSON");
    return null;
  }
  // An array (a JSON-RPC batch) fails the schema like any other non-message.
  let message: JSONRPCMessage;
  try {
    message = parseJSONRPCMessage(raw);
  } catch {
    sendJsonRpcError(res, 400, -32700, "Parse error: Invalid JSON-RPC message");
    return null;
  }
  const requestId = "method" in message && "id" in message ? (message.id as RequestId) : null;
  const headers = eraHeaders(req.headers);
  const classified = classifyPost(raw, headers);
  if ("refusal" in classified) {
    const { status, code, message: text, data } = classified.refusal;
    sendJsonRpcError(res, status, code, text, requestId, data);
    return null;
  }
  if (classified.era.kind === "modern") return { message, request: requestId, raw, era: classified.era };
  // The message passed JSONRPCMessageSchema, so its shape decides its kind: a request has a
  // method and an id. The full InitializeRequest schema runs only on an initialize.
  const initializing = "method" in message && message.method === "initialize" && isInitializeRequest(message);
  const version = req.headers["mcp-protocol-version"];
  if (!initializing && version !== undefined && !SUPPORTED_PROTOCOL_VERSIONS.includes(String(version))) {
    sendJsonRpcError(
      res,
      400,
      -32000,
      `Bad Request: Unsupported protocol version: ${String(version).slice(0, 64)} (supported versions: ${SUPPORTED_PROTOCOL_VERSIONS.join(", ")})`,
    );
    return null;
  }
  return { message, request: requestId, raw, era: classified.era };
}

/** `type/subtype` of a Content-Type header, lowercased, without parameters. */
function mediaType(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  return (header.split(";", 1)[0] ?? "").trim().toLowerCase();
}

/** The params object of a parsed body (CheckedPost.raw), or an empty one. */
export function paramsOf(raw: unknown): Readonly<Record<string, unknown>> {
  const params = (raw as { params?: unknown } | null)?.params;
  return typeof params === "object" && params !== null && !Array.isArray(params)
    ? (params as Record<string, unknown>)
    : {};
}
