/**
 * The `/runner` WebSocket endpoint. Authenticates Runners during the HTTP
 * upgrade (bearer token, compared as sha256 digests in constant time),
 * enforces the closed protocol (first frame `hello`, bounded frames, every
 * frame zod-validated), keeps exactly one live connection per runner id, and
 * correlates requests with responses by request_id with bounded timeouts and a
 * bounded number in flight (each connection's side of that, RunnerConnection,
 * is link/connection.ts).
 *
 * A live link is never silently replaced (link/leases.ts): a newer `hello` for
 * a runner id takes over only with the resume secret its holder got in
 * `hello.ack`, or once the holder is declared dead; otherwise it is refused
 * with `link_in_use`, logged and audited as a possible impersonation. The
 * decision is one transaction on the runner's lease row in the state database
 * (link/lease-store.ts), so it holds across Server instances sharing it; a
 * connection whose lease another instance took is closed (`replaced`) at the
 * next heartbeat. A rotated runner token (link/runner-tokens.ts) closes the
 * links that used the old one.
 *
 * A misbehaving Runner only ever loses its own connection.
 */
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import {
  type HelloFrame,
  MAX_FRAME_BYTES,
  PROTOCOL_VERSION,
  parseRunnerFrame,
  type RunnerFrame,
  type RunUpdateFrame,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import { type WebSocket, WebSocketServer } from "ws";
import type { RunnerBinding } from "../config.js";
import { RefusalLog } from "../refusal-log.js";
import { RunnerConnection } from "./connection.js";
import type { LeaseStore } from "./lease-store.js";
import { type LeaseAcquired, LinkLeases } from "./leases.js";
import { RunnerAuth } from "./runner-auth.js";
import { type LinkAuditRecord, RUNNER_TOKEN_POLL_MS, type RunnerTokenStore } from "./runner-tokens.js";

export { type RequestOutcome, RunnerConnection, type RunnerRequest } from "./connection.js";

export interface HubListener {
  /** A connection completed `hello` and is now the live one for its runner id. */
  onHello(conn: RunnerConnection, hello: HelloFrame): void;
  onUpdate(conn: RunnerConnection, frame: RunUpdateFrame): void;
  /** The live connection of a runner id went away (not called for a replaced connection). */
  onDisconnect(conn: RunnerConnection): void;
}

export interface HubOptions {
  bindings: readonly RunnerBinding[];
  logger: Logger;
  listener: HubListener;
  heartbeatIntervalMs: number;
  serverInstanceId: string;
  helloTimeoutMs?: number;
  requestTimeoutMs?: number;
  maxInFlight?: number;
  /** A connection whose unsent bytes exceed this is closed (a stuck Runner cannot grow our memory). */
  maxBufferedBytes?: number;
  /** Rotated runner tokens and the link audit (state DB); without it, config tokens only and no audit. */
  tokens?: RunnerTokenStore;
  /**
   * Where link leases are decided (the state DB: shared by every Server instance, outliving a restart);
   * this process's memory only without.
   */
  leaseStore?: LeaseStore;
}

/**
 * A connection is declared dead after missing one ping: at most this many heartbeat intervals after it
 * was last heard from. Also how long a runner's link lease outlives an abnormal close.
 */
export const HEARTBEAT_TIMEOUT_INTERVALS = 2;

/**
 * A heartbeat tick that comes this many intervals (or more) after the one before it found this process's
 * event loop held: it pings but declares nobody dead (see the timer in the constructor).
 */
export const HEARTBEAT_LATE_TICK_INTERVALS = 1.5;

/**
 * Refused hellos (`link_in_use`) of one runner are logged once per this window (the rest counted): a Runner
 * waiting out its old link after an unclean stop, or an impostor retrying, is one line, not one per retry.
 * Every refusal is still audited (runner_link_audit).
 */
export const LINK_REFUSAL_LOG_WINDOW_MS = 5 * 60_000;

/** The `link_in_use` refusal's text: the same for every refused hello, with no lease time in it. */
export const LINK_IN_USE_MESSAGE =
  "this runner has a live link and the hello lacks its resume secret; a restarted Runner gets in once the " +
  "Server declares that link dead";

function rejectUpgrade(socket: Duplex, status: number, text: string, extra = ""): void {
  try {
    socket.write(`HTTP/1.1 ${status} ${text}\r\nConnection: close\r\n${extra}Content-Length: 0\r\n\r\n`);
  } finally {
    socket.destroy();
  }
}

export class RunnerHub {
  readonly requestTimeoutMs: number;
  readonly maxInFlight: number;
  readonly maxBufferedBytes: number;
  readonly #opts: HubOptions;
  /** The configured bindings by runner id: a lookup per link each RUNNER_TOKEN_POLL_MS, not a scan per link. */
  readonly #bindingById: ReadonlyMap<string, RunnerBinding>;
  readonly #auth: RunnerAuth;
  readonly #wss: WebSocketServer;
  readonly #live = new Map<string, RunnerConnection>();
  readonly #all = new Set<RunnerConnection>();
  readonly #heartbeat: NodeJS.Timeout;
  readonly #tokenPoll: NodeJS.Timeout | null;
  readonly #leases: LinkLeases;
  readonly #refusals: RefusalLog;
  /** Refused authenticated hellos (`link_in_use`), rate-limited per runner id. */
  readonly #linkRefusals: RefusalLog;
  readonly #log: Logger;
  #closing = false;
  /** A rotation check or a lease write-down still running: the next timer tick skips it. */
  #checkingRotations = false;
  #persisting = false;

  constructor(opts: HubOptions) {
    this.#opts = opts;
    this.#bindingById = new Map(opts.bindings.map((b) => [b.id, b]));
    this.#log = opts.logger;
    this.#auth = new RunnerAuth(opts.bindings, opts.tokens, opts.logger);
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 30_000;
    this.maxInFlight = opts.maxInFlight ?? 256;
    this.maxBufferedBytes = opts.maxBufferedBytes ?? 16 * MAX_FRAME_BYTES;
    this.#wss = new WebSocketServer({ noServer: true, maxPayload: MAX_FRAME_BYTES, clientTracking: false });
    let lastTick = Date.now();
    this.#heartbeat = setInterval(() => {
      const now = Date.now();
      // A tick this late means this process's own event loop was held (load, a long GC): the peers' answers
      // may be waiting unread behind this timer (timers run before I/O), so this round judges nobody.
      const judge = now - lastTick < HEARTBEAT_LATE_TICK_INTERVALS * opts.heartbeatIntervalMs;
      lastTick = now;
      for (const conn of this.#all) {
        if (!conn.beat(judge)) {
          this.#log.warn({ runner_id: conn.runnerId }, "runner missed a heartbeat; terminating connection");
          conn.ws.terminate();
          conn.onSocketClosed();
          continue;
        }
        if (conn.hello) conn.send({ type: "heartbeat", sent_at: new Date().toISOString() });
      }
      void this.#persistLeases();
    }, opts.heartbeatIntervalMs);
    this.#heartbeat.unref();
    this.#refusals = new RefusalLog(opts.logger);
    this.#linkRefusals = new RefusalLog(opts.logger, 1, Date.now, LINK_REFUSAL_LOG_WINDOW_MS);
    // The written-down expiry is rewritten once per heartbeat interval: that interval is its slack.
    this.#leases = new LinkLeases(
      HEARTBEAT_TIMEOUT_INTERVALS * opts.heartbeatIntervalMs,
      Date.now,
      opts.leaseStore,
      opts.serverInstanceId,
      opts.heartbeatIntervalMs,
    );
    this.#tokenPoll = opts.tokens ? setInterval(() => void this.#checkRotations(), RUNNER_TOKEN_POLL_MS) : null;
    this.#tokenPoll?.unref();
    void this.#auth.warnRotated();
  }

  /** Each heartbeat: write the leases' expiries down, and close the links whose lease another instance took. */
  async #persistLeases(): Promise<void> {
    if (this.#persisting) return;
    this.#persisting = true;
    try {
      const lost = await this.#leases.persist();
      for (const runnerId of lost) {
        const conn = this.#live.get(runnerId);
        if (!conn || conn.closed) continue;
        this.#log.warn(
          { runner_id: runnerId, conn: conn.id },
          "this runner's link lease was taken on another Server instance; closing the link held here",
        );
        conn.send({
          type: "protocol_error",
          code: "replaced",
          message: "a newer connection of this runner replaced this one",
        });
        conn.close(1008, "replaced");
      }
    } catch (err) {
      this.#log.error({ err: (err as Error).message }, "runner link leases not written (state DB)");
    } finally {
      this.#persisting = false;
    }
  }

  /** After a rotation: close every connection that authenticated with a token that is no longer its runner's. */
  async #checkRotations(): Promise<void> {
    if (this.#checkingRotations || this.#all.size === 0) return;
    this.#checkingRotations = true;
    let overrides: ReadonlyMap<string, Buffer>;
    try {
      overrides = await this.#auth.overrides();
    } catch (err) {
      this.#log.error({ err: (err as Error).message }, "reading rotated runner tokens failed");
      return;
    } finally {
      this.#checkingRotations = false;
    }
    for (const conn of this.#all) {
      if (conn.closed) continue;
      if (this.#auth.isCurrent(conn.runnerId, conn.tokenHash, overrides)) continue;
      this.#log.warn(
        { runner_id: conn.runnerId, conn: conn.id, remote: conn.remote },
        "runner token rotated; closing the link that used the old token",
      );
      this.#audit({
        runner_id: conn.runnerId,
        event: "closed_token_rotated",
        remote: conn.remote,
        conn: conn.id,
        agent_instance_id: conn.hello?.agent_instance_id ?? null,
      });
      this.#leases.release(conn.runnerId).catch((err: unknown) => this.#leaseError(err));
      conn.protocolError("token_revoked", "this runner's token was rotated; restart the Runner with its new token");
    }
  }

  #audit(entry: LinkAuditRecord): void {
    this.#opts.tokens?.audit(entry).catch((err: unknown) => {
      this.#log.error({ err: (err as Error).message, event: entry.event }, "runner link audit row not written");
    });
  }

  #leaseError(err: unknown): void {
    this.#log.error({ err: (err as Error).message }, "runner link lease not read or written (state DB)");
  }

  /** The live (hello-completed) connection of a runner id. */
  get(runnerId: string): RunnerConnection | undefined {
    const c = this.#live.get(runnerId);
    return c && !c.closed ? c : undefined;
  }

  /**
   * Map a bearer token to its runner id, comparing sha256 digests in constant time against every binding's
   * current token (rotated or configured): link/runner-auth.ts.
   */
  async authenticate(authorization: string | undefined): Promise<{ runnerId: string; tokenHash: Buffer } | null> {
    return await this.#auth.authenticate(authorization);
  }

  handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    void this.#upgrade(req, socket, head);
  }

  async #upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const remote = req.socket.remoteAddress ?? "?";
    let auth: { runnerId: string; tokenHash: Buffer } | null;
    try {
      auth = await this.authenticate(req.headers.authorization);
    } catch (err) {
      this.#log.error({ err: (err as Error).message }, "reading rotated runner tokens failed; upgrade refused");
      rejectUpgrade(socket, 503, "Service Unavailable", "Retry-After: 1\r\n");
      return;
    }
    if (this.#closing || socket.destroyed) {
      socket.destroy();
      return;
    }
    if (auth === null) {
      this.#refusals.refused(
        remote,
        { has_authorization: req.headers.authorization !== undefined },
        "runner upgrade refused: invalid or missing bearer token",
      );
      rejectUpgrade(socket, 401, "Unauthorized", "WWW-Authenticate: Bearer\r\n");
      return;
    }
    const { runnerId, tokenHash } = auth;
    this.#wss.handleUpgrade(req, socket, head, (ws) => this.#accept(runnerId, tokenHash, ws, remote));
  }

  #accept(runnerId: string, tokenHash: Buffer, ws: WebSocket, remote: string): void {
    const log = this.#log.child({ runner_id: runnerId });
    const conn = new RunnerConnection(runnerId, tokenHash, remote, ws, this, log);
    this.#all.add(conn);
    // Debug until its hello is accepted: a flood of refused hellos must not become a flood of log lines.
    log.debug({ remote, conn: conn.id }, "runner connected; waiting for hello");
    const helloTimer = setTimeout(() => {
      if (!conn.hello) conn.protocolError("unexpected_frame", "no hello within the allowed time");
    }, this.#opts.helloTimeoutMs ?? 10_000);
    helloTimer.unref();
    ws.on("pong", () => conn.markAlive());
    ws.on("error", (err) => log.warn({ conn: conn.id, err: err.message }, "runner socket error"));
    ws.on("close", (code) => {
      clearTimeout(helloTimer);
      // The Runner closing its own link cleanly (stopping) ends its lease; anything else lets it run out.
      const clean = !conn.closed && (code === 1000 || code === 1001);
      this.#leases.closed(runnerId, conn, clean).catch((err: unknown) => this.#leaseError(err));
      conn.onSocketClosed();
      this.#all.delete(conn);
      if (conn.hello) log.info({ conn: conn.id, code }, "runner connection closed");
      else log.debug({ conn: conn.id, code }, "runner connection closed before its hello was accepted");
      if (this.#live.get(runnerId) === conn) {
        this.#live.delete(runnerId);
        if (!this.#closing) this.#opts.listener.onDisconnect(conn);
      }
    });
    ws.on("message", (data, isBinary) => {
      if (conn.closed || this.#closing) return; // fenced or closing: nothing it says counts
      conn.markAlive();
      if (isBinary) {
        conn.protocolError("invalid_frame", "binary frames are not allowed");
        return;
      }
      const text = Array.isArray(data)
        ? Buffer.concat(data).toString("utf8")
        : Buffer.from(data as ArrayBuffer).toString("utf8");
      const parsed = parseRunnerFrame(text);
      if (!parsed.ok) {
        conn.protocolError(parsed.error.code, parsed.error.message);
        return;
      }
      try {
        this.#dispatch(conn, parsed.frame, helloTimer);
      } catch (err) {
        log.error({ conn: conn.id, err: (err as Error).message }, "handling a runner frame failed");
        conn.protocolError("invalid_frame", "frame could not be processed");
      }
    });
  }

  #dispatch(conn: RunnerConnection, frame: RunnerFrame, helloTimer: NodeJS.Timeout): void {
    if (conn.hello === null && frame.type !== "hello") {
      conn.protocolError(
        "unexpected_frame",
        conn.helloReceived
          ? `${frame.type} sent before hello.ack; wait for it`
          : `first frame must be hello, got ${frame.type}`,
      );
      return;
    }
    switch (frame.type) {
      case "hello":
        clearTimeout(helloTimer);
        if (conn.helloReceived) {
          conn.protocolError("unexpected_frame", "hello may only be sent once per connection");
          return;
        }
        conn.helloReceived = true;
        this.#onHello(conn, frame).catch((err: unknown) => {
          this.#log.error(
            { runner_id: conn.runnerId, conn: conn.id, err: (err as Error).message },
            "runner hello not decided",
          );
          conn.close(1011, "hello failed");
        });
        return;
      case "run.start.result":
      case "run.sync.result":
      case "run.cancel.result":
      case "run.changes.result":
      case "run.apply.result":
      case "error":
        if (!conn.settle(frame)) conn.protocolError("unexpected_frame", `${frame.type} does not answer its request`);
        return;
      case "run.update":
        this.#opts.listener.onUpdate(conn, frame);
        return;
      case "heartbeat":
        return;
      case "protocol_error":
        this.#log.warn({ runner_id: conn.runnerId, code: frame.code }, "runner reported a protocol error; closing");
        conn.close(1008, "peer protocol error");
        return;
      default: {
        const never: never = frame;
        conn.protocolError("unexpected_frame", `unknown frame ${(never as { type: string }).type}`);
      }
    }
  }

  async #onHello(conn: RunnerConnection, hello: HelloFrame): Promise<void> {
    const binding = this.#bindingById.get(conn.runnerId);
    const allowed = new Set(binding?.projects ?? []);
    const foreign = hello.projects.map((p) => p.project_id).filter((p) => !allowed.has(p));
    if (foreign.length > 0) {
      conn.protocolError(
        "unauthorized_project",
        `runner ${conn.runnerId} is not bound to project(s): ${foreign.slice(0, 8).join(", ")}`,
      );
      return;
    }
    let decision: LeaseAcquired;
    try {
      decision = await this.#leases.acquire(conn.runnerId, conn, hello.resume_secret);
    } catch (err) {
      // Nothing was decided: the Runner reconnects (with backoff) and asks again.
      this.#leaseError(err);
      conn.close(1011, "link lease not decided; retry");
      return;
    }
    if (conn.closed || this.#closing) {
      // Gone while its hello was decided: a held lease runs out from its last word.
      if (decision.kind !== "refuse") {
        await this.#leases.closed(conn.runnerId, conn, false);
      }
      return;
    }
    const audit = {
      runner_id: conn.runnerId,
      remote: conn.remote,
      conn: conn.id,
      agent_instance_id: hello.agent_instance_id,
    };
    if (decision.kind === "refuse") {
      this.#linkRefusals.refused(
        conn.runnerId,
        {
          ...audit,
          live_conn: this.#live.get(conn.runnerId)?.id ?? null,
          presented_secret: hello.resume_secret !== undefined,
          lease_ms: decision.liveForMs,
        },
        "runner hello refused: this runner's link is alive and the hello lacks its resume secret " +
          "(a Runner restarted after an unclean stop waits until the old link is declared dead; otherwise a " +
          "possible impersonation with a leaked runner token, see `webcodex-server runner-token rotate`). " +
          "Further refusals of this runner are counted, not logged, until its hello is accepted",
      );
      this.#audit({ ...audit, event: "link_refused_in_use" });
      // Never when the lease ends: that would tell an impostor when to try.
      conn.protocolError("link_in_use", LINK_IN_USE_MESSAGE, true);
      return;
    }
    const refusedMeanwhile = this.#linkRefusals.forget(conn.runnerId);
    conn.hello = hello;
    conn.leaseHolderId = this.#leases.holderIdOf(conn.runnerId, conn) ?? null;
    const previous = this.#live.get(conn.runnerId);
    if (previous && previous !== conn) {
      this.#log.info(
        { runner_id: conn.runnerId, old: previous.id, new: conn.id, how: decision.kind },
        decision.kind === "resume" ? "runner resumed its link on a new connection" : "dead connection replaced",
      );
      previous.send({
        type: "protocol_error",
        code: "replaced",
        message: "a newer connection of this runner replaced this one",
      });
      previous.close(1008, "replaced");
    }
    const secret = decision.secret;
    this.#audit({ ...audit, event: decision.kind === "resume" ? "link_resumed" : "link_granted" });
    this.#live.set(conn.runnerId, conn);
    conn.send({
      type: "hello.ack",
      runner_id: conn.runnerId,
      server_instance_id: this.#opts.serverInstanceId,
      heartbeat_interval_ms: this.#opts.heartbeatIntervalMs,
      resume_secret: secret,
    });
    this.#log.info(
      {
        runner_id: conn.runnerId,
        conn: conn.id,
        remote: conn.remote,
        agent_instance_id: hello.agent_instance_id,
        store_id: hello.store_id,
        providers: hello.providers.length,
        projects: hello.projects.length,
        inventory: hello.inventory.length,
        agents_share_runner_user: hello.agents_share_runner_user ?? null,
        ...(refusedMeanwhile > 0 ? { refused_hellos_not_logged: refusedMeanwhile } : {}),
        protocol_version: PROTOCOL_VERSION,
      },
      "runner hello accepted",
    );
    this.#opts.listener.onHello(conn, hello);
  }

  async close(): Promise<void> {
    this.#closing = true;
    clearInterval(this.#heartbeat);
    if (this.#tokenPoll) clearInterval(this.#tokenPoll);
    // Leases outlive this process: a restarted Server lets only their holders back in until they expire.
    await this.#leases.persist().catch((err: unknown) => this.#leaseError(err));
    const all = [...this.#all];
    for (const c of all) c.close(1001, "server shutting down");
    await Promise.race([Promise.all(all.map((c) => c.whenClosed)), new Promise((r) => setTimeout(r, 1000))]);
    for (const c of all) c.ws.terminate();
    await new Promise<void>((r) => this.#wss.close(() => r()));
  }
}
