/**
 * Client ID Metadata Document fetches against a real loopback https server
 * (self-signed, trusted through the fetcher's `ca` seam): size cap, timeout,
 * no redirects, private and loopback addresses, and document checks.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fetchClientMetadata, refusedAddress } from "../../src/oauth/client-metadata.js";
import { makeLoopbackCert, startHttpsHost, type TestCert } from "../support/oauth.js";

let dir: string;
let cert: TestCert;
let host: Awaited<ReturnType<typeof startHttpsHost>>;
const hung: import("node:http").ServerResponse[] = [];

function doc(id: string, extra: Record<string, unknown> = {}) {
  return JSON.stringify({
    client_id: id,
    client_name: "Doc client",
    redirect_uris: ["https://app.example/cb"],
    ...extra,
  });
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "wc-cimd-unit-"));
  cert = makeLoopbackCert(dir);
  host = await startHttpsHost(cert, {
    "/ok.json": (_q, r) => r.writeHead(200, { "content-type": "application/json" }).end(doc(`${host.origin}/ok.json`)),
    "/big.json": (_q, r) => {
      r.writeHead(200, { "content-type": "application/json" });
      r.end(doc(`${host.origin}/big.json`, { pad: "x".repeat(80 * 1024) }));
    },
    "/chunked-big.json": (_q, r) => {
      r.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked" });
      for (let i = 0; i < 100; i++) r.write("x".repeat(1024));
      r.end();
    },
    "/slow.json": (_q, r) => {
      hung.push(r);
    },
    "/redirect.json": (_q, r) => r.writeHead(302, { location: `${host.origin}/ok.json` }).end(),
    "/other-id.json": (_q, r) => r.writeHead(200).end(doc("https://elsewhere.example/client.json")),
    "/secret-client.json": (_q, r) =>
      r
        .writeHead(200)
        .end(doc(`${host.origin}/secret-client.json`, { token_endpoint_auth_method: "client_secret_post" })),
  });
});

afterAll(async () => {
  for (const r of hung) r.destroy();
  await host?.close();
  rmSync(dir, { recursive: true, force: true });
});

const allow = () => ({ allowLoopback: true, ca: cert.cert });

describe("client metadata documents", () => {
  it("fetches and validates a document whose client_id is its own URL", async () => {
    const d = await fetchClientMetadata(`${host.origin}/ok.json`, allow());
    expect(d).toEqual({
      client_id: `${host.origin}/ok.json`,
      client_name: "Doc client",
      redirect_uris: ["https://app.example/cb"],
    });
  });

  it("refuses a document larger than the cap, declared or streamed", async () => {
    await expect(fetchClientMetadata(`${host.origin}/big.json`, allow())).rejects.toThrow(/larger than 65536 bytes/);
    await expect(fetchClientMetadata(`${host.origin}/chunked-big.json`, allow())).rejects.toThrow(/larger than/);
  });

  it("gives up on a host that does not answer in time", async () => {
    await expect(fetchClientMetadata(`${host.origin}/slow.json`, { ...allow(), timeoutMs: 300 })).rejects.toThrow(
      /did not answer within 300 ms/,
    );
  });

  it("does not follow redirects", async () => {
    await expect(fetchClientMetadata(`${host.origin}/redirect.json`, allow())).rejects.toThrow(/redirect/);
  });

  it("refuses loopback without the dev setting, by literal address and by name", async () => {
    await expect(
      fetchClientMetadata(`${host.origin}/ok.json`, { allowLoopback: false, ca: cert.cert }),
    ).rejects.toThrow(/loopback/);
    const port = new URL(host.origin).port;
    await expect(
      fetchClientMetadata(`https://localhost:${port}/ok.json`, { allowLoopback: false, ca: cert.cert }),
    ).rejects.toThrow(/loopback/);
  });

  it("refuses private, link-local and reserved addresses even with the dev setting", async () => {
    for (const url of [
      "https://10.1.2.3/c.json",
      "https://169.254.169.254/latest",
      "https://[fe80::1]/c.json",
      "https://192.168.0.5/c",
    ]) {
      await expect(fetchClientMetadata(url, allow())).rejects.toThrow(/private, link-local or reserved/);
    }
    expect(refusedAddress("::ffff:10.0.0.1", true)).toMatch(/private/);
    expect(refusedAddress("fd00::5", true)).toMatch(/private/);
    expect(refusedAddress("100.64.1.1", true)).toMatch(/private/);
    expect(refusedAddress("127.0.0.1", false)).toMatch(/loopback/);
    expect(refusedAddress("127.0.0.1", true)).toBeNull();
    expect(refusedAddress("93.184.215.14", false)).toBeNull();
    expect(refusedAddress("2606:4700::1111", false)).toBeNull();
  });

  it("refuses non-https URLs, a document naming another client_id, and a confidential client", async () => {
    await expect(fetchClientMetadata("http://app.example/client.json", allow())).rejects.toThrow(/https/);
    await expect(fetchClientMetadata("https://app.example/", allow())).rejects.toThrow(/path/);
    await expect(fetchClientMetadata(`${host.origin}/other-id.json`, allow())).rejects.toThrow(/not its own URL/);
    await expect(fetchClientMetadata(`${host.origin}/secret-client.json`, allow())).rejects.toThrow(/public client/);
  });
});
