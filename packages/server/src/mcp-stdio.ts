/**
 * `webcodex-server mcp-stdio`: an MCP stdio server for clients that only
 * launch stdio servers. It proxies tools/list, tools/call, resources/list and
 * resources/read to a running Server's `/mcp` over Streamable HTTP with the
 * SDK client, authenticating with a bearer token taken from the environment.
 * It holds no authority of its own: every call is checked by the Server.
 * Tool results (including isError results) pass through unchanged.
 */
import type { Readable, Writable } from "node:stream";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import {
  CallToolRequestSchema,
  CallToolResultSchema,
  ErrorCode,
  ListResourcesRequestSchema,
  ListResourceTemplatesRequestSchema,
  ListToolsRequestSchema,
  McpError,
  ReadResourceRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";
import type { Logger } from "pino";
import { MCP_SERVER_INFO } from "./mcp-http.js";

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

/** Map an upstream failure onto a JSON-RPC error for the stdio client, without leaking the token. */
function upstreamError(err: unknown): McpError {
  if (err instanceof McpError) return new McpError(err.code, err.message.replace(/^(MCP error -?\d+: )+/, ""));
  return new McpError(ErrorCode.InternalError, "The webcodex Server could not be reached");
}

export async function startMcpStdioBridge(options: McpStdioBridgeOptions): Promise<McpStdioBridge> {
  const { logger } = options;
  const client = new Client({ name: "webcodex-mcp-stdio", version: MCP_SERVER_INFO.version });
  const upstream = new StreamableHTTPClientTransport(options.url, {
    requestInit: { headers: { Authorization: `Bearer ${options.token}` } },
  });
  await client.connect(upstream);

  const server = new Server(MCP_SERVER_INFO, {
    capabilities: { tools: {}, resources: {} },
    ...(client.getInstructions() ? { instructions: client.getInstructions() as string } : {}),
  });
  const forward = { timeout: UPSTREAM_TIMEOUT_MS };
  server.setRequestHandler(ListToolsRequestSchema, async (request, extra) => {
    try {
      return await client.listTools(request.params, { ...forward, signal: extra.signal });
    } catch (err) {
      throw upstreamError(err);
    }
  });
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    try {
      // client.request, not client.callTool: pass results through unvalidated; the Server is the authority.
      return await client.request({ method: "tools/call", params: request.params }, CallToolResultSchema, {
        ...forward,
        signal: extra.signal,
      });
    } catch (err) {
      throw upstreamError(err);
    }
  });
  server.setRequestHandler(ListResourcesRequestSchema, async (request, extra) => {
    try {
      return await client.listResources(request.params, { ...forward, signal: extra.signal });
    } catch (err) {
      throw upstreamError(err);
    }
  });
  server.setRequestHandler(ListResourceTemplatesRequestSchema, async (request, extra) => {
    try {
      return await client.listResourceTemplates(request.params, { ...forward, signal: extra.signal });
    } catch (err) {
      throw upstreamError(err);
    }
  });
  server.setRequestHandler(ReadResourceRequestSchema, async (request, extra) => {
    try {
      return await client.readResource(request.params, { ...forward, signal: extra.signal });
    } catch (err) {
      throw upstreamError(err);
    }
  });

  let resolveClosed!: () => void;
  const closed = new Promise<void>((resolve) => {
    resolveClosed = resolve;
  });
  let closing = false;
  const close = async (): Promise<void> => {
    if (closing) return closed;
    closing = true;
    try {
      await server.close();
    } catch {}
    try {
      await client.close();
    } catch {}
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
  logger.info({ url: options.url.origin + options.url.pathname }, "mcp-stdio bridge ready");
  return { closed, close };
}
