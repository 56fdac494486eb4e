/**
 * `startServer`: the listeners and the routing. One node:http server hosts the `/runner` WebSocket upgrade,
 * `/mcp`, the console and `/healthz`; the services behind them are built by wiring/services.ts, which puts each
 * one's close on the one teardown list (wiring/teardown.ts) that `close()` runs, last built first.
 */
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import type { Logger } from "pino";
import { ConfigError, isLoopbackHost, type ServerConfig } from "./config.js";
import { isConsolePath } from "./console/http.js";
import {
  CLUSTER_LINK_REQUEST_PATH,
  ClusterDirectory,
  clusterKey,
  handleLinkRequest,
  takeLinkRequest,
} from "./link/cluster.js";
import { CLUSTER_HOLDER_PROOF_PATH, handleHolderProof } from "./link/holder-proof.js";
import { PeerAuth } from "./link/peer-auth.js";
import { postToPeer } from "./link/peer-http.js";
import { guardInsecurePeers } from "./link/peer-url.js";
import { type ChannelHandler, PeerChannelEndpoint, PeerChannels } from "./link/peer-ws.js";
import { CLUSTER_RUN_PUSH_PATH, handleRunPush, takeRunPush } from "./link/run-push.js";
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

  // --- the cluster (design §14): this block is one piece, to move into its own module whole.
  // Several instances on one PostgreSQL state route link requests to each other (design §14).
  const clustered = config.state.backend === "postgres";
  const linkKey = clusterKey(store.serverSecret);
  // Checks the instances' requests before their bodies are read and signs this instance's answers (link/peer-auth.ts).
  const peerAuth = clustered ? new PeerAuth(linkKey, instanceId, logger.child({ c: "cluster" })) : null;
  // Requests to peers: plain http:// to a non-loopback peer only by `[server.cluster] allow_insecure_transport`.
  const peerPost = guardInsecurePeers(
    postToPeer,
    config.cluster.allowInsecureTransport,
    logger.child({ c: "cluster" }),
  );
  let directory: ClusterDirectory | null = null;
  /** The instances' requests to each other (link/cluster.ts, link/run-push.ts); false: not one of theirs. */
  const serveCluster = (path: string, req: IncomingMessage, res: ServerResponse): boolean => {
    if (peerAuth === null) return false;
    const failed = (what: string) => (err: unknown) => {
      logger.error({ err: (err as Error).message }, `${what} failed`);
      if (!res.headersSent) res.writeHead(500).end();
    };
    if (path === CLUSTER_LINK_REQUEST_PATH) {
      handleLinkRequest(req, res, peerAuth, (r, f, t, i, follower, holder) =>
        runs.executeForwarded(r, f, t, i, follower, holder),
      ).catch(failed("cluster link request"));
      return true;
    }
    if (path === CLUSTER_HOLDER_PROOF_PATH) {
      handleHolderProof(req, res, peerAuth, (r, holder) => runs.holdsLease(r, holder)).catch(failed("holder proof"));
      return true;
    }
    if (path === CLUSTER_RUN_PUSH_PATH) {
      handleRunPush(req, res, peerAuth, (push) => runs.applyPushed(push)).catch(failed("pushed run update"));
      return true;
    }
    return false;
  };
  // Pushes and forwarded syncs over standing channels between instances (link/peer-ws.ts): this instance's
  // channels to its peers, and the endpoint of theirs on the listener serving /_wc/.
  const channels = clustered ? new PeerChannels(linkKey, logger.child({ c: "cluster" }), peerPost) : null;
  if (channels) teardown.add("peer channels", () => channels.close());
  const channelPost = channels
    ? guardInsecurePeers(channels.post, config.cluster.allowInsecureTransport, logger.child({ c: "cluster" }))
    : null;
  const peerEndpoint = peerAuth
    ? new PeerChannelEndpoint(
        peerAuth,
        new Map<string, ChannelHandler>([
          [
            CLUSTER_RUN_PUSH_PATH,
            { take: (body) => takeRunPush(body, (push) => runs.applyPushed(push)), afterWoken: true },
          ],
          [
            CLUSTER_LINK_REQUEST_PATH,
            {
              take: (body) =>
                takeLinkRequest(body, (r, f, t, i, follower, holder) =>
                  runs.executeForwarded(r, f, t, i, follower, holder),
                ),
            },
          ],
        ]),
        logger.child({ c: "cluster" }),
      )
    : null;
  if (peerEndpoint) teardown.add("peer channel endpoint", () => peerEndpoint.close());
  // `[server.cluster] listen_port`: the instances' requests on a listener of their own (design §14).
  const peerListener: Server | null =
    clustered && config.cluster.listen !== null
      ? makeListener(tlsOptions, (req, res) => {
          if (overCapacity.has(req.socket)) {
            req.socket.destroy();
            return;
          }
          if (!serveCluster(requestPath(req), req, res)) notFound(res);
        })
      : null;
  if (peerListener) {
    capConnections(peerListener, config.maxConnections, logger);
    peerListener.on("upgrade", (req, socket, head) => {
      if (overCapacity.has(socket)) {
        socket.destroy();
        return;
      }
      const path = requestPath(req);
      if (peerEndpoint?.serves(path)) {
        peerEndpoint.handleUpgrade(path, req, socket, head);
        return;
      }
      socket.write(NOT_FOUND_UPGRADE);
      socket.destroy();
    });
  }
  // --- end of the cluster block (the part after listening is below).

  const testApi = testHooks ? mountTestApi(runs, config, logger, () => directory?.url ?? null) : null;

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
    if (clustered && config.cluster.onClientListener && serveCluster(path, req, res)) return;
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
    if (peerEndpoint && config.cluster.onClientListener && peerEndpoint.serves(path)) {
      peerEndpoint.handleUpgrade(path, req, socket, head);
      return;
    }
    socket.write(NOT_FOUND_UPGRADE);
    socket.destroy();
  });

  await listen(http, config.port, config.host);
  if (peerListener && config.cluster.listen) {
    await listen(peerListener, config.cluster.listen.port, config.cluster.listen.host);
  }
  const port = (http.address() as AddressInfo).port;
  const host = bracketed(config.host);
  const url = `${tlsOptions ? "https" : "http"}://${host}:${port}`;

  // --- the cluster, once listening.
  const peerUrl =
    peerListener && config.cluster.listen
      ? `${tlsOptions ? "https" : "http"}://${bracketed(config.cluster.listen.host)}:${(peerListener.address() as AddressInfo).port}`
      : url;
  if (clustered && config.cluster.onClientListener) {
    logger.warn(
      { url },
      "[server.cluster] serve_on_client_listener = true: the instances' endpoints (/_wc/cluster/*) are on the " +
        "clients' listener, reachable by anyone who reaches it (through the load balancer too); they refuse " +
        "unsigned requests, but give them a listener of their own (listen_port) where you can",
    );
  }
  if (clustered) {
    directory = new ClusterDirectory(store.engine, instanceId, config.cluster.advertiseUrl ?? peerUrl, logger);
    const joined = directory;
    teardown.add("cluster directory", () => joined.stop());
    await directory.start();
    await store.followChanges();
    await runs.joinCluster(store.engine, {
      instanceId,
      key: linkKey,
      post: channelPost ?? peerPost,
      ...(channels ? { channels } : {}),
      ...(peerAuth ? { authCounts: peerAuth.counts } : {}),
    });
    registry.joinCluster({
      directory,
      key: linkKey,
      requestTimeoutMs: hub.requestTimeoutMs,
      log: logger.child({ c: "cluster" }),
      post: peerPost,
      ...(channelPost ? { syncPost: channelPost } : {}),
    });
  }
  // --- end of the cluster, once listening.
  logger.info(
    {
      url,
      state_dir: config.stateDir,
      state_backend: config.state.backend,
      runners: config.runners.length,
      test_hooks: testHooks,
      ...(directory ? { advertise_url: directory.url } : {}),
      ...(peerListener ? { cluster_listener: peerUrl } : {}),
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

function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
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
