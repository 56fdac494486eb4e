/**
 * `startServer`: the listeners and the routing. One node:http server hosts the `/runner` WebSocket upgrade,
 * `/mcp`, the console and `/healthz`; the services behind them are built by wiring/services.ts, which puts each
 * one's close on the one teardown list (wiring/teardown.ts) that `close()` runs, last built first.
 */
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import type { Duplex } from "node:stream";
import type { Logger } from "pino";
import { type ClusterNode, startClusterNode } from "./cluster/node.js";
import { ConfigError, isLoopbackHost, type ServerConfig } from "./config.js";
import { isConsolePath } from "./console/http.js";
import type { RunsApi } from "./runs/api.js";
import { StateBusyError, StateUnavailableError } from "./state/engine.js";
import type { StateStore } from "./state/store.js";
import { mountTestApi, TEST_API_ENV } from "./test-api.js";
import { buildServices } from "./wiring/services.js";
import { Teardown } from "./wiring/teardown.js";

export type { HttpHandler, McpMount } from "./wiring/mcp.js";
export { TEST_DELAY_ENV } from "./wiring/services.js";

export interface StartServerOptions {
  config: ServerConfig;
  logger: Logger;
  /** Serve the MCP front end on `/mcp` (and the OAuth paths with `[server.oauth]`); the executable does. */
  mcp?: boolean;
  /** Defaults to process.env; read for the test-only hooks and `[server.state] url_env`. */
  env?: NodeJS.ProcessEnv;
  /** How long a run.start waits for the Runner's answer before its outcome counts as unknown. */
  startTimeoutMs?: number;
}

export interface RunningServer {
  url: string;
  port: number;
  runs: RunsApi;
  store: StateStore;
  close(): Promise<void>;
}

export async function startServer(opts: StartServerOptions): Promise<RunningServer> {
  const { config, logger } = opts;
  const env = opts.env ?? process.env;
  const testHooks = env[TEST_API_ENV] === "1";
  if (testHooks && !isLoopbackHost(config.host)) {
    throw new Error(
      `${TEST_API_ENV}=1 serves unauthenticated endpoints; refusing to start on non-loopback host ${config.host}`,
    );
  }
  const tlsOptions = loadTls(config);
  if (!tlsOptions && !isLoopbackHost(config.host)) {
    if (!config.allowInsecureHttp) {
      throw new ConfigError(
        `${config.file ?? "<config>"}: server.host: "${config.host}" is not a loopback address and [server.tls] is not set; ` +
          "tokens and prompts would cross the network in clear text. Set [server.tls] cert_file and key_file, " +
          "or put a TLS-terminating reverse proxy in front and set [server] allow_insecure_http = true.",
      );
    }
    logger.warn(
      { host: config.host },
      "INSECURE: listening on a non-loopback address without TLS (allow_insecure_http = true); " +
        "only safe behind a TLS-terminating reverse proxy on a trusted network",
    );
  }
  const peerHost = config.cluster.listen?.host;
  if (!tlsOptions && peerHost !== undefined && !isLoopbackHost(peerHost) && !config.allowInsecureHttp) {
    throw new ConfigError(
      `${config.file ?? "<config>"}: server.cluster.listen_host: "${peerHost}" is not a loopback address and ` +
        "[server.tls] is not set; the instances' requests carry prompts and are signed, not encrypted. Set " +
        "[server.tls], or keep that address on a private network and set [server] allow_insecure_http = true.",
    );
  }
  const teardown = new Teardown({ logger });
  try {
    return await listenAndRoute(opts, env, testHooks, tlsOptions, teardown);
  } catch (err) {
    // Not serving: give back what this start took, in the one order (the state dir's lock last).
    await teardown.run();
    throw err;
  }
}

async function listenAndRoute(
  opts: StartServerOptions,
  env: NodeJS.ProcessEnv,
  testHooks: boolean,
  tlsOptions: { cert: Buffer; key: Buffer } | null,
  teardown: Teardown,
): Promise<RunningServer> {
  const { config, logger } = opts;
  const services = await buildServices(
    {
      config,
      logger,
      env,
      mcp: opts.mcp === true,
      tls: tlsOptions !== null,
      ...(opts.startTimeoutMs !== undefined ? { startTimeoutMs: opts.startTimeoutMs } : {}),
    },
    teardown,
  );
  const { store, registry, runs, hub, mcp, console: console_, instanceId } = services;
  // Each listener made here stops accepting first on close (wiring/listeners.ts).
  let listenerCount = 0;
  const makeListener = (
    tls: { cert: Buffer; key: Buffer } | null,
    onRequest: (req: IncomingMessage, res: ServerResponse) => void,
  ): Server => services.listeners.track(createListener(tls, onRequest), `listener ${++listenerCount}`, teardown);

  // Several instances on one PostgreSQL state route link requests to each other (design §14, cluster/node.ts).
  const cluster: ClusterNode | null =
    config.state.backend === "postgres"
      ? startClusterNode({
          config,
          logger,
          store,
          runs: runs.core,
          registry,
          instanceId,
          requestTimeoutMs: hub.requestTimeoutMs,
          tls: tlsOptions !== null,
          listeners: {
            make: (onRequest, onUpgrade) =>
              services.listeners.track(
                guardedListener(tlsOptions, config.maxConnections, logger, onRequest, onUpgrade),
                "cluster listener",
                teardown,
              ),
            listen,
            close: closeListener,
          },
        })
      : null;
  // Its channels, endpoint and listener close after the clients' listener stops accepting.
  if (cluster) teardown.add("cluster node", () => cluster.close());

  const testApi = testHooks
    ? mountTestApi(
        runs,
        config,
        logger,
        () => cluster?.advertiseUrl ?? null,
        () => cluster?.counts() ?? { forwarded_syncs: 0 },
      )
    : null;

  const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
    if (overCapacity.has(req.socket)) {
      req.socket.destroy(); // already answered 503
      return;
    }
    const path = requestPath(req);
    if (path === "/healthz") {
      res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}');
      return;
    }
    if (mcp && (path === "/mcp" || path.startsWith("/mcp/") || mcp.owns?.(path) === true)) {
      Promise.resolve(mcp.handle(req, res)).catch((err: unknown) => {
        if (err instanceof StateUnavailableError || err instanceof StateBusyError) {
          logger.warn({ code: err.code }, "mcp request refused: the state database cannot serve it now");
          if (!res.headersSent) stateRefusal(res, err);
          return;
        }
        logger.error({ err: (err as Error).message }, "mcp handler failed");
        if (!res.headersSent) res.writeHead(500).end();
      });
      return;
    }
    if (isConsolePath(path)) {
      console_.handle(req, res).catch((err: unknown) => {
        logger.error({ err: (err as Error).message }, "console handler failed");
        if (!res.headersSent) res.writeHead(500).end();
      });
      return;
    }
    if (cluster?.serveHttp(path, req, res)) return;
    if (testApi && path.startsWith("/__test/")) {
      testApi(req, res);
      return;
    }
    notFound(res);
  };
  const http: Server = makeListener(tlsOptions, onRequest);
  capConnections(http, config.maxConnections, logger);
  http.on("upgrade", (req, socket, head) => {
    if (overCapacity.has(socket)) {
      socket.destroy();
      return;
    }
    const path = requestPath(req);
    if (path === "/runner") {
      hub.handleUpgrade(req, socket, head);
      return;
    }
    if (cluster?.serveUpgrade(path, req, socket, head)) return;
    socket.write(NOT_FOUND_UPGRADE);
    socket.destroy();
  });

  await listen(http, config.port, config.host);
  const port = (http.address() as AddressInfo).port;
  const host = bracketed(config.host);
  const url = `${tlsOptions ? "https" : "http"}://${host}:${port}`;

  if (cluster) {
    await cluster.start(url);
    // First at shutdown: the directory row goes before anything stops serving.
    teardown.add("cluster directory", () => cluster.stop());
  }
  await services.webhooks.start();
  logger.info(
    {
      url,
      state_dir: config.stateDir,
      state_backend: config.state.backend,
      runners: config.runners.length,
      test_hooks: testHooks,
      ...(cluster?.advertiseUrl ? { advertise_url: cluster.advertiseUrl } : {}),
      ...(cluster?.listenerUrl ? { cluster_listener: cluster.listenerUrl } : {}),
      tls: tlsOptions !== null,
      max_connections: config.maxConnections,
    },
    "server listening",
  );

  return { url, port, runs, store, close: () => teardown.run() };
}

/** A listener (https with `[server.tls]`) answering `onRequest`. */
function createListener(
  tlsOptions: { cert: Buffer; key: Buffer } | null,
  onRequest: (req: IncomingMessage, res: ServerResponse) => void,
): Server {
  const server: Server = tlsOptions
    ? createHttpsServer({ ...tlsOptions, handshakeTimeout: TLS_HANDSHAKE_TIMEOUT_MS }, onRequest)
    : createServer(onRequest);
  server.headersTimeout = 30_000;
  server.requestTimeout = 120_000;
  return server;
}

/** A listener of the instances' requests (cluster/node.ts): capped, its 503-answered sockets never served. */
function guardedListener(
  tlsOptions: { cert: Buffer; key: Buffer } | null,
  maxConnections: number,
  logger: Logger,
  onRequest: (req: IncomingMessage, res: ServerResponse) => void,
  onUpgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void,
): Server {
  const server = createListener(tlsOptions, (req, res) => {
    if (overCapacity.has(req.socket)) {
      req.socket.destroy();
      return;
    }
    onRequest(req, res);
  });
  capConnections(server, maxConnections, logger);
  server.on("upgrade", (req, socket, head) => {
    if (overCapacity.has(socket)) {
      socket.destroy();
      return;
    }
    onUpgrade(req, socket, head);
  });
  return server;
}

function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
}

async function closeListener(server: Server): Promise<void> {
  if (!server.listening) return;
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
}

/** A request's path, without its query. */
function requestPath(req: IncomingMessage): string {
  return (req.url ?? "/").split("?")[0] ?? "/";
}

/** The answer to an upgrade of a path that has none (the socket is destroyed after it). */
const NOT_FOUND_UPGRADE = "HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

function notFound(res: ServerResponse): void {
  res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not_found"}');
}

function bracketed(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}

/**
 * A TLS client must finish its handshake within this time. Sockets still in their handshake are not
 * yet counted by max_connections (the 503 is an HTTP answer), so this bounds how long they hold a descriptor.
 */
export const TLS_HANDSHAKE_TIMEOUT_MS = 10_000;

/** Retry-After (seconds) of an MCP request refused because the state database cannot serve it now. */
export const STATE_REFUSAL_RETRY_AFTER_SECS = 1;

/**
 * 503 for an MCP request that needed the state database before any tool ran (e.g. to check its token) while
 * that database is unreachable or its connections are all taken: nothing was done, the same request may be
 * sent again. The body is a JSON-RPC error naming the state error's code.
 */
function stateRefusal(res: ServerResponse, err: StateUnavailableError | StateBusyError): void {
  const message =
    err.code === "state_busy"
      ? "The Server's state database is busy; nothing was done. Retry the same request shortly."
      : "The Server's state database cannot be reached; nothing was done. Retry the same request shortly.";
  const body = JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message, data: { code: err.code } }, id: null });
  res
    .writeHead(503, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      "retry-after": String(STATE_REFUSAL_RETRY_AFTER_SECS),
    })
    .end(body);
}

/** The PEM certificate chain and key of `[server.tls]`, read once at start; null without TLS. */
function loadTls(config: ServerConfig): { cert: Buffer; key: Buffer } | null {
  if (!config.tls) return null;
  const read = (key: "cert_file" | "key_file", file: string): Buffer => {
    try {
      return readFileSync(file);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code ?? "unreadable";
      throw new ConfigError(`${config.file ?? "<config>"}: server.tls.${key}: cannot read ${file} (${code})`);
    }
  };
  return { cert: read("cert_file", config.tls.certFile), key: read("key_file", config.tls.keyFile) };
}

const OVER_CAPACITY_BODY = JSON.stringify({
  jsonrpc: "2.0",
  error: { code: -32000, message: "Service Unavailable: the Server is at its connection limit; retry shortly" },
  id: null,
});
const OVER_CAPACITY_RESPONSE =
  "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n" +
  `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(OVER_CAPACITY_BODY)}\r\n\r\n${OVER_CAPACITY_BODY}`;
/** Sockets answered 503 by capConnections: nothing they send reaches a handler. */
const overCapacity = new WeakSet<object>();
/** Log at most one "connection limit reached" line per this many milliseconds. */
const OVER_CAPACITY_LOG_INTERVAL_MS = 1000;

/**
 * `[server] max_connections`: the (TLS-completed) sockets open at once. Past the limit a new
 * socket is answered a plain 503 with `Retry-After` and closed at once, so running out of file
 * descriptors shows up as a clear refusal of new clients, not as dropped established ones.
 */
function capConnections(http: Server, max: number, logger: Logger): void {
  let open = 0;
  let refused = 0;
  let lastLog = 0;
  const event = "setSecureContext" in http ? "secureConnection" : "connection";
  http.on(event, (socket: Socket) => {
    if (open >= max) {
      refused++;
      const now = Date.now();
      if (now - lastLog >= OVER_CAPACITY_LOG_INTERVAL_MS) {
        logger.warn({ max_connections: max, refused }, "connection limit reached; new connections answered 503");
        lastLog = now;
        refused = 0;
      }
      overCapacity.add(socket);
      socket.end(OVER_CAPACITY_RESPONSE, () => socket.destroy());
      return;
    }
    open++;
    socket.once("close", () => {
      open--;
    });
  });
}
