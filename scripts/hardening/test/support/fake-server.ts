/**
 * A scripted stand-in for the Server's `/runner` endpoint, for fuzzing a live
 * Runner process: it checks the bearer token, acks every hello, records what
 * each connection receives, and correlates requests it sends by request_id.
 */
import { randomBytes } from "node:crypto";
import type { AddressInfo } from "node:net";
import type WebSocket from "ws";
import { WebSocketServer } from "ws";
import { poll } from "../../../test-support/index.js";

/** Bound on the Runner (re)connecting and saying hello. */
const LIVE_WAIT_MS = 30_000;
/** Time between two looks for a live connection. */
const LIVE_POLL_MS = 10;

export interface RunnerConn {
  ws: WebSocket;
  frames: Array<Record<string, unknown>>;
  hello: Record<string, unknown> | undefined;
  closed: Promise<number>;
  isClosed: boolean;
}

export class FakeServer {
  readonly token = `wcr_${randomBytes(24).toString("base64url")}`;
  readonly conns: RunnerConn[] = [];
  #wss!: WebSocketServer;
  #next = 0;
  url = "";

  async start(): Promise<this> {
    this.#wss = new WebSocketServer({ host: "127.0.0.1", port: 0, maxPayload: 4 * 1024 * 1024 });
    await new Promise((r) => this.#wss.once("listening", r));
    this.url = `ws://127.0.0.1:${(this.#wss.address() as AddressInfo).port}/runner`;
    this.#wss.on("connection", (ws, req) => {
      if (req.headers.authorization !== `Bearer ${this.token}`) {
        ws.terminate();
        return;
      }
      let onClose!: (code: number) => void;
      const conn: RunnerConn = {
        ws,
        frames: [],
        hello: undefined,
        closed: new Promise<number>((r) => {
          onClose = r;
        }),
        isClosed: false,
      };
      ws.on("close", (code) => {
        conn.isClosed = true;
        onClose(code);
      });
      ws.on("error", () => {});
      ws.on("message", (d) => {
        const frame = JSON.parse(String(d)) as Record<string, unknown>;
        conn.frames.push(frame);
        if (frame.type === "hello" && conn.hello === undefined) {
          conn.hello = frame;
          ws.send(
            JSON.stringify({
              type: "hello.ack",
              runner_id: "fuzzed",
              server_instance_id: "fake_server_instance_01",
              heartbeat_interval_ms: 5000,
              resume_secret: randomBytes(32).toString("base64url"),
            }),
          );
        }
      });
      this.conns.push(conn);
    });
    return this;
  }

  /** The newest connection that has said hello and is still open. */
  async live(timeoutMs = LIVE_WAIT_MS): Promise<RunnerConn> {
    return poll(
      () => {
        const c = this.conns.at(-1);
        return c && !c.isClosed && c.hello !== undefined ? c : undefined;
      },
      { timeoutMs, intervalMs: LIVE_POLL_MS, what: "the Runner to (re)connect with a hello" },
    );
  }

  requestId(): string {
    return `fz-${++this.#next}`;
  }

  /** Sends a request frame on `conn` and resolves with the frame answering its request_id (or a protocol_error). */
  async request(
    conn: RunnerConn,
    frame: Record<string, unknown>,
    timeoutMs = 15_000,
  ): Promise<Record<string, unknown>> {
    const request_id = this.requestId();
    const from = conn.frames.length;
    conn.ws.send(JSON.stringify({ ...frame, request_id }));
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      for (let i = from; i < conn.frames.length; i++) {
        const f = conn.frames[i]!;
        if (f.request_id === request_id || f.type === "protocol_error") return f;
      }
      if (conn.isClosed) throw new Error(`connection closed before ${request_id} was answered`);
      if (Date.now() > deadline) throw new Error(`no answer to ${frame.type} ${request_id} within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  close(): Promise<void> {
    for (const c of this.conns) c.ws.terminate();
    return new Promise((r) => this.#wss.close(() => r()));
  }
}
