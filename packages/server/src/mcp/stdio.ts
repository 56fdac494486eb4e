/**
 * `webcodex-server mcp-stdio`: an MCP stdio server for clients that only
 * launch stdio servers. It proxies tools/list, tools/call, resources/list and
 * resources/read to a running Server's `/mcp` over Streamable HTTP with the
 * v2 SDK client (a 2025-11-25 `initialize` connection, so what it forwards is
 * exactly what the Server answers a 2025-era client), authenticating with a
 * bearer token taken from the environment. The stdio side is a v2 SDK `Server`
 * on the SDK's stdio transport; a client that probes with the 2026-07-28
 * `server/discover` is answered "Method not found" and falls back to
 * `initialize`, as it did before.
 * It holds no authority of its own: every call is checked by the Server.
 * Tool results (including isError results) pass through unchanged.
 *
 * Start order does not matter: a Server that is not reachable yet is
 * connected on the first request (and again after a failure). A token the
 * Server refuses (401) is fatal at start-up — it will not fix itself.
 */
import type { Readable, Writable } from "node:stream";
import {
  Client,
  SdkError,
  SdkHttpError,
  StreamableHTTPClientTransport,
  ProtocolError as UpstreamProtocolError,
} from "@modelcontextprotocol/client";
import { ProtocolError, ProtocolErrorCode, Server } from "@modelcontextprotocol/server";
import { StdioServerTransport } from "@modelcontextprotocol/server/stdio";
import type { Logger } from "pino";
import { MCP_INSTRUCTIONS, MCP_SERVER_INFO } from "./http.js";

/** Upstream request timeout: longer than the longest observe wait plus slack. */
const UPSTREAM_TIMEOUT_MS = 90_000;

export interface McpStdioBridgeOptions {
  /** The Server's Streamable HTTP endpoint, e.g. http://127.0.0.1:7420/mcp */
  url: URL;
  token: string;
  logger: Logger;
  stdin?: Readable;
  stdout?: Writable;
}

export interface McpStdioBridge {
  /** Resolves when the stdio side closed (stdin EOF) and the upstream client is closed. */
  closed: Promise<void>;
  close(): Promise<void>;
}

export class McpStdioStartError extends Error {
  override readonly name = "McpStdioStartError";
}

/** The HTTP status an upstream SDK error carries, if any. */
function httpStatus(err: unknown): number | undefined {
  if (err instanceof SdkHttpError) return err.status;
  const status = err instanceof SdkError ? (err.data as { status?: unknown } | undefined)?.status : undefined;
  return typeof status === "number" ? status : undefined;
}

function isUnauthorized(err: unknown): boolean {
  return httpStatus(err) === 401;
}

/**
 * A JSON-RPC error for the stdio client, worded as the bridge has always worded it ("MCP error <code>: "
 * once, then the Server's own message) and never carrying the token.
 */
function stdioError(code: number, message: string): ProtocolError {
  return new ProtocolError(code, `MCP error ${code}: ${message}`);
}

/** Map an upstream failure onto a JSON-RPC error for the stdio client, without leaking the token. */
function upstreamError(err: unknown, where: string): ProtocolError {
  if (err instanceof UpstreamProtocolError)
    return stdioError(err.code, err.message.replace(/^(MCP error -?\d+: )+/, ""));
  if (isUnauthorized(err))
    return stdioError(ProtocolErrorCode.InvalidRequest, "The webcodex Server refused the token (401)");
  return stdioError(
    ProtocolErrorCode.InternalError,
    `The webcodex Server at ${where} could not be reached; is it running?`,
  );
}

export async function startMcpStdioBridge(options: McpStdioBridgeOptions): Promise<McpStdioBridge> {
  const { logger } = options;
  const where = options.url.origin + options.url.pathname;

  let upstream: Promise<Client> | null = null;
  const connectUpstream = (): Promise<Client> => {
    if (upstream) return upstream;
    const attempt = (async () => {
      const client = new Client({ name: "webcodex-mcp-stdio", version: MCP_SERVER_INFO.version });
      await client.connect(
        new StreamableHTTPClientTransport(options.url, {
          requestInit: { headers: { Authorization: `Bearer ${options.token}` } },
        }),
      );
      return client;
    })();
    upstream = attempt;
    // A failed attempt is forgotten, so the next request tries again.
    attempt.catch(() => {
      if (upstream === attempt) upstream = null;
    });
    return attempt;
  };
  async function forward<T>(call: (client: Client) => Promise<T>): Promise<T> {
    try {
      return await call(await connectUpstream());
    } catch (err) {
      throw upstreamError(err, where);
    }
  }

  try {
    await connectUpstream();
  } catch (err) {
    if (isUnauthorized(err)) throw new McpStdioStartError(`the Server at ${where} refused the token (401)`);
    logger.warn({ url: where }, "Server not reachable yet; connecting on the first request");
  }

  const server = new Server(MCP_SERVER_INFO, {
    capabilities: { tools: {}, resources: {} },
    instructions: MCP_INSTRUCTIONS,
  });
  const opts = (signal: AbortSignal) => ({ timeout: UPSTREAM_TIMEOUT_MS, signal });
  server.setRequestHandler("tools/list", (request, ctx) =>
    forward((c) => c.listTools(request.params, opts(ctx.mcpReq.signal))),
  );
  // client.request, not client.callTool: callTool would also check structuredContent against the tool's
  // outputSchema; the Server is the authority, so its results pass through as it answered them.
  server.setRequestHandler("tools/call", (request, ctx) =>
    forward((c) => c.request({ method: "tools/call", params: request.params }, opts(ctx.mcpReq.signal))),
  );
  server.setRequestHandler("resources/list", (request, ctx) =>
    forward((c) => c.listResources(request.params, opts(ctx.mcpReq.signal))),
  );
  server.setRequestHandler("resources/templates/list", (request, ctx) =>
    forward((c) => c.listResourceTemplates(request.params, opts(ctx.mcpReq.signal))),
  );
  server.setRequestHandler("resources/read", (request, ctx) =>
    forward((c) => c.readResource(request.params, opts(ctx.mcpReq.signal))),
  );

  let resolveClosed!: () => void;
  const closed = new Promise<void>((resolve) => {
    resolveClosed = resolve;
  });
  let closing = false;
  const close = async (): Promise<void> => {
    if (closing) return closed;
    closing = true;
    await server.close().catch(() => {});
    const client = await upstream?.catch(() => null);
    await client?.close().catch(() => {});
    resolveClosed();
    return closed;
  };
  server.onclose = () => {
    void close();
  };
  const stdin = options.stdin ?? process.stdin;
  stdin.once("end", () => {
    logger.info("stdin closed; mcp-stdio bridge exiting");
    void close();
  });
  await server.connect(new StdioServerTransport(stdin, options.stdout ?? process.stdout));
  logger.info({ url: where }, "mcp-stdio bridge ready");
  return { closed, close };
}
