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
 * - A client that vanishes mid-WebSocket (its connection reset, e.g. a SIGKILLed Runner) costs only that
 *   connection: its backend side is closed, nothing is thrown in the balancer's process.
 * - `stop()` closes the listener and every connection through it, WebSockets included.
 *
 * `startNginxLoadBalancer` offers Debian's nginx (`apt-get install nginx`) with the same contract but one
 * difference, nginx's default: a dead backend is skipped, the request passed on to the next backend, since
 * nothing was sent to the dead one. It needs `nginx` on PATH (`nginxPath()`); the default is the npm one.
 */
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { connect, createServer as createNetServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
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
  // http-proxy-3 reports an upgraded client socket's own errors (a client that vanished: ECONNRESET from a
  // killed Runner) here, not to the per-upgrade callback; unheard, they would be thrown in this process. Its
  // stream pass already ends the backend side on that socket's error and close; destroying it is all that is left.
  proxy.on("error", (_err, _req, socket) => {
    if (socket !== undefined && typeof socket.destroy === "function") socket.destroy();
  });
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
    deadBackend: "fails-fast",
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

/** Bound on nginx stopping after SIGTERM (fast shutdown) before its process group is killed. */
export const NGINX_STOP_TIMEOUT_MS = 10_000;
/** How many free ports a start tries when the one it picked was taken in between. */
const NGINX_PORT_ATTEMPTS = 3;
/** Time between two connection attempts while waiting for nginx to listen. */
const NGINX_READY_POLL_MS = 25;
/** How much of nginx's stderr an error message shows. */
const NGINX_LOG_TAIL_CHARS = 4_096;

/** The nginx executable on PATH, or undefined when there is none. */
export function nginxPath() {
  try {
    const found = execFileSync("/bin/sh", ["-c", "command -v nginx"], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
    });
    return found.trim() || undefined;
  } catch {
    return undefined;
  }
}

async function freePort() {
  return await new Promise((resolve, reject) => {
    const probe = createNetServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0));
    });
  });
}

/** Whether something accepts TCP connections on 127.0.0.1:port. */
function accepts(port) {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port });
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

/** nginx.conf for `backends` behind 127.0.0.1:port, every path under `dir`. */
function nginxConfig(dir, port, backends) {
  const cooldownSecs = Math.max(1, Math.ceil(DEAD_BACKEND_COOLDOWN_MS / 1000));
  const servers = backends
    .map((b) => `    server ${b.host}:${b.port} max_fails=1 fail_timeout=${cooldownSecs}s;`)
    .join("\n");
  const temp = (name) => `${join(dir, name)}`;
  return `# Generated by scripts/load-balancer.mjs (startNginxLoadBalancer).
daemon off;
worker_processes 1;
pid ${join(dir, "nginx.pid")};
error_log stderr warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path ${temp("client_body")};
  proxy_temp_path ${temp("proxy")};
  fastcgi_temp_path ${temp("fastcgi")};
  uwsgi_temp_path ${temp("uwsgi")};
  scgi_temp_path ${temp("scgi")};
  upstream webcodex {
${servers}
  }
  map $http_upgrade $connection_upgrade { default upgrade; "" ""; }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://webcodex;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout ${Math.ceil(BACKEND_IDLE_TIMEOUT_MS / 1000)}s;
      proxy_send_timeout ${Math.ceil(BACKEND_IDLE_TIMEOUT_MS / 1000)}s;
      add_header ${BACKEND_HEADER} $upstream_addr always;
    }
  }
}
`;
}

/** @type {import("./load-balancer.d.mts").startNginxLoadBalancer} */
export async function startNginxLoadBalancer(initial) {
  let backends = checkBackends(initial);
  const bin = nginxPath();
  if (bin === undefined) {
    throw new Error(
      "startNginxLoadBalancer: no nginx on PATH (Debian: apt-get install nginx); startLoadBalancer needs none",
    );
  }
  const dir = mkdtempSync(join(tmpdir(), "webcodex-nginx-"));
  const confFile = join(dir, "nginx.conf");
  let log = "";
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    writeFileSync(confFile, nginxConfig(dir, port, backends));
    // Own process group, so stop() can end the master and its worker together.
    const child = spawn(bin, ["-p", dir, "-c", confFile, "-e", "stderr"], {
      stdio: ["ignore", "ignore", "pipe"],
      detached: true,
    });
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => {
      log = (log + chunk).slice(-NGINX_LOG_TAIL_CHARS);
    });
    const exited = new Promise((resolve) =>
      child.once("exit", (code, signal) => resolve(signal ?? `exit code ${code}`)),
    );
    const killGroup = (signal) => {
      try {
        process.kill(-child.pid, signal);
      } catch {
        // already gone
      }
    };
    const deadline = Date.now() + LOAD_BALANCER_START_TIMEOUT_MS;
    let ready = false;
    while (!ready && child.exitCode === null && child.signalCode === null && Date.now() < deadline) {
      ready = await accepts(port);
      if (!ready) await new Promise((r) => setTimeout(r, NGINX_READY_POLL_MS));
    }
    if (!ready) {
      killGroup("SIGKILL");
      const why = await Promise.race([
        exited,
        new Promise((r) => setTimeout(() => r("still running"), NGINX_READY_POLL_MS)),
      ]);
      if (/Address already in use/.test(log) && attempt < NGINX_PORT_ATTEMPTS) continue;
      rmSync(dir, { recursive: true, force: true });
      throw new Error(
        `nginx did not listen on 127.0.0.1:${port} within ${LOAD_BALANCER_START_TIMEOUT_MS} ms (${why}); its log:\n${log}`,
      );
    }
    /** @type {Promise<void> | undefined} */
    let stopped;
    return {
      url: `http://127.0.0.1:${port}`,
      port,
      deadBackend: "skipped",
      async setBackends(list) {
        backends = checkBackends(list);
        writeFileSync(confFile, nginxConfig(dir, port, backends));
        // `nginx -s reload` checks the new file; a bad one leaves the old config running and fails here.
        execFileSync(bin, ["-p", dir, "-c", confFile, "-e", "stderr", "-s", "reload"], { stdio: "pipe" });
      },
      stop() {
        stopped ??= (async () => {
          if (child.exitCode === null && child.signalCode === null) {
            killGroup("SIGTERM");
            const timer = setTimeout(() => killGroup("SIGKILL"), NGINX_STOP_TIMEOUT_MS);
            await exited;
            clearTimeout(timer);
          }
          killGroup("SIGKILL");
          rmSync(dir, { recursive: true, force: true });
        })();
        return stopped;
      },
    };
  }
}
