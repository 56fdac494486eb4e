/**
 * A TCP proxy between a Runner and the Server for link-loss tests. In `pass`
 * mode it forwards both ways. `cutAfterNextRunStart()` lets the next
 * `run.start` frame reach the Runner and then cuts the link: the Runner's
 * answer is dropped and both sockets are destroyed, so the Server is left
 * with a start whose outcome it does not know (`sent`). `down()` refuses
 * connections until `up()`. Server→Runner frames are unmasked and
 * uncompressed (the Runner disables permessage-deflate), so the frame type
 * is visible in the bytes.
 */
import { createConnection, createServer, type Server, type Socket } from "node:net";

export class CutProxy {
  readonly #server: Server;
  readonly #pairs = new Set<[Socket, Socket]>();
  #targetPort = 0;
  #down = false;
  #cutArmed = false;
  /** Resolves when an armed cut happened. */
  cutDone: Promise<void> = Promise.resolve();
  #markCut: () => void = () => {};
  port = 0;

  constructor() {
    this.#server = createServer((runnerSide) => this.#accept(runnerSide));
  }

  async listen(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, "127.0.0.1", () => r()));
    this.port = (this.#server.address() as { port: number }).port;
    return this;
  }

  set targetPort(port: number) {
    this.#targetPort = port;
  }

  cutAfterNextRunStart(): void {
    this.#cutArmed = true;
    this.cutDone = new Promise((r) => {
      this.#markCut = r;
    });
  }

  /** Refuse new connections and drop the live ones. */
  down(): void {
    this.#down = true;
    for (const [a, b] of this.#pairs) {
      a.destroy();
      b.destroy();
    }
    this.#pairs.clear();
  }

  up(): void {
    this.#down = false;
  }

  #accept(runnerSide: Socket): void {
    if (this.#down || this.#targetPort === 0) {
      runnerSide.destroy();
      return;
    }
    const serverSide = createConnection({ host: "127.0.0.1", port: this.#targetPort });
    const pair: [Socket, Socket] = [runnerSide, serverSide];
    this.#pairs.add(pair);
    let cut = false;
    const close = () => {
      this.#pairs.delete(pair);
      runnerSide.destroy();
      serverSide.destroy();
    };
    runnerSide.on("data", (chunk: Buffer) => {
      if (!cut) serverSide.write(chunk);
    });
    serverSide.on("data", (chunk: Buffer) => {
      if (cut) return;
      if (this.#cutArmed && chunk.includes('"type":"run.start"')) {
        this.#cutArmed = false;
        cut = true;
        // The Runner gets the run.start; the Server never gets the answer.
        serverSide.destroy();
        runnerSide.end(chunk, () => setTimeout(close, 200));
        this.#markCut();
        return;
      }
      runnerSide.write(chunk);
    });
    runnerSide.on("error", close);
    serverSide.on("error", close);
    runnerSide.on("close", close);
    serverSide.on("close", () => {
      if (!cut) close();
    });
  }

  async close(): Promise<void> {
    this.down();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}
