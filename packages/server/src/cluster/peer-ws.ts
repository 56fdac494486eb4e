/**
 * Requests between instances over one standing WebSocket per peer and path (design §14): the holder's pushes
 * to a following instance (`CLUSTER_RUN_PUSH_PATH`, cluster/run-push.ts) and a follower's catch-ups through the
 * holder (`run.sync` link requests, `CLUSTER_LINK_REQUEST_PATH`, cluster/link-request.ts), each with the same signed
 * body and the same answer as its POST, without an HTTP request each. On this machine a message over a
 * standing WebSocket reaches the other process in about half the time of a POST on a kept-alive connection,
 * it is read whole in one event, and a saturated peer does not keep it in its listen queue (a new
 * connection waits there behind clients' handshakes: libuv accepts one per turn of the event loop).
 *
 * - The channel: `GET <path>` upgraded on the peer's cluster listener, the upgrade signed like a cluster
 *   request over an empty body. Each request is one text message `"<id> <timestamp> <signature>\n<body>"`
 *   (the signature over the body, as for a POST); the peer answers `"<id> <status> <instance> <signature>\n<answer>"`
 *   with the status and answer the POST would have had, signed as a POST's answer is (cluster/peer-auth.ts: for
 *   that request's signature, under the answering instance's id); the requester verifies it as it would a POST's.
 * - Made when a peer is named a follower (`prepare`) or at the first request, kept while requests go (closed
 *   after PEER_CHANNEL_IDLE_MS without one). Requests made while it connects wait for it (bounded like the
 *   others), and go as POSTs if it fails before it opens.
 * - A peer that refuses the upgrade (an instance of an older release, a proxy in between) gets that path's
 *   requests as POSTs (cluster/peer-http.ts) for PEER_CHANNEL_RETRY_MS, then the channel is tried again.
 * - A request not answered within its timeout fails as possibly sent, as a POST's does (`sent: false` only
 *   for one never written to the channel); when nothing at all came back on the channel since it was sent,
 *   the channel is closed (its other requests fail with it, possibly sent) and the next one makes a new one.
 * - Bounds: PEER_CHANNEL_MAX_IN_FLIGHT requests waiting per channel, PEER_CHANNEL_MAX_BUFFERED_BYTES unsent
 *   on it, PEER_CHANNEL_MAX_CHANNELS channels held (beyond, POSTs); on the answering side,
 *   PEER_CHANNEL_MAX_CONNECTIONS channels and messages of at most CLUSTER_MAX_BODY_BYTES plus their header
 *   line; an answer at most the caller's bound.
 */
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import type { Logger } from "pino";
import WebSocket, { WebSocketServer } from "ws";
import { CLUSTER_LINK_REQUEST_PATH } from "./link-request.js";
import {
  CLUSTER_MAX_BODY_BYTES,
  CLUSTER_SIGNATURE_HEADER,
  CLUSTER_TIMESTAMP_HEADER,
  type PeerAuth,
  signAnswer,
  signatureRefusal,
  signedHeaders,
} from "./peer-auth.js";
import { type PeerAnswer, type Post, postToPeer } from "./peer-http.js";
import { CLUSTER_RUN_PUSH_PATH, MAX_FOLLOWED_RUNS, RUN_PUSH_ANSWER_MAX_BYTES } from "./run-push.js";

/** How long a channel's upgrade may take. */
export const PEER_CHANNEL_CONNECT_TIMEOUT_MS = 2_000;
/** A channel no request went over for this long is closed. */
export const PEER_CHANNEL_IDLE_MS = 30_000;
/** After a peer refused a channel's upgrade (or it failed), that path's requests go as POSTs for this long. */
export const PEER_CHANNEL_RETRY_MS = 30_000;
/** Requests waiting for their answer on one channel at most (a push per followed run and follower). */
export const PEER_CHANNEL_MAX_IN_FLIGHT = MAX_FOLLOWED_RUNS;
/** Bytes written to a channel and not yet sent at most; a request beyond fails unsent. */
export const PEER_CHANNEL_MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
/** Channels one instance holds to its peers at most; requests beyond go as POSTs. */
export const PEER_CHANNEL_MAX_CHANNELS = 256;
/** Channels an instance accepts from its peers at most. */
export const PEER_CHANNEL_MAX_CONNECTIONS = 512;
/** A message's header line (`"<id> <timestamp> <signature>\n"`, or the answer's) is at most this long. */
export const PEER_CHANNEL_HEADER_MAX_BYTES = 192;

/** The paths a channel carries, with the most an answer on each may be. */
const CHANNEL_PATHS: ReadonlyMap<string, { answerMaxBytes: number }> = new Map([
  [CLUSTER_RUN_PUSH_PATH, { answerMaxBytes: RUN_PUSH_ANSWER_MAX_BYTES }], // {"following":…} or a refusal
  [CLUSTER_LINK_REQUEST_PATH, { answerMaxBytes: CLUSTER_MAX_BODY_BYTES }], // a Runner's answer frame
]);

const REQUEST_HEADER = /^(\d{1,15}) (\d{1,15}) ([0-9a-f]{64})$/;
const ANSWER_HEADER = /^(\d{1,15}) (\d{3})(?: ([A-Za-z0-9_-]{1,64}) ([0-9a-f]{64}))?$/;
const EMPTY = Buffer.alloc(0);

interface Waiting {
  resolve: (answer: PeerAnswer) => void;
  timer: NodeJS.Timeout;
  max: number;
}

interface Channel {
  ws: WebSocket;
  open: boolean;
  nextId: number;
  waiting: Map<number, Waiting>;
  /** Requests made while the channel connects: sent when it opens, as POSTs when it fails first. */
  queued: (() => void)[];
  fallback: (() => void)[];
  /** When anything last came back on the channel (performance.now()). */
  heardAt: number;
  idle: NodeJS.Timeout;
}

/** Requests sent over a channel and as POSTs, by path (`/__test/cluster-stats`). */
export interface PeerChannelCounts {
  pushes_by_channel: number;
  pushes_by_post: number;
  link_requests_by_channel: number;
  link_requests_by_post: number;
}

/** One instance's channels to its peers, one per peer origin and path; `post` is cluster/peer-http.ts `postToPeer`'s twin. */
export class PeerChannels {
  readonly #channels = new Map<string, Channel>();
  /** Per peer origin and path, until when its requests go as POSTs (it refused the upgrade). */
  readonly #postUntil = new Map<string, number>();
  #closed = false;
  readonly counts: PeerChannelCounts = {
    pushes_by_channel: 0,
    pushes_by_post: 0,
    link_requests_by_channel: 0,
    link_requests_by_post: 0,
  };

  constructor(
    private readonly key: Buffer,
    private readonly log: Logger,
    private readonly http: Post = postToPeer,
  ) {}

  /** Channels held, open or connecting (tests). */
  get channels(): number {
    return this.#channels.size;
  }

  /**
   * One request to `url` (`<peer><path>`), its body signed in `headers` (peer-auth.ts signedHeaders): over the
   * channel for that peer and path when the path has one (CHANNEL_PATHS), else as a POST.
   */
  readonly post: Post = (url, headers, body, timeoutMs, maxBodyBytes) => {
    // A peer's URL was checked where it was named (cluster/link-request.ts); never throw here.
    if (!URL.canParse(url)) return Promise.resolve({ kind: "failed", sent: false, code: "bad_url" });
    const target = new URL(url);
    const path = CHANNEL_PATHS.get(target.pathname);
    const pushes = target.pathname === CLUSTER_RUN_PUSH_PATH;
    const asPost = () => {
      if (pushes) this.counts.pushes_by_post += 1;
      else this.counts.link_requests_by_post += 1;
      return this.http(url, headers, body, timeoutMs, maxBodyBytes);
    };
    if (path === undefined || target.search !== "") return asPost();
    const ch = this.#channelFor(target, Math.max(maxBodyBytes, path.answerMaxBytes));
    if (ch === null) return asPost();
    ch.idle.refresh();
    if (ch.waiting.size + ch.queued.length >= PEER_CHANNEL_MAX_IN_FLIGHT) {
      return Promise.resolve({ kind: "failed", sent: false, code: "busy" });
    }
    const header = `${headers[CLUSTER_TIMESTAMP_HEADER] ?? ""} ${headers[CLUSTER_SIGNATURE_HEADER] ?? ""}`;
    return new Promise<PeerAnswer>((resolve) => {
      const send = () => {
        if (pushes) this.counts.pushes_by_channel += 1;
        else this.counts.link_requests_by_channel += 1;
        this.#send(ch, header, body, timeoutMs, maxBodyBytes, resolve);
      };
      if (ch.open) send();
      else {
        ch.queued.push(send);
        ch.fallback.push(() => void asPost().then(resolve));
      }
    });
  };

  /**
   * Open the push channel to the instance at `peerUrl` now, when it has none (it was just named a follower):
   * its first push then does not wait for the upgrade. Nothing for a peer whose pushes go as POSTs.
   */
  prepare(peerUrl: string): void {
    const url = `${peerUrl}${CLUSTER_RUN_PUSH_PATH}`;
    if (URL.canParse(url)) this.#channelFor(new URL(url), RUN_PUSH_ANSWER_MAX_BYTES);
  }

  /**
   * The channel to `target`'s origin and path, made now when there is none; null when its requests go as
   * POSTs (closed, the peer refused the upgrade within PEER_CHANNEL_RETRY_MS, PEER_CHANNEL_MAX_CHANNELS held).
   */
  #channelFor(target: URL, answerMaxBytes: number): Channel | null {
    if (this.#closed) return null;
    const key = `${target.origin}${target.pathname}`;
    const until = this.#postUntil.get(key);
    if (until !== undefined) {
      if (Date.now() < until) return null;
      this.#postUntil.delete(key);
    }
    const held = this.#channels.get(key);
    if (held !== undefined) return held;
    if (this.#channels.size >= PEER_CHANNEL_MAX_CHANNELS) return null;
    return this.#connect(key, target, answerMaxBytes);
  }

  /** Close every channel; requests still waiting fail (possibly sent), later ones go as POSTs. */
  close(): void {
    this.#closed = true;
    for (const ch of this.#channels.values()) ch.ws.terminate();
  }

  #connect(key: string, target: URL, answerMaxBytes: number): Channel {
    const wsUrl = `${target.protocol === "https:" ? "wss:" : "ws:"}//${target.host}${target.pathname}`;
    const ws = new WebSocket(wsUrl, {
      headers: signedHeaders(this.key, EMPTY),
      handshakeTimeout: PEER_CHANNEL_CONNECT_TIMEOUT_MS,
      maxPayload: PEER_CHANNEL_HEADER_MAX_BYTES + answerMaxBytes,
      perMessageDeflate: false,
      followRedirects: false,
    });
    const idle = setTimeout(() => ws.close(1000, "idle"), PEER_CHANNEL_IDLE_MS);
    idle.unref();
    const ch: Channel = {
      ws,
      open: false,
      nextId: 1,
      waiting: new Map(),
      queued: [],
      fallback: [],
      heardAt: performance.now(),
      idle,
    };
    this.#channels.set(key, ch);
    ws.on("open", () => {
      ch.open = true;
      ch.heardAt = performance.now();
      const queued = ch.queued.splice(0);
      ch.fallback = [];
      for (const send of queued) send();
    });
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      ch.heardAt = performance.now();
      if (!isBinary) this.#answered(ch, data);
    });
    ws.on("unexpected-response", (_req, res) => {
      // Not a channel (an instance of an older release answers 404): POSTs for a while.
      this.log.debug({ peer: key, status: res.statusCode }, "peer refused a channel; its requests go as POSTs");
      res.resume();
      ws.terminate();
    });
    ws.on("error", (err) => {
      this.log.debug({ peer: key, err: err.message }, "channel to a peer failed");
    });
    ws.on("close", () => {
      clearTimeout(idle);
      if (this.#channels.get(key) === ch) this.#channels.delete(key);
      if (!ch.open) {
        this.#postUntil.set(key, Date.now() + PEER_CHANNEL_RETRY_MS);
        if (this.#postUntil.size > PEER_CHANNEL_MAX_CHANNELS) {
          const oldest = this.#postUntil.keys().next().value;
          if (oldest !== undefined) this.#postUntil.delete(oldest);
        }
      }
      ch.queued = [];
      for (const post of ch.fallback.splice(0)) post();
      for (const w of ch.waiting.values()) {
        clearTimeout(w.timer);
        w.resolve({ kind: "failed", sent: true, code: "closed" });
      }
      ch.waiting.clear();
    });
    return ch;
  }

  #send(
    ch: Channel,
    header: string,
    body: Buffer,
    timeoutMs: number,
    max: number,
    resolve: (answer: PeerAnswer) => void,
  ): void {
    if (ch.ws.readyState !== WebSocket.OPEN) {
      resolve({ kind: "failed", sent: false, code: "closed" });
      return;
    }
    if (ch.ws.bufferedAmount + body.length > PEER_CHANNEL_MAX_BUFFERED_BYTES) {
      resolve({ kind: "failed", sent: false, code: "busy" });
      return;
    }
    const id = ch.nextId++;
    const sentAt = performance.now();
    const timer = setTimeout(() => {
      ch.waiting.delete(id);
      resolve({ kind: "failed", sent: true, code: "timeout" });
      // Nothing came back since this request left: the channel (or the peer) is stuck; make a new one.
      if (ch.heardAt < sentAt) ch.ws.terminate();
    }, timeoutMs);
    ch.waiting.set(id, { resolve, timer, max });
    ch.ws.send(Buffer.concat([Buffer.from(`${id} ${header}\n`, "utf8"), body]), { binary: false });
  }

  #answered(ch: Channel, data: Buffer): void {
    const nl = data.indexOf(10);
    const head = nl < 0 ? null : ANSWER_HEADER.exec(data.subarray(0, nl).toString("latin1"));
    const w = head ? ch.waiting.get(Number(head[1])) : undefined;
    if (!head || !w) return; // not an answer to a request waiting here (timed out): nothing to do
    ch.waiting.delete(Number(head[1]));
    clearTimeout(w.timer);
    const text = data.subarray(nl + 1);
    if (text.length > w.max) w.resolve({ kind: "failed", sent: true, code: "body_too_large" });
    else {
      const [, , status, signer, signature] = head;
      w.resolve({
        kind: "answered",
        status: Number(status),
        text: text.toString("utf8"),
        ...(signer !== undefined && signature !== undefined ? { signer, signature } : {}),
      });
    }
  }
}

/** What a path's requests get on the answering side: a verified body's status and answer. */
export interface ChannelHandler {
  take(body: Buffer): { status: number; answer: object } | Promise<{ status: number; answer: object }>;
  /** Write the answer after the observers the request woke have answered their callers (pushes). */
  afterWoken?: boolean;
}

/** The answering side: channels from peers, each request verified and taken as its POST would be. */
export class PeerChannelEndpoint {
  readonly #wss = new WebSocketServer({
    noServer: true,
    maxPayload: PEER_CHANNEL_HEADER_MAX_BYTES + CLUSTER_MAX_BODY_BYTES,
    perMessageDeflate: false,
    clientTracking: true,
  });

  constructor(
    /** Checks requests and signs answers as this instance (cluster/peer-auth.ts). */
    private readonly auth: PeerAuth,
    /** By path (CLUSTER_RUN_PUSH_PATH, CLUSTER_LINK_REQUEST_PATH). */
    private readonly handlers: ReadonlyMap<string, ChannelHandler>,
    private readonly log: Logger,
  ) {}

  /** Whether an upgrade of `path` is one of ours. */
  serves(path: string): boolean {
    return this.handlers.has(path);
  }

  /**
   * An upgrade of `GET <path>` (one `serves`). Refused, with the connection closed: 401 as a cluster
   * request's signature (over an empty body), 503 past PEER_CHANNEL_MAX_CONNECTIONS channels.
   */
  handleUpgrade(path: string, req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const handler = this.handlers.get(path);
    if (handler === undefined) {
      refuseUpgrade(socket, 404, "not_found", "no channel on this path");
      return;
    }
    const refusal = signatureRefusal(
      this.auth.key,
      req.headers[CLUSTER_TIMESTAMP_HEADER],
      req.headers[CLUSTER_SIGNATURE_HEADER],
      EMPTY,
    );
    if (refusal !== null) {
      this.auth.refused(req.socket.remoteAddress ?? "?", `GET ${path}`, refusal.error, true);
      refuseUpgrade(socket, refusal.status, refusal.error, refusal.message);
      return;
    }
    if (this.#wss.clients.size >= PEER_CHANNEL_MAX_CONNECTIONS) {
      refuseUpgrade(socket, 503, "too_many_channels", `at most ${PEER_CHANNEL_MAX_CONNECTIONS} cluster channels`);
      return;
    }
    this.#wss.handleUpgrade(req, socket, head, (ws) => this.#serve(ws, handler, req.socket.remoteAddress ?? "?", path));
  }

  /** Close every channel (the instance stops). */
  close(): void {
    for (const ws of this.#wss.clients) ws.terminate();
    this.#wss.close();
  }

  #serve(ws: WebSocket, handler: ChannelHandler, remote: string, path: string): void {
    // Deferred answers (see `afterWoken`) go out together; at most as many as requests in flight from that peer.
    const answers: string[] = [];
    const flush = () => {
      for (const a of answers.splice(0)) if (ws.readyState === WebSocket.OPEN) ws.send(a);
    };
    const answer = (id: string, signature: string, status: number, body: object, defer: boolean) => {
      const json = JSON.stringify(body);
      const signed = signAnswer(this.auth.key, signature, this.auth.instanceId, status, json);
      const text = `${id} ${status} ${this.auth.instanceId} ${signed}\n${json}`;
      if (!defer) {
        if (ws.readyState === WebSocket.OPEN) ws.send(text);
        return;
      }
      answers.push(text);
      if (answers.length === 1) afterWoken(flush);
    };
    ws.on("error", (err) => this.log.debug({ err: err.message }, "cluster channel from a peer failed"));
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      const nl = isBinary ? -1 : data.indexOf(10);
      const head =
        nl < 0 || nl > PEER_CHANNEL_HEADER_MAX_BYTES
          ? null
          : REQUEST_HEADER.exec(data.subarray(0, nl).toString("latin1"));
      if (!head) {
        // Without its id no answer can be matched: the sender is not one of ours.
        ws.close(1008, "a request is a text message: <id> <timestamp> <signature>, a newline, the body");
        return;
      }
      const [, id = "", timestamp, signature = ""] = head;
      const body = data.subarray(nl + 1);
      const refusal = signatureRefusal(this.auth.key, timestamp, signature, body);
      if (refusal !== null) {
        this.auth.refused(remote, `channel ${path}`, refusal.error, false);
        answer(id, signature, refusal.status, { error: refusal.error, message: refusal.message }, false);
        return;
      }
      let taken: ReturnType<ChannelHandler["take"]>;
      try {
        taken = handler.take(body);
      } catch (err) {
        this.log.error({ err: (err as Error).message }, "cluster request over a channel failed");
        answer(id, signature, 500, { error: "internal", message: "the request failed on this instance" }, false);
        return;
      }
      if (!(taken instanceof Promise)) {
        answer(id, signature, taken.status, taken.answer, handler.afterWoken === true);
        return;
      }
      taken.then(
        (t) => answer(id, signature, t.status, t.answer, handler.afterWoken === true),
        (err: unknown) => {
          this.log.error({ err: (err as Error).message }, "cluster request over a channel failed");
          answer(id, signature, 500, { error: "internal", message: "the request failed on this instance" }, false);
        },
      );
    });
  }
}
/**
 * Run `fn` after the observers woken in this turn of the event loop have answered their callers: an
 * observe continues in a setImmediate of its own after its wake-up (runs/observe.ts), queued after one queued
 * here, and an immediate queued from an immediate runs in the next turn. Writing a push's answer first cost
 * the woken observer about 0.15 ms of its wake-up on this machine (docs/benchmarks.md).
 */
function afterWoken(fn: () => void): void {
  setImmediate(() => setImmediate(fn));
}

function refuseUpgrade(socket: Duplex, status: number, error: string, message: string): void {
  const body = JSON.stringify({ error, message });
  const reason = status === 401 ? "Unauthorized" : status === 404 ? "Not Found" : "Service Unavailable";
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nConnection: close\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
}
