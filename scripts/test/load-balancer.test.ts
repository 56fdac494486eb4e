/**
 * The test load balancer (scripts/test-support/load-balancer.ts) in front of two real HTTP + WebSocket
 * backends: round robin per request and per upgrade, WebSockets carried both ways, SSE streamed chunk by
 * chunk, a dead backend failing fast and then skipped.
 */
import { randomBytes } from "node:crypto";
import { createServer, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket, { WebSocketServer } from "ws";
import {
  BACKEND_HEADER,
  type Backend,
  DEAD_BACKEND_COOLDOWN_MS,
  type LoadBalancer,
  startLoadBalancer,
} from "../test-support/load-balancer.js";

/** Bound on one exchange through the balancer on this machine. */
const EXCHANGE_WAIT_MS = 5_000;
/** How long the SSE backend holds its stream open between the first and the last chunk. */
const SSE_GAP_MS = 1_500;

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

async function balancer(backends: Backend[]): Promise<LoadBalancer> {
  const lb = await startLoadBalancer(backends);
  cleanups.push(() => lb.stop());
  return lb;
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

describe("the test load balancer", () => {
  it("sends consecutive HTTP requests to the backends in turn and says which answered", async () => {
    const [a, b] = [await startBackend("A"), await startBackend("B")];
    const lb = await balancer([a, b]);
    const body = randomBytes(16).toString("hex");
    const answers = [];
    for (let i = 0; i < 4; i++) answers.push(await post(`${lb.url}/mcp`, body));
    expect(answers.map((r) => (r.json as { backend: string }).backend)).toEqual(["A", "B", "A", "B"]);
    expect(answers.map((r) => r.backend)).toEqual([a, b, a, b].map((x) => `${x.host}:${x.port}`));
    // The request body reaches the backend whole.
    expect(answers.every((r) => (r.json as { body: string }).body === body)).toBe(true);
    expect(lb.counts()).toEqual({ [`127.0.0.1:${a.port}`]: 2, [`127.0.0.1:${b.port}`]: 2 });
  });

  it("proxies WebSocket upgrades in turn and carries messages both ways", async () => {
    const [a, b] = [await startBackend("A"), await startBackend("B")];
    const lb = await balancer([a, b]);
    const first = await openWs(lb.url);
    const second = await openWs(lb.url);
    expect([first.first, second.first]).toEqual(["hello from A", "hello from B"]);
    const word = randomBytes(16).toString("hex");
    first.socket.send(word);
    expect(await first.next()).toBe(`A got ${word}`);
    second.socket.send(word);
    expect(await second.next()).toBe(`B got ${word}`);
    // Upgrades and requests share one turn: the next request goes to A.
    expect(((await post(`${lb.url}/mcp`, "{}")).json as { backend: string }).backend).toBe("A");
  });

  it("streams an SSE response chunk by chunk: the first chunk arrives before the response ends", async () => {
    const a = await startBackend("A");
    const lb = await balancer([a]);
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
    const firstAt = Date.now();
    while (chunks.length === 0) {
      if (Date.now() - firstAt > EXCHANGE_WAIT_MS) throw new Error("the first SSE chunk never came through");
      await new Promise((r) => setTimeout(r, 10));
    }
    // The backend has not ended the response: what arrived was streamed, not buffered.
    expect(chunks.join("")).toBe("data: first from A\n\n");
    await new Promise((r) => setTimeout(r, SSE_GAP_MS));
    expect(chunks.join("")).toBe("data: first from A\n\n");
    a.finishSse();
    await ended;
    expect(chunks.join("")).toBe("data: first from A\n\ndata: last from A\n\n");
  });

  it("fails fast on a dead backend (502, no retry) and then skips it for the cooldown", async () => {
    const a = await startBackend("A");
    const dead = await startBackend("dead");
    await new Promise<void>((resolve) => dead.server.close(() => resolve()));
    const lb = await balancer([dead, a]);
    const started = Date.now();
    const failed = await post(`${lb.url}/mcp`, "{}");
    expect(failed.status).toBe(502);
    expect(failed.backend).toBe(`127.0.0.1:${dead.port}`);
    expect(Date.now() - started).toBeLessThan(EXCHANGE_WAIT_MS);
    // Within the cooldown every request goes to the live backend, WebSocket upgrades included.
    for (let i = 0; i < 3; i++) {
      expect(((await post(`${lb.url}/mcp`, "{}")).json as { backend: string }).backend).toBe("A");
    }
    expect((await openWs(lb.url)).first).toBe("hello from A");
    // After the cooldown the dead backend gets its turn again (and fails fast again).
    await new Promise((r) => setTimeout(r, DEAD_BACKEND_COOLDOWN_MS + 100));
    const turns = [await post(`${lb.url}/mcp`, "{}"), await post(`${lb.url}/mcp`, "{}")];
    expect(turns.map((r) => r.status).sort()).toEqual([200, 502]);
  });

  it("refuses an empty or malformed backend list, naming the field", async () => {
    await expect(startLoadBalancer([])).rejects.toThrow(/at least one/);
    await expect(startLoadBalancer([{ host: "127.0.0.1", port: 0 }])).rejects.toThrow(/backends\[0\]\.port/);
  });

  it("stop() closes open WebSockets through it", async () => {
    const a = await startBackend("A");
    const lb = await startLoadBalancer([a]);
    const { socket } = await openWs(lb.url);
    const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
    await lb.stop();
    await closed;
    await expect(fetch(`${lb.url}/mcp`, { method: "POST", body: "{}" })).rejects.toThrow();
  });
});
