/**
 * POSTs to another Server instance (cluster/peer-http.ts) against a real HTTP server on 127.0.0.1: what
 * the caller learns decides whether a forwarded start may have left (design §14), so a failure is
 * "not sent" only when the connection was never made.
 */
import { once } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { refusedPort } from "../../../../scripts/test-support/index.js";
import { postToPeer } from "../../src/cluster/peer-http.js";

/** Bound on one request in these tests; the slow peer never answers within it. */
const REQUEST_TIMEOUT_MS = 300;
const MAX_BODY_BYTES = 1024;

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise((resolve) => s.close(resolve));
  }
});

async function peer(handler: http.RequestListener): Promise<{ url: string; connections: () => number }> {
  const server = http.createServer(handler);
  let connections = 0;
  server.on("connection", () => {
    connections += 1;
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  servers.push(server);
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/x`, connections: () => connections };
}

const post = (url: string, body = "{}") =>
  postToPeer(url, { "content-type": "application/json" }, Buffer.from(body), REQUEST_TIMEOUT_MS, MAX_BODY_BYTES);

describe("a POST to a peer instance", () => {
  it("answers the peer's status and body, reusing one connection for requests in turn", async () => {
    const p = await peer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => res.end(`echo ${Buffer.concat(chunks).toString()}`));
    });
    for (let i = 0; i < 3; i++) {
      expect(await post(p.url, `{"n":${i}}`)).toEqual({ kind: "answered", status: 200, text: `echo {"n":${i}}` });
    }
    expect(p.connections()).toBe(1);
  });

  it("is not sent when nothing listens on the peer's port", async () => {
    const url = `http://127.0.0.1:${await refusedPort()}/x`;
    expect(await post(url)).toEqual({ kind: "failed", sent: false, code: "ECONNREFUSED" });
  });

  it("may have been sent when the peer drops the connection after reading the request", async () => {
    const p = await peer((req) => {
      req.resume();
      req.on("end", () => req.socket.destroy());
    });
    expect(await post(p.url)).toMatchObject({ kind: "failed", sent: true });
  });

  it("may have been sent when the peer does not answer within the timeout", async () => {
    const p = await peer((req) => req.resume());
    expect(await post(p.url)).toEqual({ kind: "failed", sent: true, code: "timeout" });
  });

  it("stops reading an answer larger than the bound", async () => {
    const p = await peer((req, res) => {
      req.resume();
      res.end("x".repeat(MAX_BODY_BYTES * 4));
    });
    expect(await post(p.url)).toEqual({ kind: "failed", sent: true, code: "body_too_large" });
  });
});
