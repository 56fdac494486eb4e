/**
 * One Runner's WebSocket connection as the hub (link/hub.ts) holds it: sending frames under the
 * send-buffer bound, requests correlated with their responses by request_id (bounded time, a
 * bounded number in flight), the heartbeat's liveness mark, and closing. What it may hold is set
 * by the hub (`ConnectionLimits`); deciding which connection is the live one is the hub's.
 */
import {
  encodeFrame,
  type HelloFrame,
  type ProtocolErrorCode,
  type RunApplyFrame,
  type RunCancelFrame,
  type RunChangesFrame,
  type RunnerResponse,
  type RunStartFrame,
  type RunSyncFrame,
  type ServerFrame,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import type { WebSocket } from "ws";

export type RunnerRequest =
  | Omit<RunStartFrame, "request_id">
  | Omit<RunSyncFrame, "request_id">
  | Omit<RunCancelFrame, "request_id">
  | Omit<RunChangesFrame, "request_id">
  | Omit<RunApplyFrame, "request_id">;

export type RequestOutcome =
  | { ok: true; frame: RunnerResponse }
  /**
   * `not_sent`: the frame never left (connection closed or unwritable) — safe to treat as not delivered.
   * `busy`: too many requests in flight — not sent. `timeout` / `closed`: sent, answer unknown.
   */
  | { ok: false; reason: "timeout" | "closed" | "busy" | "not_sent" };

const EXPECTED_RESULT: Record<RunnerRequest["type"], RunnerResponse["type"]> = {
  "run.start": "run.start.result",
  "run.sync": "run.sync.result",
  "run.cancel": "run.cancel.result",
  "run.changes": "run.changes.result",
  "run.apply": "run.apply.result",
};

/** The hub's bounds a connection applies (link/hub.ts HubOptions). */
export interface ConnectionLimits {
  /** A connection whose unsent bytes exceed this is closed. */
  readonly maxBufferedBytes: number;
  /** A request's answer is waited for at most this long by default. */
  readonly requestTimeoutMs: number;
  /** Requests in flight at once; one more is refused (`busy`). */
  readonly maxInFlight: number;
}

let connCounter = 0;

export class RunnerConnection {
  readonly id = ++connCounter;
  hello: HelloFrame | null = null;
  /** A hello arrived on this connection (it is being decided, or was). */
  helloReceived = false;
  /** The link lease this connection holds (`<instance id>/<link number>`, link/leases.ts), once granted. */
  leaseHolderId: string | null = null;
  /** Date.now() of the last frame or pong from the Runner. */
  lastHeardAt = Date.now();
  #closed = false;
  #alive = true;
  #seq = 0;
  readonly #pending = new Map<
    string,
    { expect: RunnerResponse["type"]; resolve: (o: RequestOutcome) => void; timer: NodeJS.Timeout }
  >();
  readonly #closedPromise: Promise<void>;
  #resolveClosed!: () => void;

  constructor(
    readonly runnerId: string,
    /** sha256 of the token this connection authenticated with. */
    readonly tokenHash: Buffer,
    readonly remote: string,
    readonly ws: WebSocket,
    private readonly hub: ConnectionLimits,
    private readonly log: Logger,
  ) {
    this.#closedPromise = new Promise((r) => {
      this.#resolveClosed = r;
    });
  }

  get closed(): boolean {
    return this.#closed;
  }
  get whenClosed(): Promise<void> {
    return this.#closedPromise;
  }
  get inFlight(): number {
    return this.#pending.size;
  }

  markAlive(): void {
    this.#alive = true;
    this.lastHeardAt = Date.now();
  }

  /**
   * Called by the heartbeat timer: false when the peer missed the last ping (only when `judge`: a late tick
   * pings without judging, see link/hub.ts HEARTBEAT_LATE_TICK_INTERVALS).
   */
  beat(judge = true): boolean {
    if (judge && !this.#alive) return false;
    this.#alive = false;
    try {
      this.ws.ping();
    } catch {
      return false;
    }
    return true;
  }

  send(frame: ServerFrame): boolean {
    if (this.#closed) return false;
    if (this.ws.bufferedAmount > this.hub.maxBufferedBytes) {
      this.log.warn({ runner_id: this.runnerId, buffered: this.ws.bufferedAmount }, "runner is not reading; closing");
      this.close(1008, "send buffer full");
      return false;
    }
    try {
      this.ws.send(encodeFrame(frame));
      return true;
    } catch (err) {
      this.log.warn({ runner_id: this.runnerId, err: (err as Error).message }, "send to runner failed");
      return false;
    }
  }

  request(req: RunnerRequest, timeoutMs = this.hub.requestTimeoutMs): Promise<RequestOutcome> {
    if (this.#closed || this.hello === null) return Promise.resolve({ ok: false, reason: "not_sent" });
    if (this.#pending.size >= this.hub.maxInFlight) return Promise.resolve({ ok: false, reason: "busy" });
    const requestId = `r${this.id}_${++this.#seq}`;
    return new Promise<RequestOutcome>((resolve) => {
      const timer = setTimeout(() => {
        this.#pending.delete(requestId);
        resolve({ ok: false, reason: "timeout" });
      }, timeoutMs);
      timer.unref();
      this.#pending.set(requestId, { expect: EXPECTED_RESULT[req.type], resolve, timer });
      if (!this.send({ ...req, request_id: requestId } as ServerFrame)) {
        clearTimeout(timer);
        this.#pending.delete(requestId);
        resolve({ ok: false, reason: "not_sent" });
      }
    });
  }

  /** Resolve a pending request; false when the response's type does not match its request. */
  settle(frame: RunnerResponse): boolean {
    const pending = this.#pending.get(frame.request_id);
    if (!pending) {
      this.log.debug({ runner_id: this.runnerId, type: frame.type }, "late or unknown response ignored");
      return true;
    }
    if (frame.type !== "error" && frame.type !== pending.expect) return false;
    clearTimeout(pending.timer);
    this.#pending.delete(frame.request_id);
    pending.resolve({ ok: true, frame });
    return true;
  }

  /** Tell the peer why and close. `logged`: the caller already logged it (rate-limited), so no line here. */
  protocolError(code: ProtocolErrorCode, message: string, logged = false): void {
    if (!logged) {
      this.log.warn({ runner_id: this.runnerId, code, reason: message }, "runner protocol error; closing connection");
    }
    this.send({ type: "protocol_error", code, message: message.slice(0, 500) });
    this.close(1008, code);
  }

  close(code = 1000, reason = "closing"): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const [id, p] of this.#pending) {
      clearTimeout(p.timer);
      p.resolve({ ok: false, reason: "closed" });
      this.#pending.delete(id);
    }
    try {
      this.ws.close(code, reason);
    } catch {
      // already closing
    }
    // A peer that never completes the close handshake is cut off.
    const t = setTimeout(() => this.ws.terminate(), 2000);
    t.unref();
    this.#resolveClosed();
  }

  /** Mark closed after the socket went away by itself. */
  onSocketClosed(): void {
    this.close(1000, "closed");
  }
}
