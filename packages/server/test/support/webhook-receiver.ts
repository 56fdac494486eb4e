/**
 * A real HTTP webhook receiver on 127.0.0.1 for the webhook tests: it keeps every request (headers and
 * body) and answers each with the status `answer` picks (default 200). Verification is the test's, with the
 * `standardwebhooks` package, as a real receiver does it.
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo, Socket } from "node:net";

/** Bytes of one request body the receiver keeps at most (the Server's bodies are far smaller). */
const MAX_BODY_BYTES = 64 * 1024;

/** The status `answer` returns for a request the receiver never answers. */
export const HOLD = 0;

export interface Received {
  headers: Record<string, string>;
  body: string;
  /** The status the receiver answered (HOLD: none). */
  status: number;
  /** The sender's port of the request's connection (socket-owner.ts finds its process while it is open). */
  remotePort: number;
}

export class WebhookReceiver {
  readonly received: Received[] = [];
  #server: Server | null = null;
  url = "";

  /**
   * `answer` picks each request's status; `delayMs` how long the receiver waits before sending it (default
   * none): an attempt stays in flight that long, so a test can kill its sender meanwhile.
   */
  constructor(
    private answer: (req: Received, index: number) => number = () => 200,
    private readonly delayMs: (index: number) => number = () => 0,
  ) {}

  async start(path = "/hook"): Promise<this> {
    const server = createServer((req, res) => {
      void read(req).then((body) => {
        const headers: Record<string, string> = {};
        for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") headers[k] = v;
        const entry: Received = { headers, body, status: 0, remotePort: req.socket.remotePort ?? 0 };
        const index = this.received.length;
        entry.status = this.answer(entry, index);
        this.received.push(entry);
        // HOLD: never answered (a receiver that hangs); the connection ends at close().
        if (entry.status === HOLD) return;
        const send = () => res.writeHead(entry.status, { "content-type": "text/plain" }).end("ok");
        const delay = this.delayMs(index);
        if (delay > 0) setTimeout(send, delay).unref();
        else send();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
    this.#server = server;
    this.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}${path}`;
    return this;
  }

  /**
   * `seen` is told of every connection as it is accepted, while its sender surely still holds it open (a
   * request's handler may run after a sender that gave up on it closed it: socket-owner.ts then finds nobody).
   */
  onConnection(seen: (socket: Socket) => void): void {
    this.#server?.on("connection", seen);
  }

  /** Change how later requests are answered. */
  answerWith(answer: (req: Received, index: number) => number): void {
    this.answer = answer;
  }

  async close(): Promise<void> {
    const server = this.#server;
    this.#server = null;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

async function read(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).byteLength;
    if (size > MAX_BODY_BYTES) break;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString("utf8");
}
