/**
 * `startServer`: one node:http server hosting the `/runner` WebSocket upgrade
 * and delegating `/mcp` to the MCP front end. Owns the state store, the hub,
 * the registry and the run core; `close()` releases all of them.
 */
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import type { Logger } from "pino";
import { clientAddressResolver } from "./client-address.js";
import { ConfigError, isLoopbackHost, type ServerConfig } from "./config.js";
import { type ConsoleMount, createConsole, isConsolePath } from "./console/http.js";
import { ConsoleSessions } from "./console/sessions.js";
import { ConsoleReader } from "./console/snapshot.js";
import { activeServerFailpoint, invalidServerFailpointValue, SERVER_FAILPOINT_ENV } from "./failpoints.js";
import {
  CLUSTER_LINK_REQUEST_PATH,
  ClusterDirectory,
  clusterKey,
  handleLinkRequest,
  takeLinkRequest,
} from "./link/cluster.js";
import { CLUSTER_HOLDER_PROOF_PATH, handleHolderProof } from "./link/holder-proof.js";
import { RunnerHub } from "./link/hub.js";
import { StateLeaseStore } from "./link/lease-store.js";
import { PeerAuth } from "./link/peer-auth.js";
import { postToPeer } from "./link/peer-http.js";
import { guardInsecurePeers } from "./link/peer-url.js";
import { type ChannelHandler, PeerChannelEndpoint, PeerChannels } from "./link/peer-ws.js";
import { PRESENCE_REFRESH_MS, PresenceStore } from "./link/presence.js";
import { Registry } from "./link/registry.js";
import { CLUSTER_RUN_PUSH_PATH, handleRunPush, takeRunPush } from "./link/run-push.js";
import { RunnerTokenStore } from "./link/runner-tokens.js";
import { OperatorReadClients } from "./oauth/operator-read.js";
import { OAuthStore } from "./oauth/store.js";
import { createKeyIdentifier, keyPrincipal, TokenStore } from "./principals/tokens.js";
import type { RunAdmission, RunsApi } from "./runs/api.js";
import { reconcileAtStart } from "./runs/reconcile.js";
import { startRejectedRecordExpiry } from "./runs/record-expiry.js";
import { Runs } from "./runs/runs.js";
import { StateBusyError, StateUnavailableError } from "./state/engine.js";
import { lockStateDir } from "./state/lock.js";
import { openState } from "./state/open.js";
import type { StateStore } from "./state/store.js";
import { mountTestApi, TEST_API_ENV } from "./test-api.js";
import { Webhooks } from "./webhooks/service.js";

export type HttpHandler = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;

/** What the MCP front end gets to build its `/mcp` handler. */
export interface McpMountContext {
  runs: RunsApi;
  /** The run core's one admission path, for front ends that derive run ids themselves (agent tasks). */
  admission?: RunAdmission;
  config: ServerConfig;
  logger: Logger;
  /** The Server's SQLite database (WAL), for additive tables such as audit rows. */
  store: StateStore;
}

export interface McpMount {
  handle: HttpHandler;
  /** Paths besides /mcp this mount answers (the OAuth endpoints when OAuth is on). */
  owns?(path: string): boolean;
  close?(): Promise<void> | void;
}

export type McpHandlerFactory = (ctx: McpMountContext) => HttpHandler | McpMount | Promise<HttpHandler | McpMount>;

export interface StartServerOptions {
  config: ServerConfig;
  logger: Logger;
  mcpHandler?: McpHandlerFactory;
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

export const TEST_DELAY_ENV = "WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS";

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
  // SQLite: one Server per state dir, held until close() (or the process's end); see state/lock.ts.
  // PostgreSQL: several instances share the database by design, so nothing is locked.
  const lock = config.state.backend === "sqlite" ? lockStateDir(config.stateDir) : { release: () => undefined };
  let store: StateStore;
  try {
    store = await openState(config, env);
  } catch (err) {
    lock.release();
    throw err;
  }
  if (store.migrated.length > 0) logger.info({ versions: store.migrated }, "state DB schema migrated");
  const armed = activeServerFailpoint();
  if (armed) logger.warn({ failpoint: armed }, `${SERVER_FAILPOINT_ENV} is set: this Server will SIGKILL itself there`);
  if (invalidServerFailpointValue()) logger.warn(`${SERVER_FAILPOINT_ENV} names no failpoint; ignored`);
  const presence = new PresenceStore(store.engine, (err) =>
    logger.error({ err: (err as Error).message }, "runner presence not written (state DB)"),
  );
  const registry = new Registry(config, presence);
  const presenceTimer = setInterval(() => void presence.seen(registry.liveIds()), PRESENCE_REFRESH_MS);
  presenceTimer.unref();
  const delay = Number(env[TEST_DELAY_ENV] ?? 0);
  const runs = new Runs({
    store,
    registry,
    logger: logger.child({ c: "runs" }),
    ...(Number.isFinite(delay) && delay > 0 ? { testDelayAfterResolveMs: delay } : {}),
    ...(opts.startTimeoutMs !== undefined ? { startTimeoutMs: opts.startTimeoutMs } : {}),
  });
  // Before anything changes a record: the webhook events of a change are written in its transaction (webhooks/).
  const webhooks = new Webhooks(store, config.webhooks, logger.child({ c: "webhooks" }));
  await reconcileAtStart(store, logger);
  const stopExpiry = startRejectedRecordExpiry(store, config.rejectedRecordMaxAgeSecs, logger);
  // Names this instance in link lease holders and in the cluster directory (link/cluster.ts).
  const instanceId = randomBytes(12).toString("base64url");
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
  const hub = new RunnerHub({
    bindings: config.runners,
    logger: logger.child({ c: "hub" }),
    listener: runs,
    heartbeatIntervalMs: config.heartbeatIntervalMs,
    serverInstanceId: instanceId,
    tokens: new RunnerTokenStore(store.engine),
    leaseStore: new StateLeaseStore(store.engine),
  });

  let mcp: McpMount | null = null;
  if (opts.mcpHandler) {
    const made = await opts.mcpHandler({ runs, admission: runs, config, logger, store });
    mcp = typeof made === "function" ? { handle: made } : made;
  }
  const testApi = testHooks ? mountTestApi(runs, config, logger, () => directory?.url ?? null) : null;
  const console_ = mountConsole(store, config, logger, runs, presence, tlsOptions !== null);

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

  await (async () => {
    await listen(http, config.port, config.host);
    if (peerListener && config.cluster.listen) {
      await listen(peerListener, config.cluster.listen.port, config.cluster.listen.host).catch(async (err: unknown) => {
        await closeListener(http);
        throw err;
      });
    }
  })().catch(async (err: unknown) => {
    // Not listening: give back what this start took, the state dir's lock last.
    runs.close();
    peerEndpoint?.close();
    channels?.close();
    stopExpiry();
    clearInterval(presenceTimer);
    console_.close();
    await hub.close();
    if (mcp?.close) await mcp.close();
    await store.close();
    lock.release();
    throw err;
  });
  const port = (http.address() as AddressInfo).port;
  const host = bracketed(config.host);
  const url = `${tlsOptions ? "https" : "http"}://${host}:${port}`;
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
    try {
      directory = new ClusterDirectory(store.engine, instanceId, config.cluster.advertiseUrl ?? peerUrl, logger);
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
    } catch (err) {
      runs.close();
      peerEndpoint?.close();
      channels?.close();
      stopExpiry();
      clearInterval(presenceTimer);
      console_.close();
      await directory?.stop();
      await hub.close();
      if (mcp?.close) await mcp.close();
      await closeListener(http);
      if (peerListener) await closeListener(peerListener);
      await store.close();
      lock.release();
      throw err;
    }
  }
  await webhooks.start();
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

  let closing: Promise<void> | null = null;
  return {
    url,
    port,
    runs,
    store,
    close() {
      closing ??= (async () => {
        runs.close();
        peerEndpoint?.close();
        channels?.close();
        clearInterval(presenceTimer);
        console_.close();
        await directory?.stop();
        await hub.close();
        if (mcp?.close) await mcp.close();
        await closeListener(http);
        if (peerListener) await closeListener(peerListener);
        stopExpiry();
        await webhooks.close();
        await store.close();
        lock.release();
      })();
      return closing;
    },
  };
}

/** A listener (https with `[server.tls]`) answering `onRequest`. */
function makeListener(
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

/** The operator console (console/http.ts) over this Server's state DB, keys and run mirrors. */
function mountConsole(
  store: StateStore,
  config: ServerConfig,
  logger: Logger,
  runs: Runs,
  presence: PresenceStore,
  tls: boolean,
): ConsoleMount {
  const tokens = new TokenStore(store.engine);
  const oauth = new OAuthStore(store.engine);
  const operatorClients = new OperatorReadClients(oauth);
  return createConsole({
    config,
    logger: logger.child({ c: "console" }),
    sessions: new ConsoleSessions(store.engine),
    reader: new ConsoleReader({
      state: store,
      oauth,
      config,
      mirrors: runs.mirrors,
      followEvents: (runId, timeoutMs) => runs.followEvents(runId, timeoutMs),
      presence: () => presence.rows(),
      operatorClients: () => operatorClients.all(),
    }),
    identifyKey: createKeyIdentifier(tokens, config.principals),
    keyPrincipal: keyPrincipal(tokens, config.principals),
    revokeGrant: (grantId, reason) => oauth.revokeGrant(grantId, reason),
    secure: tls || (config.publicUrl?.startsWith("https:") ?? false),
    clientAddress: clientAddressResolver(config.trustedProxies),
  });
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
