/**
 * A real round-robin HTTP and WebSocket load balancer for tests and the local cluster example (examples/cluster), in this
 * process: a `node:http` server on a free 127.0.0.1 port whose requests and upgrades `http-proxy-3` (a
 * kept rewrite of `http-proxy`, the proxy Vite uses; a pinned devDependency) forwards to one backend each.
 * No npm package ships a proxy binary (HAProxy, nginx, Caddy, Envoy) that installs without downloading
 * from outside the registry, so this is the one `npm test` can have on a fresh machine.
 *
 * Contract:
 * - Round robin over the backends, one turn per HTTP request and one per WebSocket upgrade (a single
 *   counter, as nginx's `upstream` keeps): consecutive calls go to consecutive backends.
 * - Responses stream through unbuffered (an SSE chunk reaches the client when the backend writes it);
 *   request bodies stream through too. Each response carries `x-lb-backend: host:port`, the backend that
 *   answered (as nginx's `add_header X-Upstream $upstream_addr` would), so a test can tell instances apart.
 * - A dead backend fails fast, it is not retried: the request or upgrade that hits a backend refusing
 *   connections gets a 502 (an upgrade: its socket closed) at once, and that backend is then skipped for
 *   DEAD_BACKEND_COOLDOWN_MS (nginx's `max_fails=1 fail_timeout=…`), unless every backend is marked dead.
 *   Nothing is resent: the request body was already streamed to the first backend.
 * - `stop()` closes the listener and every connection through it, WebSockets included.
 */
import { createServer } from "node:http";
import { createProxyServer } from "http-proxy-3";

/** Bound on binding the listener. */
export const LOAD_BALANCER_START_TIMEOUT_MS = 10_000;
/** How long a backend that refused a connection is skipped (unless every backend is marked dead). */
export const DEAD_BACKEND_COOLDOWN_MS = 2_000;
/**
 * Idle bound on a proxied request's backend socket: no byte for this long ends it. Above the Server's
 * longest quiet stream (observe long-polls wait at most 60 s, SSE streams send keep-alives).
 */
export const BACKEND_IDLE_TIMEOUT_MS = 300_000;
/** The response header naming the backend that answered. */
export const BACKEND_HEADER = "x-lb-backend";
/** Error codes that mean the backend was never reached (nothing was delivered to it). */
const CONNECT_ERRORS = new Set(["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL"]);

/** @param {{host: string, port: number}} b */
const keyOf = (b) => `${b.host}:${b.port}`;

/** @param {readonly {host: string, port: number}[]} backends */
function checkBackends(backends) {
  if (backends.length === 0) throw new Error("load balancer: backends must list at least one {host, port}");
  return backends.map((b, i) => {
    if (typeof b.host !== "string" || b.host === "") {
      throw new Error(`load balancer: backends[${i}].host must be a non-empty host name or address`);
    }
    if (!Number.isInteger(b.port) || b.port < 1 || b.port > 65_535) {
      throw new Error(`load balancer: backends[${i}].port must be an integer 1 … 65535, got ${String(b.port)}`);
    }
    return { host: b.host, port: b.port };
  });
}

/** @type {import("./load-balancer.d.mts").startLoadBalancer} */
export async function startLoadBalancer(initial) {
  let backends = checkBackends(initial);
  let next = 0;
  /** @type {Map<string, number>} */
  const deadUntil = new Map();
  /** @type {Map<string, number>} */
  const counts = new Map();

  /** The next backend in turn, skipping ones marked dead unless all are. */
  const pick = () => {
    const now = Date.now();
    for (let i = 0; i < backends.length; i++) {
      const b = backends[(next + i) % backends.length];
      if ((deadUntil.get(keyOf(b)) ?? 0) <= now) {
        next = (next + i + 1) % backends.length;
        return b;
      }
    }
    const b = backends[next % backends.length];
    next = (next + 1) % backends.length;
    return b;
  };
  const sent = (b) => {
    counts.set(keyOf(b), (counts.get(keyOf(b)) ?? 0) + 1);
  };
  const noteError = (b, err) => {
    const code = err?.code;
    if (code !== undefined && CONNECT_ERRORS.has(code)) deadUntil.set(keyOf(b), Date.now() + DEAD_BACKEND_COOLDOWN_MS);
  };

  const proxy = createProxyServer({ xfwd: true, proxyTimeout: BACKEND_IDLE_TIMEOUT_MS });
  proxy.on("proxyRes", (proxyRes, req) => {
    const backend = req.lbBackend;
    if (backend !== undefined) proxyRes.headers[BACKEND_HEADER] = backend;
  });

  /** @type {Set<import("node:net").Socket>} */
  const sockets = new Set();
  const server = createServer((req, res) => {
    const backend = pick();
    sent(backend);
    req.lbBackend = keyOf(backend);
    proxy.web(req, res, { target: { host: backend.host, port: backend.port } }, (err) => {
      noteError(backend, err);
      if (!res.headersSent) {
        res.writeHead(502, { "content-type": "text/plain; charset=utf-8", [BACKEND_HEADER]: keyOf(backend) });
        res.end(`load balancer: backend ${keyOf(backend)} failed (${err?.code ?? "error"})\n`);
      } else {
        res.destroy();
      }
    });
  });
  server.on("upgrade", (req, socket, head) => {
    const backend = pick();
    sent(backend);
    proxy.ws(req, socket, head, { target: { host: backend.host, port: backend.port } }, (err) => {
      // http-proxy-3 closes the client socket after this callback.
      noteError(backend, err);
    });
  });
  server.on("connection", (socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  // The upgraded backend sockets close with their client socket (http-proxy-3 ends them on close).

  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      server.close();
      reject(new Error(`load balancer: no listener on 127.0.0.1 within ${LOAD_BALANCER_START_TIMEOUT_MS} ms`));
    }, LOAD_BALANCER_START_TIMEOUT_MS);
    server.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    server.listen(0, "127.0.0.1", () => {
      clearTimeout(timer);
      resolve();
    });
  });
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("load balancer: listener has no port");
  const port = address.port;
  /** @type {Promise<void> | undefined} */
  let stopped;

  return {
    url: `http://127.0.0.1:${port}`,
    port,
    setBackends(list) {
      backends = checkBackends(list);
      next = 0;
    },
    counts() {
      return Object.fromEntries(backends.map((b) => [keyOf(b), counts.get(keyOf(b)) ?? 0]));
    },
    stop() {
      stopped ??= new Promise((resolve) => {
        server.close(() => resolve());
        for (const socket of sockets) socket.destroy();
        proxy.close();
      });
      return stopped;
    },
  };
}
