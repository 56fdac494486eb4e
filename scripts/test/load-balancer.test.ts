/**
 * The test load balancer (scripts/test-support/load-balancer.ts) in front of two real HTTP + WebSocket
 * backends: round robin per request and per upgrade, WebSockets carried both ways, SSE streamed chunk by
 * chunk, a dead backend answered at once and then skipped — for the default and, where it is installed,
 * Debian's nginx (startNginxLoadBalancer).
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, request, type Server } from "node:http";
import { type AddressInfo, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket, { WebSocketServer } from "ws";
import {
  BACKEND_HEADER,
  type Backend,
  DEAD_BACKEND_COOLDOWN_MS,
  type LoadBalancer,
  type NginxLoadBalancer,
  nginxPath,
  startLoadBalancer,
  startNginxLoadBalancer,
} from "../test-support/load-balancer.js";
import { poll } from "../test-support/poll.js";
import { refusedPort } from "../test-support/ports.js";

/** Bound on one exchange through the balancer on this machine. */
const EXCHANGE_WAIT_MS = 5_000;

interface TestBackend extends Backend {
  name: string;
  server: Server;
  /** Resolve the pending SSE response's last chunk. */
  finishSse(): void;
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function startBackend(name: string): Promise<TestBackend> {
  let finish: (() => void) | undefined;
  const server = createServer((req, res) => {
    if (req.url === "/sse") {
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      res.write(`data: first from ${name}\n\n`);
      finish = () => res.end(`data: last from ${name}\n\n`);
      return;
    }
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (chunk: string) => {
      body += chunk;
    });
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ backend: name, body }));
    });
  });
  const wss = new WebSocketServer({ server, path: "/runner" });
  wss.on("connection", (socket) => {
    socket.send(`hello from ${name}`);
    socket.on("message", (data) => socket.send(`${name} got ${String(data)}`));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  cleanups.push(async () => {
    for (const client of wss.clients) client.terminate();
    wss.close();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { name, host: "127.0.0.1", port, server, finishSse: () => finish?.() };
}

/** A backend nothing listens on, for as long as the test runs. */
async function deadBackend(): Promise<Backend> {
  return { host: "127.0.0.1", port: await refusedPort() };
}

type AnyBalancer = LoadBalancer | NginxLoadBalancer;
interface Implementation {
  name: string;
  start(backends: Backend[]): Promise<AnyBalancer>;
}

/** The default, and Debian's nginx where it is installed (the hardening suite's option). */
const IMPLEMENTATIONS: Implementation[] = [
  { name: "the default (http-proxy-3)", start: startLoadBalancer },
  ...(nginxPath() === undefined ? [] : [{ name: "Debian's nginx", start: startNginxLoadBalancer }]),
];

async function started<T extends AnyBalancer>(lb: Promise<T>): Promise<T> {
  const running = await lb;
  cleanups.push(() => running.stop());
  return running;
}

async function post(url: string, body: string): Promise<{ status: number; backend: string | null; json: unknown }> {
  const res = await fetch(url, { method: "POST", body, signal: AbortSignal.timeout(EXCHANGE_WAIT_MS) });
  const text = await res.text();
  return { status: res.status, backend: res.headers.get(BACKEND_HEADER), json: res.ok ? JSON.parse(text) : text };
}

/** Open a WebSocket through the balancer; resolves with its first message and the socket. */
async function openWs(url: string): Promise<{ socket: WebSocket; first: string; next: () => Promise<string> }> {
  const socket = new WebSocket(`${url.replace(/^http/, "ws")}/runner`);
  cleanups.push(async () => socket.terminate());
  const queue: string[] = [];
  const waiters: ((m: string) => void)[] = [];
  socket.on("message", (data) => {
    const waiter = waiters.shift();
    if (waiter) waiter(String(data));
    else queue.push(String(data));
  });
  const next = (): Promise<string> => {
    const queued = queue.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no WebSocket message in time")), EXCHANGE_WAIT_MS);
      waiters.push((m) => {
        clearTimeout(timer);
        resolve(m);
      });
    });
  };
  await new Promise<void>((resolve, reject) => {
    socket.once("open", () => resolve());
    socket.once("error", reject);
  });
  return { socket, first: await next(), next };
}

const backendOf = (r: { json: unknown }): string => (r.json as { backend: string }).backend;

describe.each(IMPLEMENTATIONS)("the test load balancer: $name", ({ start }) => {
  it("sends consecutive HTTP requests to the backends in turn and says which answered", async () => {
    const [a, b] = [await startBackend("A"), await startBackend("B")];
    const lb = await started(start([a, b]));
    const body = randomBytes(16).toString("hex");
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await post(`${lb.url}/mcp`, body));
    expect(answers.map(backendOf)).toEqual(["A", "B", "A", "B"]);
    expect(answers.map((r) => r.backend)).toEqual([a, b, a, b].map((x) => `${x.host}:${x.port}`));
    // The request body reaches the backend whole.
    expect(answers.every((r) => (r.json as { body: string }).body === body)).toBe(true);
  });

  it("proxies WebSocket upgrades in turn and carries messages both ways", async () => {
    const [a, b] = [await startBackend("A"), await startBackend("B")];
    const lb = await started(start([a, b]));
    const first = await openWs(lb.url);
    const second = await openWs(lb.url);
    expect([first.first, second.first]).toEqual(["hello from A", "hello from B"]);
    const word = randomBytes(16).toString("hex");
    first.socket.send(word);
    expect(await first.next()).toBe(`A got ${word}`);
    second.socket.send(word);
    expect(await second.next()).toBe(`B got ${word}`);
    // Upgrades and requests share one turn: the next request goes to A.
    expect(backendOf(await post(`${lb.url}/mcp`, "{}"))).toBe("A");
  });

  it("streams an SSE response chunk by chunk: the first chunk arrives before the response ends", async () => {
    const a = await startBackend("A");
    const lb = await started(start([a]));
    const chunks: string[] = [];
    const ended = new Promise<void>((resolve, reject) => {
      const req = request(`${lb.url}/sse`, { headers: { accept: "text/event-stream" } }, (res) => {
        expect(res.headers["content-type"]).toBe("text/event-stream");
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => chunks.push(chunk));
        res.on("end", resolve);
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end();
    });
    await poll(() => chunks.length > 0, {
      timeoutMs: EXCHANGE_WAIT_MS,
      what: "the first SSE chunk through the balancer",
    });
    // The backend has not ended the response: what arrived was streamed, not buffered.
    expect(chunks.join("")).toBe("data: first from A\n\n");
    a.finishSse();
    await ended;
    expect(chunks.join("")).toBe("data: first from A\n\ndata: last from A\n\n");
  });

  it("answers at once when a backend is dead, and then sends everything to the live one for the cooldown", async () => {
    const a = await startBackend("A");
    const dead = await deadBackend();
    const lb = await started(start([dead, a]));
    const began = Date.now();
    const first = await post(`${lb.url}/mcp`, "{}");
    expect(Date.now() - began).toBeLessThan(EXCHANGE_WAIT_MS);
    if (lb.deadBackend === "fails-fast") {
      // The default: a 502 naming the dead backend, nothing retried.
      expect(first.status).toBe(502);
      expect(first.backend).toBe(`127.0.0.1:${dead.port}`);
    } else {
      // nginx: passed on to the next backend (nothing had been sent to the dead one).
      expect(first.status).toBe(200);
      expect(backendOf(first)).toBe("A");
    }
    // Within the cooldown every request goes to the live backend, WebSocket upgrades included.
    for (let i = 0; i < 3; i++) expect(backendOf(await post(`${lb.url}/mcp`, "{}"))).toBe("A");
    expect((await openWs(lb.url)).first).toBe("hello from A");
  });

  it("stop() closes open WebSockets through it and the listener", async () => {
    const a = await startBackend("A");
    const lb = await start([a]);
    const { socket } = await openWs(lb.url);
    const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
    await lb.stop();
    await closed;
    await expect(fetch(`${lb.url}/mcp`, { method: "POST", body: "{}" })).rejects.toThrow();
  });
});

describe("the default load balancer (http-proxy-3)", () => {
  it("counts what each backend was sent, and gives a dead backend its turn again after the cooldown", async () => {
    const a = await startBackend("A");
    const dead = await deadBackend();
    const lb = await started(startLoadBalancer([dead, a]));
    expect((await post(`${lb.url}/mcp`, "{}")).status).toBe(502);
    expect(backendOf(await post(`${lb.url}/mcp`, "{}"))).toBe("A");
    expect(lb.counts()).toEqual({ [`127.0.0.1:${dead.port}`]: 1, [`127.0.0.1:${a.port}`]: 1 });
    await new Promise((r) => setTimeout(r, DEAD_BACKEND_COOLDOWN_MS + 100));
    const turns = [await post(`${lb.url}/mcp`, "{}"), await post(`${lb.url}/mcp`, "{}")];
    expect(turns.map((r) => r.status).sort()).toEqual([200, 502]);
  });

  it("outlives a WebSocket client whose connection is reset: nothing thrown, its backend side closed, still serving", async () => {
    const a = await startBackend("A");
    const lb = await started(startLoadBalancer([a]));
    const uncaught: unknown[] = [];
    const onUncaught = (err: unknown) => uncaught.push(err);
    process.on("uncaughtException", onUncaught);
    cleanups.push(async () => {
      process.off("uncaughtException", onUncaught);
    });
    const backendSockets = () =>
      new Promise<number>((resolve, reject) => a.server.getConnections((err, n) => (err ? reject(err) : resolve(n))));
    // A raw upgrade, as a Runner's link opens, then reset (RST) as a SIGKILLed process's connection ends.
    const client = connect({ host: "127.0.0.1", port: lb.port });
    client.on("error", () => {});
    client.write(
      "GET /runner HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
        `Sec-WebSocket-Key: ${randomBytes(16).toString("base64")}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
    );
    await new Promise((resolve) => client.once("data", resolve));
    expect(await backendSockets()).toBe(1);
    client.resetAndDestroy();
    await poll(async () => (await backendSockets()) === 0, {
      timeoutMs: EXCHANGE_WAIT_MS,
      what: "the backend side of the reset WebSocket closed",
    });
    expect(uncaught).toEqual([]);
    expect(backendOf(await post(`${lb.url}/mcp`, "{}"))).toBe("A");
    expect((await openWs(lb.url)).first).toBe("hello from A");
  });

  it("refuses an empty or malformed backend list, naming the field", async () => {
    await expect(startLoadBalancer([])).rejects.toThrow(/at least one/);
    await expect(startLoadBalancer([{ host: "127.0.0.1", port: 0 }])).rejects.toThrow(/backends\[0\]\.port/);
    await expect(startLoadBalancer([{ host: "", port: 80 }])).rejects.toThrow(/backends\[0\]\.host/);
  });
});

describe("startNginxLoadBalancer", () => {
  it("says nginx is missing, and how to get it, when it is not on PATH", async () => {
    const saved = process.env.PATH;
    const empty = mkdtempSync(join(tmpdir(), "wc-no-nginx-"));
    process.env.PATH = empty;
    try {
      expect(nginxPath()).toBeUndefined();
      await expect(startNginxLoadBalancer([{ host: "127.0.0.1", port: 1 }])).rejects.toThrow(/apt-get install nginx/);
    } finally {
      process.env.PATH = saved;
      rmSync(empty, { recursive: true, force: true });
    }
  });
});
