/**
 * A port on 127.0.0.1 that refuses connections for as long as a test needs it. A port a test has just
 * closed is not one: the kernel may hand it to another test's `listen(0)` before the request (CI once saw
 * a "dead" backend answer 200). A privileged port below the kernel's ephemeral range is never handed out
 * for port 0, and no test binds one.
 */
import { connect } from "node:net";
import { IN_PROCESS_WAIT_MS } from "./poll.js";

/** Privileged ports that a Debian machine does not serve by default (tcpmux, compressnet, rje, systat). */
const REFUSED_PORT_CANDIDATES = [1, 3, 5, 11] as const;

/** Whether a connection to 127.0.0.1:port is refused (not accepted, not left unanswered). */
function refuses(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port });
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(false);
    }, IN_PROCESS_WAIT_MS);
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.destroy();
      resolve(false);
    });
    socket.once("error", (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      resolve(err.code === "ECONNREFUSED");
    });
  });
}

/** The first candidate port that refuses connections now; throws when every one is served. */
export async function refusedPort(): Promise<number> {
  for (const port of REFUSED_PORT_CANDIDATES) if (await refuses(port)) return port;
  throw new Error(
    `no port on 127.0.0.1 refuses connections among ${REFUSED_PORT_CANDIDATES.join(", ")}: ` +
      "something serves them all; stop it, or add a free privileged port to REFUSED_PORT_CANDIDATES",
  );
}
