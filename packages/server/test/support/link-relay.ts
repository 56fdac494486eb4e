/**
 * A TCP relay between a real Runner and the Server, for the link tests that need to act on the network in
 * between: hold new connections back (`gated`, then `release()`), or cut the Runner's side of the live
 * ones while the Server's side stays open and silent (`cutRunnerSide()`, a blip only the Runner sees).
 * Otherwise it forwards both ways and a close on one side closes the other. 127.0.0.1 only.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { connect, createServer, type Server, type Socket } from "node:net";
import { join } from "node:path";
import type { ProcStack } from "./proc-stack.js";

interface Pair {
  runner: Socket;
  server: Socket;
  /** The Runner's side was cut on purpose: its close must not close the Server's side. */
  cut: boolean;
}

export class LinkRelay {
  readonly #server: Server;
  readonly #pairs: Pair[] = [];
  readonly #held: Socket[] = [];
  /** While true, new connections are accepted and held, not forwarded. */
  gated = false;
  port = 0;

  constructor(readonly target: number) {
    this.#server = createServer((runner) => {
      runner.on("error", () => {});
      if (this.gated) {
        runner.pause();
        this.#held.push(runner);
      } else this.#forward(runner);
    });
  }

  /**
   * A relay in front of `s`'s Server that Runner `runnerId` dials from now on (its config file is
   * rewritten; start the Runner after this).
   */
  static async inFrontOf(s: ProcStack, runnerId: string): Promise<LinkRelay> {
    const relay = await new LinkRelay(s.port).listen();
    const cfg = join(s.dir, `runner-${runnerId}.toml`);
    writeFileSync(cfg, readFileSync(cfg, "utf8").replace(`127.0.0.1:${s.port}/`, `127.0.0.1:${relay.port}/`));
    return relay;
  }

  #forward(runner: Socket): void {
    const server = connect(this.target, "127.0.0.1");
    const pair: Pair = { runner, server, cut: false };
    server.on("error", () => runner.destroy());
    runner.on("close", () => {
      if (!pair.cut) server.destroy();
    });
    server.on("close", () => runner.destroy());
    runner.pipe(server);
    server.pipe(runner);
    this.#pairs.push(pair);
  }

  async listen(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, "127.0.0.1", () => r()));
    this.port = (this.#server.address() as { port: number }).port;
    return this;
  }

  /** Let the held connections (those the Runner has not given up on) and every later one through. */
  release(): void {
    this.gated = false;
    for (const s of this.#held.splice(0)) if (!s.destroyed) this.#forward(s);
  }

  /**
   * A network blip seen by the Runner only: its side of every relayed connection is cut, the Server's
   * side stays open and silent, so the Server still holds the old link as alive.
   */
  cutRunnerSide(): void {
    for (const p of this.#pairs.splice(0)) {
      p.cut = true;
      p.server.unpipe();
      p.runner.unpipe();
      p.runner.destroy();
    }
  }

  close(): Promise<void> {
    for (const p of this.#pairs.splice(0)) {
      p.runner.destroy();
      p.server.destroy();
    }
    for (const s of this.#held.splice(0)) s.destroy();
    return new Promise((r) => this.#server.close(() => r()));
  }
}
