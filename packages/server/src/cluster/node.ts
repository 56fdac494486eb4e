/**
 * One Server instance as a node of a cluster on one PostgreSQL state (design §14), wired in one place:
 * `startClusterNode` builds the checks of the peers' requests (cluster/peer-auth.ts), this instance's channels to
 * its peers (cluster/peer-ws.ts) and the endpoint of theirs, its answers to link requests (cluster/forwarded.ts)
 * and holder proofs, the wake-ups of observers elsewhere (cluster/wake-ups.ts) and, with `[server.cluster]
 * listen_port`, the instances' own listener. server.ts routes to it (`serveHttp`, `serveUpgrade` on the clients'
 * listener, only with the warned `serve_on_client_listener`), starts it once the clients' listener has its URL
 * (`start`: the peer listener, the directory row, run changes followed, Runners linked elsewhere found), and
 * stops and closes it.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import type { Logger } from "pino";
import type { ServerConfig } from "../config.js";
import type { Registry } from "../link/registry.js";
import type { RunCore } from "../runs/runs.js";
import type { StateStore } from "../state/store.js";
import { ClusterDirectory } from "./directory.js";
import { ForwardedRequests } from "./forwarded.js";
import { CLUSTER_HOLDER_PROOF_PATH, handleHolderProof } from "./holder-proof.js";
import { CLUSTER_LINK_REQUEST_PATH, handleLinkRequest, takeLinkRequest } from "./link-request.js";
import { clusterKey, PeerAuth } from "./peer-auth.js";
import { postToPeer } from "./peer-http.js";
import { guardInsecurePeers } from "./peer-url.js";
import { type ChannelHandler, PeerChannelEndpoint, PeerChannels } from "./peer-ws.js";
import { remoteRunners } from "./remote-runner.js";
import { CLUSTER_RUN_PUSH_PATH, handleRunPush, type RunPush, takeRunPush } from "./run-push.js";
import { WakeUps } from "./wake-ups.js";

/** How server.ts makes, binds and closes a listener (capped and guarded like the clients' one). */
export interface ClusterListeners {
  make(
    onRequest: (req: IncomingMessage, res: ServerResponse) => void,
    onUpgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void,
  ): Server;
  listen(server: Server, port: number, host: string): Promise<void>;
  close(server: Server): Promise<void>;
}

export interface ClusterNodeDeps {
  config: ServerConfig;
  logger: Logger;
  store: StateStore;
  /** The run core (runs/runs.ts `Runs.core`). */
  runs: RunCore;
  registry: Registry;
  /** Names this instance in link lease holders and in the cluster directory. */
  instanceId: string;
  /** How long a forwarded request waits for the Runner by default (the hub's request timeout). */
  requestTimeoutMs: number;
  /** Whether the listeners speak TLS (`[server.tls]`): the scheme of the peer listener's URL. */
  tls: boolean;
  listeners: ClusterListeners;
}

export interface ClusterNode {
  /** A request on the clients' listener: true when it was one of the instances' (then answered). */
  serveHttp(path: string, req: IncomingMessage, res: ServerResponse): boolean;
  /** An upgrade on the clients' listener: true when it was one of the instances' channels (then taken). */
  serveUpgrade(path: string, req: IncomingMessage, socket: Duplex, head: Buffer): boolean;
  /**
   * Bind the instances' own listener (`listen_port`), then take part: the directory row (at `advertise_url`,
   * else the instances' listener, else `clientUrl`), run changes followed and told, Runners linked to other
   * instances found by the registry. Throws when the listener or the database fails; `close()` then undoes it.
   */
  start(clientUrl: string): Promise<void>;
  /** The instances' own listener's URL, once bound (null: none). */
  readonly listenerUrl: string | null;
  /** The URL this instance's peers reach it on (its directory row), once started. */
  readonly advertiseUrl: string | null;
  /** What the cluster paths did here, for tests (`/__test/cluster-stats`). */
  counts(): Record<string, number>;
  /** Stop taking part: wake-ups, channels and their endpoint, the directory row (the listener stays bound). */
  stop(): Promise<void>;
  /** `stop()`, then close the instances' own listener. */
  close(): Promise<void>;
}

/** The answer to an upgrade of a path that has none (the socket is destroyed after it). */
const NOT_FOUND_UPGRADE = "HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";

/** A request's path, without its query. */
function requestPath(req: IncomingMessage): string {
  return (req.url ?? "/").split("?")[0] ?? "/";
}

export function startClusterNode(deps: ClusterNodeDeps): ClusterNode {
  const { config, logger, store, runs, registry, instanceId } = deps;
  const log = logger.child({ c: "cluster" });
  const linkKey = clusterKey(store.serverSecret);
  // Checks the instances' requests before their bodies are read and signs this instance's answers.
  const peerAuth = new PeerAuth(linkKey, instanceId, log);
  // Requests to peers: plain http:// to a non-loopback peer only by `[server.cluster] allow_insecure_transport`.
  const peerPost = guardInsecurePeers(postToPeer, config.cluster.allowInsecureTransport, log);
  // Pushes and forwarded syncs over standing channels between instances: this instance's channels to its peers,
  // and the endpoint of theirs on the listener serving /_wc/.
  const channels = new PeerChannels(linkKey, log, peerPost);
  const channelPost = guardInsecurePeers(channels.post, config.cluster.allowInsecureTransport, log);
  let wakeUps: WakeUps | null = null;
  let directory: ClusterDirectory | null = null;
  const forwarded = new ForwardedRequests(runs, (runId, follower) => wakeUps?.follow(runId, follower));
  const execute = forwarded.execute.bind(forwarded);
  const applyPushed = (push: RunPush): boolean => wakeUps?.applyPushed(push) ?? false;

  /** The instances' requests to each other; false: not one of theirs. */
  const serveCluster = (path: string, req: IncomingMessage, res: ServerResponse): boolean => {
    const failed = (what: string) => (err: unknown) => {
      logger.error({ err: (err as Error).message }, `${what} failed`);
      if (!res.headersSent) res.writeHead(500).end();
    };
    if (path === CLUSTER_LINK_REQUEST_PATH) {
      handleLinkRequest(req, res, peerAuth, execute).catch(failed("cluster link request"));
      return true;
    }
    if (path === CLUSTER_HOLDER_PROOF_PATH) {
      handleHolderProof(req, res, peerAuth, (r, holder) => forwarded.holdsLease(r, holder)).catch(
        failed("holder proof"),
      );
      return true;
    }
    if (path === CLUSTER_RUN_PUSH_PATH) {
      handleRunPush(req, res, peerAuth, applyPushed).catch(failed("pushed run update"));
      return true;
    }
    return false;
  };
  const peerEndpoint = new PeerChannelEndpoint(
    peerAuth,
    new Map<string, ChannelHandler>([
      [CLUSTER_RUN_PUSH_PATH, { take: (body) => takeRunPush(body, applyPushed), afterWoken: true }],
      [CLUSTER_LINK_REQUEST_PATH, { take: (body) => takeLinkRequest(body, execute) }],
    ]),
    log,
  );
  const serveUpgrade = (path: string, req: IncomingMessage, socket: Duplex, head: Buffer): boolean => {
    if (!peerEndpoint.serves(path)) return false;
    peerEndpoint.handleUpgrade(path, req, socket, head);
    return true;
  };
  // `[server.cluster] listen_port`: the instances' requests on a listener of their own (design §14).
  const own = config.cluster.listen;
  const peerListener: Server | null =
    own !== null
      ? deps.listeners.make(
          (req, res) => {
            if (!serveCluster(requestPath(req), req, res)) {
              res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not_found"}');
            }
          },
          (req, socket, head) => {
            if (serveUpgrade(requestPath(req), req, socket, head)) return;
            socket.write(NOT_FOUND_UPGRADE);
            socket.destroy();
          },
        )
      : null;
  let listenerUrl: string | null = null;

  let stopping: Promise<void> | null = null;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      wakeUps?.close();
      peerEndpoint.close();
      channels.close();
      await directory?.stop();
    })();
    return stopping;
  };

  return {
    serveHttp: (path, req, res) => config.cluster.onClientListener && serveCluster(path, req, res),
    serveUpgrade: (path, req, socket, head) => config.cluster.onClientListener && serveUpgrade(path, req, socket, head),
    get listenerUrl() {
      return listenerUrl;
    },
    get advertiseUrl() {
      return directory?.url ?? null;
    },
    async start(clientUrl: string): Promise<void> {
      if (peerListener && own) {
        await deps.listeners.listen(peerListener, own.port, own.host);
        const host = own.host.includes(":") ? `[${own.host}]` : own.host;
        listenerUrl = `${deps.tls ? "https" : "http"}://${host}:${(peerListener.address() as AddressInfo).port}`;
      }
      if (config.cluster.onClientListener) {
        logger.warn(
          { url: clientUrl },
          "[server.cluster] serve_on_client_listener = true: the instances' endpoints (/_wc/cluster/*) are on the " +
            "clients' listener, reachable by anyone who reaches it (through the load balancer too); they refuse " +
            "unsigned requests, but give them a listener of their own (listen_port) where you can",
        );
      }
      directory = new ClusterDirectory(
        store.engine,
        instanceId,
        config.cluster.advertiseUrl ?? listenerUrl ?? clientUrl,
        logger,
      );
      await directory.start();
      await store.followChanges();
      wakeUps = await WakeUps.join(runs, store.engine, { instanceId, key: linkKey, post: channelPost, channels });
      registry.joinCluster(
        remoteRunners({
          directory,
          key: linkKey,
          requestTimeoutMs: deps.requestTimeoutMs,
          log,
          post: peerPost,
          syncPost: channelPost,
        }),
      );
    },
    counts: () => ({ ...forwarded.counts, ...wakeUps?.counts, ...channels.counts, ...peerAuth.counts }),
    stop,
    async close(): Promise<void> {
      await stop();
      if (peerListener) await deps.listeners.close(peerListener);
    },
  };
}
