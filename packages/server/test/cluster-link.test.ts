/**
 * The caller's side of a forwarded link request (link/cluster.ts RemoteRunnerConnection) against a real HTTP
 * peer: what may be reported as not sent (the peer could not be reached, or refused before executing), and
 * what must stay unknown because the request may have left (the connection dropped after it was written, a
 * 5xx, an answer that does not parse) — design §6.1: never report not_started for what may have been
 * delivered. And the holder's side round trip: a signed request reaches the executor with the frame intact.
 */
import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { handleLinkRequest, RemoteRunnerConnection } from "../src/link/cluster.js";
import type { RunnerRequest } from "../src/link/hub.js";
import { freePort } from "./support/proc-stack.js";

const log = pino({ level: "silent" });
const key = randomBytes(32);
const SYNC: RunnerRequest = { type: "run.sync", run_id: `wc_agent_run_${"c".repeat(26)}`, after_seq: 0, max_events: 0 };
let server: Server | null = null;

afterEach(async () => {
  server?.closeAllConnections();
  await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
  server = null;
});

async function peer(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<string> {
  server = createServer(handler);
  await new Promise<void>((r) => server?.listen(0, "127.0.0.1", () => r()));
  const port = (server.address() as { port: number }).port;
  return `http://127.0.0.1:${port}`;
}

function conn(url: string): RemoteRunnerConnection {
  return new RemoteRunnerConnection("r1", "peer", url, key, 2_000, log);
}

describe("a forwarded link request's outcome on the caller", () => {
  it("is not_sent only when nothing can have been executed", async () => {
    const closed = `http://127.0.0.1:${await freePort()}`;
    expect(await conn(closed).request(SYNC)).toEqual({ ok: false, reason: "not_sent" });
    const refusing = await peer((_req, res) => res.writeHead(401).end('{"error":"bad_signature"}'));
    expect(await conn(refusing).request(SYNC)).toEqual({ ok: false, reason: "not_sent" });
  });

  it("stays unknown when the request may have reached the holder", async () => {
    const dropping = await peer((req) => req.socket.destroy());
    expect(await conn(dropping).request(SYNC)).toEqual({ ok: false, reason: "timeout" });
    await new Promise<void>((r) => server?.close(() => r()));
    const failing = await peer((_req, res) => res.writeHead(502).end());
    expect(await conn(failing).request(SYNC)).toEqual({ ok: false, reason: "timeout" });
    await new Promise<void>((r) => server?.close(() => r()));
    const garbled = await peer((_req, res) => res.writeHead(200).end('{"ok":true,"frame":{"type":"hello"}}'));
    expect(await conn(garbled).request(SYNC)).toEqual({ ok: false, reason: "timeout" });
  });

  it("reaches the holder's executor signed and intact, and carries its answer back", async () => {
    const seen: unknown[] = [];
    const url = await peer((req, res) => {
      void handleLinkRequest(
        req,
        res,
        key,
        async (runnerId, frame, timeoutMs) => {
          seen.push({ runnerId, frame, timeoutMs });
          return { ok: false, reason: "busy" };
        },
        log,
      );
    });
    expect(await conn(url).request(SYNC, 1_500)).toEqual({ ok: false, reason: "busy" });
    expect(seen).toEqual([{ runnerId: "r1", frame: SYNC, timeoutMs: 1_500 }]);
    // Another key: refused before the executor, so the caller may report it as not sent.
    const stranger = new RemoteRunnerConnection("r1", "peer", url, randomBytes(32), 2_000, log);
    expect(await stranger.request(SYNC)).toEqual({ ok: false, reason: "not_sent" });
    expect(seen).toHaveLength(1);
  });
});
