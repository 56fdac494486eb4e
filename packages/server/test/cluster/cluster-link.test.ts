/**
 * The caller's side of a forwarded link request (cluster/remote-runner.ts RemoteRunnerConnection) against a real HTTP
 * peer: what may be reported as not sent (the peer could not be reached, a run.start whose holder did not
 * prove it holds the lease, a refusal the holder signed), and what must stay unknown because the request may
 * have left (the connection dropped after it was written, a 5xx, an answer that does not parse, an answer
 * nobody or the wrong instance signed) — design §6.1: never report not_started for what may have been
 * delivered. And the holder's side round trip: a signed request reaches the executor with the frame intact.
 */
import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { refusedPort } from "../../../../scripts/test-support/index.js";
import { CLUSTER_HOLDER_PROOF_PATH, handleHolderProof } from "../../src/cluster/holder-proof.js";
import { handleLinkRequest } from "../../src/cluster/link-request.js";
import { PeerAuth } from "../../src/cluster/peer-auth.js";
import { RemoteRunnerConnection } from "../../src/cluster/remote-runner.js";
import type { RunnerRequest } from "../../src/link/hub.js";

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

function conn(url: string, k = key): RemoteRunnerConnection {
  return new RemoteRunnerConnection("r1", "peer", url, k, 2_000, log, { holderLease: "peer/1" });
}

const START: RunnerRequest = {
  type: "run.start",
  run_id: `wc_agent_run_${"d".repeat(26)}`,
  intent_fingerprint: "f".repeat(64),
  project_id: "demo",
  provider_id: "fake",
  agent_instance_id: `ai_${"a".repeat(22)}`,
  provider_instance_id: `pi_${"b".repeat(22)}`,
  prompt: "hello",
  config: {},
  timeout_secs: null,
};

describe("a forwarded link request's outcome on the caller", () => {
  it("is not_sent only when nothing can have been executed", async () => {
    const closed = `http://127.0.0.1:${await refusedPort()}`;
    expect(await conn(closed).request(SYNC)).toEqual({ ok: false, reason: "not_sent" });
    // A run.start leaves only after a proof the peer cannot give unsigned: nothing was sent.
    const paths: string[] = [];
    const refusing = await peer((req, res) => {
      paths.push(req.url ?? "");
      res.writeHead(401).end('{"error":"bad_signature"}');
    });
    expect(await conn(refusing).request(START)).toEqual({ ok: false, reason: "not_sent" });
    expect(paths).toEqual([CLUSTER_HOLDER_PROOF_PATH]);
    // A refusal the holder signed (it executed nothing).
    await new Promise<void>((r) => server?.close(() => r()));
    const auth = new PeerAuth(key, "peer", log);
    const signedRefusal = await peer((req, res) => {
      void handleLinkRequest(req, res, auth, async () => ({ ok: false, reason: "busy" }));
    });
    const bad = { ...SYNC, max_events: -1 } as RunnerRequest;
    expect(await conn(signedRefusal).request(bad)).toEqual({ ok: false, reason: "not_sent" });
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
    // An unsigned refusal may come from anything between the instances: it says nothing of what was done.
    await new Promise<void>((r) => server?.close(() => r()));
    const refusing = await peer((_req, res) => res.writeHead(401).end('{"error":"bad_signature"}'));
    expect(await conn(refusing).request(SYNC)).toEqual({ ok: false, reason: "timeout" });
  });

  it("reaches the holder's executor signed and intact, and carries its answer back", async () => {
    const seen: unknown[] = [];
    const auth = new PeerAuth(key, "peer", log);
    const url = await peer((req, res) => {
      if (req.url === CLUSTER_HOLDER_PROOF_PATH) {
        void handleHolderProof(req, res, auth, (runnerId, holder) => runnerId === "r1" && holder === "peer/1");
        return;
      }
      void handleLinkRequest(req, res, auth, async (runnerId, frame, timeoutMs, _i, _f, holder) => {
        seen.push({ runnerId, frame, timeoutMs, holder });
        return { ok: false, reason: "busy" };
      });
    });
    expect(await conn(url).request(SYNC, 1_500)).toEqual({ ok: false, reason: "busy" });
    expect(seen).toEqual([{ runnerId: "r1", frame: SYNC, timeoutMs: 1_500, holder: "peer/1" }]);
    // A start: the holder proved its lease first, then got the start naming it.
    expect(await conn(url).request(START, 1_500)).toEqual({ ok: false, reason: "busy" });
    expect(seen).toHaveLength(2);
    // A view of another lease of that instance: no proof, no start.
    const otherLease = new RemoteRunnerConnection("r1", "peer", url, key, 2_000, log, { holderLease: "peer/2" });
    expect(await otherLease.request(START)).toEqual({ ok: false, reason: "not_sent" });
    expect(seen).toHaveLength(2);
    // Another key: refused before the executor (unsigned, so a sync's outcome is unknown; a start never left).
    expect(await conn(url, randomBytes(32)).request(SYNC)).toEqual({ ok: false, reason: "timeout" });
    expect(await conn(url, randomBytes(32)).request(START)).toEqual({ ok: false, reason: "not_sent" });
    expect(seen).toHaveLength(2);
  });
});
