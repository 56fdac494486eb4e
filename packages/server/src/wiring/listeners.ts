/**
 * The Server's listeners in the teardown list (teardown.ts), in two steps. Stop accepting runs first (a listener
 * is built last): the port is given back and idle connections close, while the connections still in use are
 * closed by the services that own them (the hub's Runner links, the MCP listens, the console's streams, the peer
 * channels). Whatever is still open after every service has stopped — a request in flight — is dropped just before
 * the stores close: `buildServices` registers that step right after the state DB.
 */
import type { Server } from "node:http";
import type { Teardown } from "./teardown.js";

export class Listeners {
  readonly #closed = new Map<Server, Promise<void>>();

  /** Register `server`'s "stop accepting" step; call it once the listener is made, before it listens. */
  track(server: Server, name: string, teardown: Teardown): Server {
    teardown.add(`${name}: stop accepting`, () => {
      this.#stopAccepting(server);
    });
    return server;
  }

  #stopAccepting(server: Server): void {
    if (this.#closed.has(server) || !server.listening) return;
    // Node closes the idle connections here; the callback waits for the others (upgraded ones included).
    this.#closed.set(server, new Promise<void>((resolve) => server.close(() => resolve())));
  }

  /** Drop every connection still open on a listener that stopped accepting, and wait until each is gone. */
  async dropConnections(): Promise<void> {
    await Promise.all(
      [...this.#closed].map(async ([server, closed]) => {
        server.closeAllConnections();
        await closed;
      }),
    );
  }
}
