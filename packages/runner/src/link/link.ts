/**
 * The Runner's side of the Server link (design §5).
 *
 * Entry point, used by commands/daemon.ts after recovery:
 *
 *   startLink({ url, token, service, logger, ...tuning }) => { close(): Promise<void>, connected }
 *
 * - connects to `url` (ws://host:port/runner) with `Authorization: Bearer <token>`;
 * - sends `hello` (service.helloBody() + inventory) on every connection and
 *   waits for `hello.ack`; reconnects with jittered exponential backoff;
 * - answers run.start / run.sync / run.cancel through the RunService only
 *   (it never sees ACP, processes or the store). There is no run.inventory
 *   request: the hello carries the inventory, and the Server asks for a run
 *   left out of it with run.sync;
 * - pushes `run.update` frames as the service reports changes, through a
 *   bounded send queue: when the queue is full it stops pushing that run's
 *   events, and once the queue drains sends one state-only update so the
 *   Server re-syncs by seq. The service's listener never blocks;
 * - heartbeats: answers the Server's pings (ws does), sends `heartbeat`
 *   frames and drops a connection that has been silent for three intervals.
 *
 * Hello and every reply are checked against the protocol schema before they
 * are sent: an inventory row the Server would reject is dropped (and logged),
 * an invalid reply becomes an `error` frame — never a frame that makes the
 * Server close the link and the Runner reconnect with the same bad frame.
 *
 * Link resumption (design §5): `hello.ack` carries a resume secret, kept in
 * memory and sent in every later hello of this process, so a reconnect
 * after a network blip takes over the link the Server may still think alive.
 * With a `resumeStore` (link/resume.ts: no agent runs as the Runner's user)
 * it is also kept in the state dir and presented by the next start, so a
 * Runner restarting after its own crash takes its link back at once.
 * A `link_in_use` refusal (another connection holds the link: this Runner was
 * restarted without the secret, or someone else has its token) is retried at
 * a short, bounded pace until the old link is declared dead, and logged once
 * with the reason, not once per retry.
 *
 * Files: this one is the connection (connect, hello, heartbeat, reconnect,
 * inbound frames); the answers to requests are link/requests.ts, the hello's
 * inventory link/inventory.ts, the bounded send queue link/send-queue.ts.
 *
 * The token and the resume secret are never logged.
 */

import { rootCertificates } from "node:tls";
import {
  describeFirstIssue,
  type HelloFrame,
  isLoopbackHost,
  MAX_FRAME_BYTES,
  PROTOCOL_VERSION,
  type ProtocolErrorCode,
  parseServerFrame,
  RunnerFrame,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import WebSocket from "ws";
import type { RunService } from "../runs/service.js";
import { RUNNER_VERSION } from "../version.js";
import { inventoryFor } from "./inventory.js";
import { answerRequest, type Request } from "./requests.js";
import type { ResumeSecretStore } from "./resume.js";
import { SendQueue } from "./send-queue.js";

export { fitInventory } from "./inventory.js";
export { chunkUpdate } from "./send-queue.js";

export interface LinkOptions {
  /** ws:// or wss:// URL of the Server's /runner endpoint. */
  url: string;
  /** The Runner's bearer token (from [server] token_env or token_file). */
  token: string;
  /** PEM text of a private CA trusted for wss:// in addition to the system CAs ([server] ca_file). */
  ca?: string;
  /** ws:// to a non-loopback host is refused unless this is true; then every connect warns. */
  allowInsecureTransport?: boolean;
  service: RunService;
  logger: Logger;
  /** Where the resume secret outlives this process; only when no agent runs as the Runner's user. */
  resumeStore?: ResumeSecretStore;
  /** Some agent runs as the Runner's user (`agents_share_runner_user`): the reason a restart waits. */
  agentsShareRunnerUser?: boolean;
  /** First reconnect delay (ms); doubles per failed attempt, with jitter. */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** Time to wait for hello.ack after sending hello. */
  helloTimeoutMs?: number;
  /** Heartbeat interval before the Server's hello.ack says otherwise. */
  heartbeatIntervalMs?: number;
  /** Bounded send queue for run.update frames. */
  sendQueueMaxBytes?: number;
  sendQueueMaxFrames?: number;
}

export interface LinkHandle {
  close(): Promise<void>;
  /** True while a connection has completed hello/hello.ack. */
  readonly connected: boolean;
}

/** After a `link_in_use` refusal the backoff restarts from this attempt (initial delay × 2^n). */
export const LINK_IN_USE_RETRY_ATTEMPT = 2;

/** The Server is taken for gone after this many heartbeat intervals without a frame or ping from it. */
export const SERVER_SILENT_INTERVALS = 3;

/**
 * A heartbeat tick that comes this many intervals (or more) after the one before it found this process's
 * event loop held: it sends its heartbeat but takes nobody for gone.
 */
export const HEARTBEAT_LATE_TICK_INTERVALS = 1.5;

export function startLink(opts: LinkOptions): LinkHandle {
  return new Link(opts);
}

class Link implements LinkHandle {
  readonly #o: Required<
    Omit<
      LinkOptions,
      "service" | "logger" | "url" | "token" | "ca" | "allowInsecureTransport" | "resumeStore" | "agentsShareRunnerUser"
    >
  >;
  /** Trusted CAs for wss:// when [server] ca_file is set: the system's plus that one. */
  readonly #ca: string[] | undefined;
  /** Set when the link runs without TLS to a non-loopback host (explicitly allowed). */
  readonly #insecureHost: string | null;
  readonly #url: string;
  readonly #token: string;
  readonly #service: RunService;
  readonly #log: Logger;
  #ws: WebSocket | null = null;
  #live = false;
  #stopped = false;
  #attempt = 0;
  /** From the last hello.ack (or, at start, the one the resume store kept). */
  #resumeSecret: string | undefined;
  readonly #resumeStore: ResumeSecretStore | undefined;
  readonly #sharedUser: boolean;
  /** Set from the first `link_in_use` refusal until a hello is accepted: later refusals are not logged again. */
  #waitingSince: number | null = null;
  #reconnectTimer: NodeJS.Timeout | null = null;
  #helloTimer: NodeJS.Timeout | null = null;
  #beatTimer: NodeJS.Timeout | null = null;
  #lastHeard = Date.now();
  #intervalMs: number;
  readonly #queue: SendQueue;
  readonly #starts = new Set<Promise<unknown>>();
  readonly #unsubscribe: () => void;

  constructor(opts: LinkOptions) {
    let parsed: URL | null = null;
    try {
      parsed = new URL(opts.url);
    } catch {
      // reported below
    }
    if (!parsed || (parsed.protocol !== "ws:" && parsed.protocol !== "wss:")) {
      throw new TypeError("server url must be a ws:// or wss:// URL");
    }
    this.#insecureHost = parsed.protocol === "ws:" && !isLoopbackHost(parsed.hostname) ? parsed.hostname : null;
    if (this.#insecureHost !== null && opts.allowInsecureTransport !== true) {
      throw new TypeError(
        `refusing ws:// to non-loopback host ${this.#insecureHost}: use wss:// or set [server] allow_insecure_transport = true`,
      );
    }
    this.#ca = opts.ca === undefined ? undefined : [...rootCertificates, opts.ca];
    this.#url = opts.url;
    this.#token = opts.token;
    this.#service = opts.service;
    this.#log = opts.logger.child({ c: "link" });
    this.#resumeStore = opts.resumeStore;
    this.#sharedUser = opts.agentsShareRunnerUser === true;
    this.#resumeSecret = opts.resumeStore?.load();
    this.#o = {
      backoffInitialMs: opts.backoffInitialMs ?? 500,
      backoffMaxMs: opts.backoffMaxMs ?? 30_000,
      helloTimeoutMs: opts.helloTimeoutMs ?? 10_000,
      heartbeatIntervalMs: opts.heartbeatIntervalMs ?? 15_000,
      sendQueueMaxBytes: opts.sendQueueMaxBytes ?? 4 * MAX_FRAME_BYTES,
      sendQueueMaxFrames: opts.sendQueueMaxFrames ?? 1024,
    };
    this.#intervalMs = this.#o.heartbeatIntervalMs;
    this.#queue = new SendQueue({
      log: this.#log,
      current: () => this.#ws,
      live: () => this.#live,
      maxBytes: this.#o.sendQueueMaxBytes,
      maxFrames: this.#o.sendQueueMaxFrames,
    });
    this.#unsubscribe = this.#service.onUpdate((run, events) => this.#queue.onUpdate(run, events));
    this.#connect();
  }

  get connected(): boolean {
    return this.#live;
  }

  // ---- connection lifecycle ---------------------------------------------------

  #connect(): void {
    if (this.#stopped) return;
    this.#reconnectTimer = null;
    if (this.#insecureHost !== null) {
      this.#log.warn(
        { host: this.#insecureHost },
        "INSECURE: connecting with ws:// (no TLS) to a non-loopback host; the token and prompts cross the network " +
          "in clear text (allow_insecure_transport = true)",
      );
    }
    const ws = new WebSocket(this.#url, {
      headers: { authorization: `Bearer ${this.#token}` },
      ...(this.#ca ? { ca: this.#ca } : {}),
      maxPayload: MAX_FRAME_BYTES,
      handshakeTimeout: this.#o.helloTimeoutMs,
      perMessageDeflate: false,
    });
    this.#ws = ws;
    this.#live = false;
    ws.on("unexpected-response", (_req, res) => {
      this.#log.warn({ status: res.statusCode }, "server refused the runner link (check the runner token)");
      res.resume();
      ws.terminate();
    });
    ws.on("open", () => void this.#sendHello(ws));
    ws.on("ping", () => {
      this.#lastHeard = Date.now();
    });
    ws.on("message", (data, isBinary) => {
      if (ws !== this.#ws) return;
      this.#lastHeard = Date.now();
      this.#onMessage(ws, data, isBinary);
    });
    ws.on("error", (err) => {
      // A certificate the Runner does not trust is an operator problem worth a warning, not a debug line.
      const code = (err as NodeJS.ErrnoException).code ?? "";
      if (/CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS/.test(code)) {
        this.#log.warn({ code }, "the server's TLS certificate is not trusted (set [server] ca_file for a private CA)");
      } else this.#log.debug({ err: err.message }, "link socket error");
    });
    ws.on("close", (code) => {
      if (ws !== this.#ws) return;
      const wasLive = this.#live;
      this.#teardown();
      if (this.#stopped) return;
      if (this.#waitingSince !== null && !wasLive) this.#log.debug({ code }, "link refused; retrying");
      else this.#log.info({ code, was_live: wasLive }, "link closed; reconnecting");
      this.#scheduleReconnect();
    });
  }

  #teardown(): void {
    this.#live = false;
    this.#ws = null;
    this.#queue.reset();
    if (this.#helloTimer) clearTimeout(this.#helloTimer);
    if (this.#beatTimer) clearInterval(this.#beatTimer);
    this.#helloTimer = null;
    this.#beatTimer = null;
  }

  #scheduleReconnect(): void {
    const ceiling = Math.min(this.#o.backoffMaxMs, this.#o.backoffInitialMs * 2 ** Math.min(this.#attempt, 20));
    const delay = Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
    this.#attempt++;
    this.#reconnectTimer = setTimeout(() => this.#connect(), delay);
  }

  async #sendHello(ws: WebSocket): Promise<void> {
    // A run.start still being admitted must be in the inventory this hello carries.
    if (this.#starts.size > 0) {
      await Promise.race([Promise.allSettled([...this.#starts]), new Promise((r) => setTimeout(r, 5000))]);
    }
    if (ws !== this.#ws || ws.readyState !== WebSocket.OPEN) return;
    let hello: HelloFrame;
    try {
      const base: HelloFrame = {
        type: "hello",
        protocol_version: PROTOCOL_VERSION,
        ...this.#service.helloBody(),
        runner_version: RUNNER_VERSION,
        inventory: [],
        ...(this.#resumeSecret !== undefined ? { resume_secret: this.#resumeSecret } : {}),
      };
      hello = { ...base, inventory: inventoryFor(this.#service, this.#log, base) };
    } catch (err) {
      this.#log.error({ err: (err as Error).message }, "building hello failed");
      ws.close(1011, "hello failed");
      return;
    }
    this.#invalid(hello); // logged; nothing better to send than the Runner's own description
    this.#queue.rawSend(ws, hello);
    this.#helloTimer = setTimeout(() => {
      if (!this.#live) {
        this.#log.warn("no hello.ack from the server in time; reconnecting");
        ws.terminate();
      }
    }, this.#o.helloTimeoutMs);
  }

  #startHeartbeat(ws: WebSocket): void {
    if (this.#beatTimer) clearInterval(this.#beatTimer);
    this.#lastHeard = Date.now();
    let lastTick = Date.now();
    this.#beatTimer = setInterval(() => {
      if (ws !== this.#ws) return;
      const now = Date.now();
      // A late tick means this process's own event loop was held: what the Server sent may be waiting unread
      // behind this timer (timers run before I/O), so this round judges nothing.
      const judge = now - lastTick < HEARTBEAT_LATE_TICK_INTERVALS * this.#intervalMs;
      lastTick = now;
      if (judge && now - this.#lastHeard > SERVER_SILENT_INTERVALS * this.#intervalMs) {
        this.#log.warn("server silent for three heartbeat intervals; reconnecting");
        ws.terminate();
        return;
      }
      this.#queue.rawSend(ws, { type: "heartbeat", sent_at: new Date().toISOString() });
    }, this.#intervalMs);
  }

  // ---- inbound ------------------------------------------------------------------

  #onMessage(ws: WebSocket, data: WebSocket.RawData, isBinary: boolean): void {
    if (isBinary) {
      this.#protocolError(ws, "invalid_frame", "binary frames are not allowed");
      return;
    }
    const text = Array.isArray(data)
      ? Buffer.concat(data).toString("utf8")
      : Buffer.from(data as ArrayBuffer).toString("utf8");
    const parsed = parseServerFrame(text);
    if (!parsed.ok) {
      this.#protocolError(ws, parsed.error.code, parsed.error.message);
      return;
    }
    const frame = parsed.frame;
    if (!this.#live && frame.type !== "hello.ack" && frame.type !== "protocol_error") {
      this.#protocolError(ws, "unexpected_frame", `expected hello.ack, got ${frame.type}`);
      return;
    }
    switch (frame.type) {
      case "hello.ack":
        if (this.#live) {
          this.#protocolError(ws, "unexpected_frame", "duplicate hello.ack");
          return;
        }
        if (this.#helloTimer) clearTimeout(this.#helloTimer);
        this.#live = true;
        this.#attempt = 0;
        if (frame.resume_secret !== this.#resumeSecret) this.#resumeStore?.save(frame.resume_secret);
        this.#resumeSecret = frame.resume_secret;
        this.#intervalMs = frame.heartbeat_interval_ms;
        this.#startHeartbeat(ws);
        this.#log.info(
          {
            runner_id: frame.runner_id,
            server_instance_id: frame.server_instance_id,
            ...(this.#waitingSince !== null ? { waited_ms: Date.now() - this.#waitingSince } : {}),
          },
          "link established",
        );
        this.#waitingSince = null;
        return;
      case "heartbeat":
        return;
      case "protocol_error":
        if (frame.code === "link_in_use") {
          this.#onLinkInUse();
          // Another connection holds the link: retry at a short pace, it is declared dead within the heartbeat timeout.
          this.#attempt = Math.min(this.#attempt, LINK_IN_USE_RETRY_ATTEMPT);
          ws.close(1000, "peer protocol error");
          return;
        }
        this.#log.warn({ code: frame.code, reason: frame.message }, "server reported a protocol error");
        if (frame.code === "unauthorized_project") this.#attempt = Math.max(this.#attempt, 10);
        if (frame.code === "token_revoked") {
          this.#log.error("the server rotated this runner's token; restart the Runner with its new token");
          this.#attempt = Math.max(this.#attempt, 10);
        }
        ws.close(1000, "peer protocol error");
        return;
      case "run.start":
      case "run.sync":
      case "run.cancel":
      case "run.changes":
      case "run.apply":
        this.#onRequest(ws, frame);
        return;
      default: {
        const never: never = frame;
        this.#protocolError(ws, "unexpected_frame", `unknown frame ${(never as { type: string }).type}`);
      }
    }
  }

  /** The first `link_in_use` refusal of a wait is one warn line with the reason; the retries are debug. */
  #onLinkInUse(): void {
    if (this.#waitingSince !== null) {
      this.#log.debug("link still in use on the Server; retrying");
      return;
    }
    this.#waitingSince = Date.now();
    const reason =
      this.#resumeSecret !== undefined
        ? "the Server refused this Runner's resume secret: another connection holds this runner's link (a process " +
          "with its token?) or the secret is no longer the link's"
        : this.#sharedUser
          ? "the Server still holds this runner's previous link (an unclean stop, or another process with its " +
            "token); its agents run as the Runner's user (agents_share_runner_user), so no resume secret is kept " +
            "across restarts"
          : "the Server still holds this runner's previous link (an unclean stop, or another process with its " +
            "token) and this Runner has no resume secret for it";
    this.#log.warn(
      { code: "link_in_use" },
      `${reason}; retrying until the Server declares that link dead (at most two of its heartbeat intervals ` +
        "after it last heard from it); further refusals are not logged",
    );
  }

  #onRequest(ws: WebSocket, req: Request): void {
    const rid = req.request_id;
    const reply = (frame: RunnerFrame) => {
      if (ws !== this.#ws || ws.readyState !== WebSocket.OPEN) {
        this.#log.debug({ type: frame.type }, "reply dropped: connection changed");
        return;
      }
      // A reply that cannot be sent must still answer the request, or the Server waits for nothing.
      if (this.#invalid(frame) || (!this.#queue.rawSend(ws, frame) && frame.type !== "error")) {
        this.#queue.rawSend(ws, {
          type: "error",
          request_id: rid,
          code: "internal",
          message: "The Runner could not encode the reply.",
        });
      }
    };
    const internal = (err: unknown) => {
      this.#log.error({ type: req.type, err: (err as Error)?.message }, "run service failed a request");
      reply({ type: "error", request_id: rid, code: "internal", message: "The Runner failed to process the request." });
    };
    answerRequest(req, rid, { service: this.#service, starts: this.#starts, reply, internal });
  }

  /** True (and logged with the frame type and first bad path) when the frame violates the protocol schema. */
  #invalid(frame: RunnerFrame): boolean {
    const checked = RunnerFrame.safeParse(frame);
    if (checked.success) return false;
    const { path } = describeFirstIssue(checked.error);
    this.#log.error({ type: frame.type, path }, "outgoing frame violates the protocol");
    return true;
  }

  #protocolError(ws: WebSocket, code: ProtocolErrorCode, message: string): void {
    this.#log.warn({ code, reason: message }, "protocol error from the server's side; closing link");
    this.#queue.rawSend(ws, { type: "protocol_error", code, message: message.slice(0, 500) });
    ws.close(1008, code);
  }

  async close(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    this.#unsubscribe();
    if (this.#reconnectTimer) clearTimeout(this.#reconnectTimer);
    const ws = this.#ws;
    this.#teardown();
    if (!ws) return;
    await new Promise<void>((resolve) => {
      if (ws.readyState === WebSocket.CLOSED) return resolve();
      const t = setTimeout(() => {
        ws.terminate();
        resolve();
      }, 2000);
      ws.once("close", () => {
        clearTimeout(t);
        resolve();
      });
      if (ws.readyState === WebSocket.CONNECTING) ws.terminate();
      else ws.close(1000, "runner stopping");
    });
  }
}
