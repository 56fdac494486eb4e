/**
 * Instances trust only each other, and only after checking (issue 39 §4, design §14), against real HTTP
 * servers and sockets on 127.0.0.1:
 *
 * - stalled ~1 MB POSTs without a signature are refused from their headers alone (401, connection closed),
 *   no body byte held; stalled ones with a signature of the right form hold at most
 *   CLUSTER_UNVERIFIED_BYTES_TOTAL together (503 beyond), released when they go;
 * - an answer rewritten between the instances (a proxy at the holder's URL), stripped of its signature, or
 *   signed by another instance is refused: the caller's outcome is unknown and never carries the forged text;
 * - plain http:// to a non-loopback peer is not sent unless opted in;
 * - 2,000 refused signatures from one address are logged in a few lines that carry their count.
 */
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import http from "node:http";
import net from "node:net";
import { Writable } from "node:stream";
import { type RunEvent, RunnerFrame } from "@webcodex/protocol";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { CLUSTER_LINK_REQUEST_PATH, handleLinkRequest } from "../../src/cluster/link-request.js";
import {
  CLUSTER_MAX_BODY_BYTES,
  CLUSTER_SIGNATURE_HEADER,
  CLUSTER_TIMESTAMP_HEADER,
  CLUSTER_UNVERIFIED_BYTES_TOTAL,
  PeerAuth,
  signedHeaders,
} from "../../src/cluster/peer-auth.js";
import type { Post } from "../../src/cluster/peer-http.js";
import { guardInsecurePeers } from "../../src/cluster/peer-url.js";
import { RemoteRunnerConnection } from "../../src/cluster/remote-runner.js";
import type { RequestOutcome, RunnerRequest } from "../../src/link/hub.js";
import { AGENT_INSTANCE, HOLDER, KEY, RUN_ID, until } from "../support/run-pushes.js";
import { runSummary } from "../support/run-summary.js";

const silent = pino({ level: "silent" });
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const SYNC: RunnerRequest = { type: "run.sync", run_id: RUN_ID, after_seq: 0, max_events: 10 };

async function listen(server: http.Server): Promise<number> {
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  cleanups.push(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });
  return (server.address() as net.AddressInfo).port;
}

/** A holder: link requests checked by `auth`, each answered with a run.sync.result carrying `text`. */
async function holder(auth: PeerAuth, text: string): Promise<number> {
  const event: RunEvent = { seq: 1, at: new Date().toISOString(), kind: "agent_message", text, truncated: false };
  const answer: RequestOutcome = {
    ok: true,
    frame: {
      type: "run.sync.result",
      request_id: "q1",
      run: runSummary({
        run_id: RUN_ID,
        agent_instance_id: AGENT_INSTANCE,
        provider_instance_id: "provider-instance-1",
        last_seq: 1,
      }),
      events: [event],
      has_more: false,
    },
  };
  expect(RunnerFrame.safeParse(answer.ok ? answer.frame : null).success).toBe(true);
  return await listen(http.createServer((req, res) => void handleLinkRequest(req, res, auth, async () => answer)));
}

/** A proxy at the holder's URL: forwards each request, and hands back `rewrite` of the answer. */
async function proxy(
  target: number,
  rewrite: (status: number, headers: http.IncomingHttpHeaders, body: string) => [http.IncomingHttpHeaders, string],
): Promise<number> {
  return await listen(
    http.createServer((req, res) => {
      const up = http.request(
        { host: "127.0.0.1", port: target, path: req.url, method: req.method, headers: req.headers },
        async (answer) => {
          const chunks: Buffer[] = [];
          for await (const c of answer) chunks.push(c as Buffer);
          const [headers, body] = rewrite(answer.statusCode ?? 0, answer.headers, Buffer.concat(chunks).toString());
          delete headers["content-length"];
          res.writeHead(answer.statusCode ?? 0, headers).end(body);
        },
      );
      req.pipe(up);
    }),
  );
}

/** A raw connection that sends `head` and `bodyBytes` of a body, then stalls; what it is answered. */
function stalledPost(port: number, headers: Record<string, string>, declared: number, bodyBytes: number) {
  const socket = net.connect(port, "127.0.0.1");
  socket.setNoDelay(true);
  let received = "";
  socket.on("data", (d: Buffer) => {
    received += d.toString("latin1");
  });
  const closed = new Promise<void>((resolve) => socket.once("close", () => resolve()));
  socket.on("error", () => undefined); // refused and closed by the peer mid-body
  const lines = Object.entries({ ...headers, host: "127.0.0.1", "content-length": String(declared) })
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("");
  socket.write(`POST ${CLUSTER_LINK_REQUEST_PATH} HTTP/1.1\r\n${lines}\r\n`);
  socket.write(Buffer.alloc(bodyBytes, 0x7b));
  cleanups.push(() => void socket.destroy());
  return { socket, received: () => received, closed };
}

describe("a peer's request is checked before its body is read", () => {
  it("refuses stalled unsigned ~1 MB POSTs from their headers and bounds the unverified bodies in total", async () => {
    const auth = new PeerAuth(KEY, HOLDER, silent);
    let executed = 0;
    const port = await listen(
      http.createServer(
        (req, res) =>
          void handleLinkRequest(req, res, auth, async () => {
            executed += 1;
            return { ok: false, reason: "busy" };
          }),
      ),
    );
    const MB = 1_000_000;
    // 300 unsigned, each declaring 1 MB and sending 64 KB of it: every one refused at once, nothing held.
    const unsigned = Array.from({ length: 300 }, () => stalledPost(port, {}, MB, 64 * 1024));
    await Promise.all(unsigned.map((p) => p.closed));
    for (const p of unsigned) {
      expect(p.received()).toMatch(/^HTTP\/1\.1 401 /);
      expect(p.received().toLowerCase()).toContain("connection: close");
    }
    expect(auth.counts.refused_before_body).toBe(300);
    expect(auth.counts.unverified_bytes_peak).toBe(0);

    // With a timestamp and a signature of the right form (it may still be wrong): read, but at most
    // CLUSTER_UNVERIFIED_BYTES_TOTAL of them at once; the rest answered 503 before a byte of theirs is read.
    const fits = Math.floor(CLUSTER_UNVERIFIED_BYTES_TOTAL / MB);
    const looksSigned = () => ({
      [CLUSTER_TIMESTAMP_HEADER]: String(Date.now()),
      [CLUSTER_SIGNATURE_HEADER]: randomBytes(32).toString("hex"),
    });
    const held = Array.from({ length: fits + 20 }, () => stalledPost(port, looksSigned(), MB, 1024));
    await until(
      () => held.filter((p) => p.received() !== "").length >= 20,
      "the requests past the budget refused",
      30_000,
    );
    const refused = held.filter((p) => p.received() !== "");
    for (const p of refused) expect(p.received()).toMatch(/^HTTP\/1\.1 503 /);
    expect(auth.counts.refused_busy).toBe(20);
    expect(auth.counts.unverified_bytes).toBe(fits * MB);
    expect(auth.counts.unverified_bytes_peak).toBeLessThanOrEqual(CLUSTER_UNVERIFIED_BYTES_TOTAL);
    // An oversized declaration is refused from its headers too.
    const huge = stalledPost(port, looksSigned(), CLUSTER_MAX_BODY_BYTES + 1, 10);
    await huge.closed;
    expect(huge.received()).toMatch(/^HTTP\/1\.1 413 /);

    // The stalled senders go: every reservation is given back, and a signed request is read again.
    for (const p of held) p.socket.destroy();
    await until(() => auth.counts.unverified_bytes === 0, "the reservations released", 30_000);
    const body = Buffer.from(JSON.stringify({ runner_id: "r1", frame: SYNC, timeout_ms: 1000 }));
    const res = await fetch(`http://127.0.0.1:${port}${CLUSTER_LINK_REQUEST_PATH}`, {
      method: "POST",
      headers: signedHeaders(KEY, body),
      body,
    });
    expect(res.status).toBe(200);
    expect(executed).toBe(1);
  }, 60_000);
});

describe("an answer between instances is the holder's own, for this request", () => {
  it("refuses an answer a proxy at the holder's URL rewrote, stripped or another instance signed", async () => {
    const real = "the holder's real text";
    const canary = randomBytes(24).toString("hex");
    const holderPort = await holder(new PeerAuth(KEY, HOLDER, silent), real);
    const conn = (port: number) =>
      new RemoteRunnerConnection("r1", HOLDER, `http://127.0.0.1:${port}`, KEY, 2_000, silent);

    // Straight to the holder: its answer comes back.
    const direct = await conn(holderPort).request(SYNC);
    expect(direct.ok && direct.frame.type === "run.sync.result" ? direct.frame.events[0] : null).toMatchObject({
      text: real,
    });

    const forging = await proxy(holderPort, (_s, h, body) => [h, body.replace(real, canary)]);
    const stripping = await proxy(holderPort, (_s, h, body) => {
      const { "x-webcodex-cluster-answer-signature": _sig, ...rest } = h;
      return [rest, body.replace(real, canary)];
    });
    for (const port of [forging, stripping]) {
      const outcome = await conn(port).request(SYNC);
      expect(outcome).toEqual({ ok: false, reason: "timeout" }); // unknown: nothing to take from it
      expect(JSON.stringify(outcome)).not.toContain(canary);
    }
    // Another instance of the cluster (same key) answering in the holder's place.
    const other = await holder(new PeerAuth(KEY, "another-instance-1", silent), canary);
    const outcome = await conn(other).request(SYNC);
    expect(outcome).toEqual({ ok: false, reason: "timeout" });
    expect(JSON.stringify(outcome)).not.toContain(canary);
  });
});

describe("plain http:// between instances", () => {
  it("is not sent to a non-loopback peer unless allow_insecure_transport", async () => {
    const sent: string[] = [];
    const post: Post = async (url) => {
      sent.push(url);
      return { kind: "failed", sent: false, code: "test" };
    };
    const lines: string[] = [];
    const log = pino({ level: "warn" }, new Writable({ write: (c, _e, cb) => cb(void lines.push(String(c))) }));
    const guarded = guardInsecurePeers(post, false, log);
    const body = Buffer.from("{}");
    expect(await guarded("http://10.0.0.5:7421/_wc/cluster/link-request", {}, body, 1_000, 100)).toEqual({
      kind: "failed",
      sent: false,
      code: "insecure_peer",
    });
    expect(sent).toEqual([]);
    expect(lines.join("")).toContain("allow_insecure_transport = true");
    for (const url of ["https://10.0.0.5:7421/x", "http://127.0.0.1:7421/x", "http://[::1]:7421/x"]) {
      await guarded(url, {}, body, 1_000, 100);
    }
    await guardInsecurePeers(post, true, log)("http://10.0.0.5:7421/x", {}, body, 1_000, 100);
    expect(sent).toEqual([
      "https://10.0.0.5:7421/x",
      "http://127.0.0.1:7421/x",
      "http://[::1]:7421/x",
      "http://10.0.0.5:7421/x",
    ]);
  });
});

describe("refusals between instances in the log", () => {
  it("logs 2,000 refused signatures from one address in a few lines that carry their count", async () => {
    const lines: { msg: string; suppressed?: number; remote?: string }[] = [];
    const log = pino(
      { level: "warn" },
      new Writable({ write: (c, _e, cb) => cb(void lines.push(JSON.parse(String(c)) as (typeof lines)[0])) }),
    );
    const auth = new PeerAuth(KEY, HOLDER, log);
    const port = await listen(
      http.createServer(
        (req, res) => void handleLinkRequest(req, res, auth, async () => ({ ok: false, reason: "busy" })),
      ),
    );
    const body = Buffer.from(JSON.stringify({ runner_id: "r1", frame: SYNC, timeout_ms: 1000 }));
    const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });
    cleanups.push(() => agent.destroy());
    const TOTAL = 2_000;
    const refusedOne = () =>
      new Promise<number>((resolve, reject) => {
        const req = http.request(
          {
            host: "127.0.0.1",
            port,
            path: CLUSTER_LINK_REQUEST_PATH,
            method: "POST",
            agent,
            headers: { ...signedHeaders(randomBytes(32), body), "content-length": String(body.length) },
          },
          (res) => {
            res.resume();
            res.on("end", () => resolve(res.statusCode ?? 0));
          },
        );
        req.on("error", reject);
        req.end(body);
      });
    const statuses: number[] = [];
    for (let i = 0; i < TOTAL; i += 50) {
      statuses.push(...(await Promise.all(Array.from({ length: 50 }, refusedOne))));
    }
    expect(statuses.every((s) => s === 401)).toBe(true);
    expect(auth.counts.refused_signature).toBe(TOTAL);
    // Each line stands for itself and the refusals it says were left out: together, all of them.
    const counted = () =>
      lines
        .filter((l) => l.msg.startsWith("cluster request refused"))
        .reduce(
          (n, l) => n + (l.msg.includes("more in this window") ? (l.suppressed ?? 0) : 1 + (l.suppressed ?? 0)),
          0,
        );
    await until(() => counted() === TOTAL, "the window's summary line", 30_000);
    const refusalLines = lines.filter((l) => l.msg.startsWith("cluster request refused"));
    expect(refusalLines.length).toBeLessThanOrEqual(12);
    expect(refusalLines.some((l) => (l.suppressed ?? 0) > 100)).toBe(true);
  }, 120_000);
});
