/**
 * The holder's pushes to a following instance (link/run-push.ts) over one standing WebSocket per peer
 * (design §14): the same signed body and the same answer as `POST CLUSTER_RUN_PUSH_PATH`, without an HTTP
 * request per update. On this machine a message over a standing WebSocket reaches the other process in
 * about half the time of a POST on a kept-alive connection, and the follower reads it whole in one event;
 * the cross-instance wake-up is one push.
 *
 * - The channel: `GET CLUSTER_RUN_PUSH_PATH` upgraded on the follower's cluster listener, the upgrade
 *   signed like a cluster request over an empty body. Each push is one text message
 *   `"<id> <timestamp> <signature>\n<body>"` (the signature over the body, as for a POST); the follower
 *   answers `"<id> <status>\n<answer>"` with the status and answer the POST would have had.
 * - Made when the peer is named a follower (`prepare`) or at the first push to it, kept while pushes go
 *   (closed after PEER_PUSH_IDLE_MS without one). Pushes made while it connects wait for it (bounded like
 *   the others).
 * - A peer that refuses the upgrade (an instance of an older release, a proxy in between) gets its pushes
 *   as POSTs (link/peer-http.ts) for PEER_PUSH_RETRY_MS, then the channel is tried again.
 * - A push not answered within its timeout fails as possibly sent, as a POST's does; when nothing at all
 *   came back on the channel since that push was sent, the channel is closed (its other pushes fail with
 *   it) and the next push makes a new one.
 * - Bounds: PEER_PUSH_MAX_IN_FLIGHT pushes waiting per channel, PEER_PUSH_MAX_BUFFERED_BYTES unsent on
 *   it, PEER_PUSH_MAX_CHANNELS peers with a channel (beyond, POSTs); on the follower,
 *   PEER_PUSH_MAX_CONNECTIONS channels and messages of at most CLUSTER_MAX_BODY_BYTES plus their header line.
 */
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import type { Logger } from "pino";
import WebSocket, { WebSocketServer } from "ws";
import {
  CLUSTER_MAX_BODY_BYTES,
  CLUSTER_SIGNATURE_HEADER,
  CLUSTER_TIMESTAMP_HEADER,
  signatureRefusal,
  signedHeaders,
} from "./cluster.js";
import { type PeerAnswer, postToPeer } from "./peer-http.js";
import { type ApplyRunPush, CLUSTER_RUN_PUSH_PATH, MAX_FOLLOWED_RUNS, type Post, takeRunPush } from "./run-push.js";

/** How long the holder waits for a channel's upgrade to be answered. */
export const PEER_PUSH_CONNECT_TIMEOUT_MS = 2_000;
/** A channel no push went over for this long is closed. */
export const PEER_PUSH_IDLE_MS = 30_000;
/** After a peer refused the upgrade (or it failed), its pushes go as POSTs for this long. */
export const PEER_PUSH_RETRY_MS = 30_000;
/** Pushes waiting for their answer on one channel at most (one per followed run and follower). */
export const PEER_PUSH_MAX_IN_FLIGHT = MAX_FOLLOWED_RUNS;
/** Bytes written to a channel and not yet sent at most; a push beyond fails unsent (the follower catches up). */
export const PEER_PUSH_MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
/** Peers the holder keeps a channel to at most; pushes to others go as POSTs. */
export const PEER_PUSH_MAX_CHANNELS = 256;
/** Channels a follower accepts at most (one per holder instance). */
export const PEER_PUSH_MAX_CONNECTIONS = 256;
/** A message's header line (`"<id> <timestamp> <signature>\n"`, or the answer's) is at most this long. */
export const PEER_PUSH_HEADER_MAX_BYTES = 128;
/** An answer's text is at most this long (`{"following":true}`, or a refusal's error and message). */
export const PEER_PUSH_ANSWER_MAX_BYTES = 1_024;

const PUSH_HEADER = /^(\d{1,15}) (\d{1,15}) ([0-9a-f]{64})$/;
const ANSWER_HEADER = /^(\d{1,15}) (\d{3})$/;
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
  /** Pushes made while the channel connects: sent when it opens, as POSTs when it fails first. */
  queued: (() => void)[];
  fallback: (() => void)[];
  /** When anything last came back on the channel (performance.now()). */
  heardAt: number;
  idle: NodeJS.Timeout;
}

/** The holder's channels, one per peer origin; `post` has the signature of link/peer-http.ts `postToPeer`. */
export class PeerPushChannels {
  readonly #channels = new Map<string, Channel>();
  /** Per peer origin, until when its pushes go as POSTs (it refused the upgrade). */
  readonly #postUntil = new Map<string, number>();
  #closed = false;
  /** Pushes sent over a channel and as POSTs (`/__test/cluster-stats`). */
  readonly counts = { pushes_by_channel: 0, pushes_by_post: 0 };

  constructor(
    private readonly key: Buffer,
    private readonly log: Logger,
    private readonly http: Post = postToPeer,
  ) {}

  /** Peers with a channel, open or connecting (tests). */
  get channels(): number {
    return this.#channels.size;
  }

  /** One push to `url` (`<peer>CLUSTER_RUN_PUSH_PATH`), its body signed in `headers` (cluster.ts signedHeaders). */
  readonly post: Post = (url, headers, body, timeoutMs, maxBodyBytes) => {
    // A follower's URL was checked where it was named (link/cluster.ts PeerInstance); never throw here.
    if (!URL.canParse(url)) return Promise.resolve({ kind: "failed", sent: false, code: "bad_url" });
    const target = new URL(url);
    const origin = target.origin;
    const asPost = () => {
      this.counts.pushes_by_post += 1;
      return this.http(url, headers, body, timeoutMs, maxBodyBytes);
    };
    if (this.#closed || target.pathname !== CLUSTER_RUN_PUSH_PATH) return asPost();
    const until = this.#postUntil.get(origin);
    if (until !== undefined) {
      if (Date.now() < until) return asPost();
      this.#postUntil.delete(origin);
    }
    let channel = this.#channels.get(origin);
    if (channel === undefined) {
      if (this.#channels.size >= PEER_PUSH_MAX_CHANNELS) return asPost();
      channel = this.#connect(origin, target);
    }
    const ch = channel;
    ch.idle.refresh();
    if (ch.waiting.size + ch.queued.length >= PEER_PUSH_MAX_IN_FLIGHT) {
      return Promise.resolve({ kind: "failed", sent: false, code: "busy" });
    }
    const header = `${headers[CLUSTER_TIMESTAMP_HEADER] ?? ""} ${headers[CLUSTER_SIGNATURE_HEADER] ?? ""}`;
    return new Promise<PeerAnswer>((resolve) => {
      const send = () => this.#send(ch, header, body, timeoutMs, maxBodyBytes, resolve);
      if (ch.open) send();
      else {
        ch.queued.push(send);
        ch.fallback.push(() => void asPost().then(resolve));
      }
    });
  };

  /**
   * Open the channel to the instance at `peerUrl` now, when it has none (it was just named a follower): its
   * first push then does not wait for the upgrade. Nothing for a peer whose pushes go as POSTs.
   */
  prepare(peerUrl: string): void {
    const url = `${peerUrl}${CLUSTER_RUN_PUSH_PATH}`;
    if (this.#closed || !URL.canParse(url)) return;
    const target = new URL(url);
    const until = this.#postUntil.get(target.origin);
    if (until !== undefined && Date.now() < until) return;
    if (this.#channels.has(target.origin) || this.#channels.size >= PEER_PUSH_MAX_CHANNELS) return;
    this.#connect(target.origin, target);
  }

  /** Close every channel; pushes still waiting fail, later ones go as POSTs. */
  close(): void {
    this.#closed = true;
    for (const ch of this.#channels.values()) ch.ws.terminate();
  }

  #connect(origin: string, target: URL): Channel {
    const wsUrl = `${target.protocol === "https:" ? "wss:" : "ws:"}//${target.host}${CLUSTER_RUN_PUSH_PATH}`;
    const ws = new WebSocket(wsUrl, {
      headers: signedHeaders(this.key, EMPTY),
      handshakeTimeout: PEER_PUSH_CONNECT_TIMEOUT_MS,
      maxPayload: PEER_PUSH_HEADER_MAX_BYTES + PEER_PUSH_ANSWER_MAX_BYTES,
      perMessageDeflate: false,
      followRedirects: false,
    });
    const idle = setTimeout(() => ws.close(1000, "idle"), PEER_PUSH_IDLE_MS);
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
    this.#channels.set(origin, ch);
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
      this.log.debug({ peer: origin, status: res.statusCode }, "peer refused the push channel; pushing by POST");
      res.resume();
      ws.terminate();
    });
    ws.on("error", (err) => {
      this.log.debug({ peer: origin, err: err.message }, "push channel to a peer failed");
    });
    ws.on("close", () => {
      clearTimeout(idle);
      if (this.#channels.get(origin) === ch) this.#channels.delete(origin);
      if (!ch.open) {
        this.#postUntil.set(origin, Date.now() + PEER_PUSH_RETRY_MS);
        if (this.#postUntil.size > PEER_PUSH_MAX_CHANNELS) {
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
    if (ch.ws.bufferedAmount + body.length > PEER_PUSH_MAX_BUFFERED_BYTES) {
      resolve({ kind: "failed", sent: false, code: "busy" });
      return;
    }
    const id = ch.nextId++;
    this.counts.pushes_by_channel += 1;
    const sentAt = performance.now();
    const timer = setTimeout(() => {
      ch.waiting.delete(id);
      resolve({ kind: "failed", sent: true, code: "timeout" });
      // Nothing came back since this push left: the channel (or the peer) is stuck; make a new one.
      if (ch.heardAt < sentAt) ch.ws.terminate();
    }, timeoutMs);
    ch.waiting.set(id, { resolve, timer, max });
    ch.ws.send(Buffer.concat([Buffer.from(`${id} ${header}\n`, "utf8"), body]), { binary: false });
  }

  #answered(ch: Channel, data: Buffer): void {
    const nl = data.indexOf(10);
    const head = nl < 0 ? null : ANSWER_HEADER.exec(data.subarray(0, nl).toString("latin1"));
    const w = head ? ch.waiting.get(Number(head[1])) : undefined;
    if (!head || !w) return; // not an answer to a push waiting here (timed out): nothing to do
    ch.waiting.delete(Number(head[1]));
    clearTimeout(w.timer);
    const text = data.subarray(nl + 1);
    if (text.length > w.max) w.resolve({ kind: "failed", sent: true, code: "body_too_large" });
    else w.resolve({ kind: "answered", status: Number(head[2]), text: text.toString("utf8") });
  }
}

/** The follower's side: channels from holders, each push verified and taken as a POST's would be. */
export class PeerPushEndpoint {
  readonly #wss = new WebSocketServer({
    noServer: true,
    maxPayload: PEER_PUSH_HEADER_MAX_BYTES + CLUSTER_MAX_BODY_BYTES,
    perMessageDeflate: false,
    clientTracking: true,
  });

  constructor(
    private readonly key: Buffer,
    private readonly apply: ApplyRunPush,
    private readonly log: Logger,
  ) {}

  /**
   * An upgrade of `GET CLUSTER_RUN_PUSH_PATH`. Refused, with the connection closed: 401 as a cluster
   * request's signature (over an empty body), 503 past PEER_PUSH_MAX_CONNECTIONS channels.
   */
  handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const refusal = signatureRefusal(
      this.key,
      req.headers[CLUSTER_TIMESTAMP_HEADER],
      req.headers[CLUSTER_SIGNATURE_HEADER],
      EMPTY,
    );
    if (refusal !== null) {
      if (refusal.error === "bad_signature") {
        this.log.warn({ remote: req.socket.remoteAddress ?? "?" }, "push channel with a wrong signature refused");
      }
      refuseUpgrade(socket, refusal.status, refusal.error, refusal.message);
      return;
    }
    if (this.#wss.clients.size >= PEER_PUSH_MAX_CONNECTIONS) {
      refuseUpgrade(socket, 503, "too_many_channels", `at most ${PEER_PUSH_MAX_CONNECTIONS} push channels`);
      return;
    }
    this.#wss.handleUpgrade(req, socket, head, (ws) => this.#serve(ws));
  }

  /** Close every channel (the instance stops). */
  close(): void {
    for (const ws of this.#wss.clients) ws.terminate();
    this.#wss.close();
  }

  #serve(ws: WebSocket): void {
    // Answers wait until the observers a push woke have answered their callers (see `afterWoken`), then go
    // out together; there are at most as many as pushes in flight from that holder.
    const answers: string[] = [];
    const flush = () => {
      for (const a of answers.splice(0)) if (ws.readyState === WebSocket.OPEN) ws.send(a);
    };
    ws.on("error", (err) => this.log.debug({ err: err.message }, "push channel from a peer failed"));
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      const nl = isBinary ? -1 : data.indexOf(10);
      const head =
        nl < 0 || nl > PEER_PUSH_HEADER_MAX_BYTES ? null : PUSH_HEADER.exec(data.subarray(0, nl).toString("latin1"));
      if (!head) {
        // Without its id no answer can be matched: the sender is not one of ours.
        ws.close(1008, "a push is a text message: <id> <timestamp> <signature>, a newline, the body");
        return;
      }
      const [, id, timestamp, signature] = head;
      const body = data.subarray(nl + 1);
      const refusal = signatureRefusal(this.key, timestamp, signature, body);
      let status: number;
      let answer: object;
      if (refusal !== null) {
        if (refusal.error === "bad_signature") this.log.warn("pushed update with a wrong signature refused");
        ({ status } = refusal);
        answer = { error: refusal.error, message: refusal.message };
      } else ({ status, answer } = takeRunPush(body, this.apply));
      answers.push(`${id} ${status}\n${JSON.stringify(answer)}`);
      if (answers.length === 1) afterWoken(flush);
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
  const reason = status === 401 ? "Unauthorized" : "Service Unavailable";
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nConnection: close\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
}
