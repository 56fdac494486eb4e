import { encodeFrame, type HelloFrame, PROTOCOL_VERSION } from "@webcodex/protocol";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { SERVER_SILENT_INTERVALS } from "../../../runner/src/link/link.js";
import { HEARTBEAT_TIMEOUT_INTERVALS } from "../../src/link/hub.js";
import { RunnerTokenStore } from "../../src/link/runner-tokens.js";
import { FakeRunService } from "../support/fake-run-service.js";
import { Harness } from "../support/in-process.js";

/** Bound on a new connection being granted the link once the old one is gone. */
const GRANT_WAIT_MS = 10_000;

const RUNNERS = [
  { id: "r1", token: "token-one-aaaaaaaaaaaaaaaa", projects: ["demo"] },
  { id: "r2", token: "token-two-bbbbbbbbbbbbbbbb", projects: ["other"] },
];

function hello(service: FakeRunService): HelloFrame {
  return { type: "hello", protocol_version: PROTOCOL_VERSION, ...service.helloBody(), inventory: [] };
}

interface Client {
  ws: WebSocket;
  frames: Array<Record<string, unknown>>;
  closed: Promise<number>;
  status: Promise<number | null>;
}

function connect(h: Harness, token: string | null): Client {
  const ws = new WebSocket(h.wsUrl(), token === null ? {} : { headers: { authorization: `Bearer ${token}` } });
  const frames: Array<Record<string, unknown>> = [];
  ws.on("message", (d) => frames.push(JSON.parse(String(d)) as Record<string, unknown>));
  const status = new Promise<number | null>((resolve) => {
    ws.on("unexpected-response", (_req, res) => {
      resolve(res.statusCode ?? null);
      res.resume();
    });
    ws.on("open", () => resolve(null));
  });
  ws.on("error", () => {});
  const closed = new Promise<number>((resolve) => ws.on("close", (code) => resolve(code)));
  return { ws, frames, closed, status };
}

async function opened(c: Client): Promise<void> {
  if (c.ws.readyState === WebSocket.OPEN) return;
  await new Promise<void>((resolve, reject) => {
    c.ws.once("open", () => resolve());
    c.ws.once("close", () => reject(new Error("closed before open")));
  });
}

describe("runner hub", () => {
  let h: Harness;
  afterEach(async () => {
    await h.close();
  });

  it("refuses a missing or wrong token with 401 and never logs the token", async () => {
    h = await new Harness().start(RUNNERS);
    expect(await connect(h, null).status).toBe(401);
    const wrong = canary("runner-token");
    expect(await connect(h, wrong).status).toBe(401);
    const logs = h.log.lines.join("");
    expect(logs).toContain("runner upgrade refused");
    expect(logs).not.toContain(wrong);
    expect(logs).not.toContain(RUNNERS[0]?.token);
  });

  it("accepts hello and answers hello.ack", async () => {
    h = await new Harness().start(RUNNERS);
    const c = connect(h, RUNNERS[0]!.token);
    await opened(c);
    c.ws.send(encodeFrame(hello(new FakeRunService())));
    await poll(() => c.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(c.frames[0]).toMatchObject({ type: "hello.ack", runner_id: "r1" });
    c.ws.close();
  });

  it("closes only the connection that sends a malformed frame", async () => {
    h = await new Harness().start(RUNNERS);
    const good = connect(h, RUNNERS[1]!.token);
    await opened(good);
    good.ws.send(encodeFrame(hello(new FakeRunService({ projects: [{ project_id: "other", allow_patch: true }] }))));
    await poll(() => good.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });

    for (const bad of ["{not json", JSON.stringify({ type: "hello", extra: 1 }), JSON.stringify({ type: "nope" })]) {
      const c = connect(h, RUNNERS[0]!.token);
      await opened(c);
      c.ws.send(bad);
      await c.closed;
      expect(c.frames.at(-1)).toMatchObject({ type: "protocol_error" });
    }
    expect(good.ws.readyState).toBe(WebSocket.OPEN);
    expect(
      await h.server.runs.listProjects({ id: "x", scopes: new Set(["project:read"]), projects: new Set(["other"]) }),
    ).toEqual([expect.objectContaining({ project_id: "other", runner_online: true })]);
    good.ws.close();
  });

  it("keeps a live link through a stall of its own event loop longer than the heartbeat timeout", async () => {
    h = await new Harness().start(RUNNERS);
    const intervalMs = h.config.heartbeatIntervalMs;
    const c = connect(h, RUNNERS[0]!.token);
    await opened(c);
    c.ws.send(encodeFrame(hello(new FakeRunService())));
    await poll(() => c.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    // Right after the hub's next ping, this process (the Server's and the peer's) is held past the timeout:
    // the peer's pong is read only after the hub's next, late tick.
    let pings = 0;
    const ping = WebSocket.prototype.ping;
    WebSocket.prototype.ping = function (this: WebSocket, ...args: Parameters<WebSocket["ping"]>) {
      ping.apply(this, args);
      pings += 1;
      if (pings === 1) {
        const until = Date.now() + (HEARTBEAT_TIMEOUT_INTERVALS + 0.5) * intervalMs;
        while (Date.now() < until) {
          // held
        }
      }
    };
    try {
      // Two more pings after the stall were each answered in time: the link was judged, and kept.
      await poll(() => pings >= 4, { timeoutMs: IN_PROCESS_WAIT_MS + 4 * intervalMs, intervalMs: IN_PROCESS_POLL_MS });
    } finally {
      WebSocket.prototype.ping = ping;
    }
    expect(c.ws.readyState).toBe(WebSocket.OPEN);
    expect(h.log.lines.join("")).not.toContain("missed a heartbeat");
    c.ws.close();
  });

  it("keeps a Runner's link through a stall of the Runner's event loop longer than its silence bound", async () => {
    h = await new Harness().start(RUNNERS);
    const intervalMs = h.config.heartbeatIntervalMs;
    const link = h.link(new FakeRunService(), RUNNERS[0]!.token);
    await poll(() => link.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    // The Runner (here in this process) is held past SERVER_SILENT_INTERVALS; what the Server sent meanwhile is
    // read only after the Runner's next, late tick.
    const until = Date.now() + (SERVER_SILENT_INTERVALS + 0.5) * intervalMs;
    while (Date.now() < until) {
      // held
    }
    let pings = 0;
    const ping = WebSocket.prototype.ping;
    WebSocket.prototype.ping = function (this: WebSocket, ...args: Parameters<WebSocket["ping"]>) {
      ping.apply(this, args);
      pings += 1;
    };
    try {
      await poll(() => pings >= 3, { timeoutMs: IN_PROCESS_WAIT_MS + 3 * intervalMs, intervalMs: IN_PROCESS_POLL_MS });
    } finally {
      WebSocket.prototype.ping = ping;
    }
    expect(link.connected).toBe(true);
    expect(h.log.lines.join("")).not.toContain("server silent");
  });

  it("requires hello as the first frame", async () => {
    h = await new Harness().start(RUNNERS);
    const c = connect(h, RUNNERS[0]!.token);
    await opened(c);
    c.ws.send(encodeFrame({ type: "heartbeat", sent_at: new Date().toISOString() }));
    await c.closed;
    expect(c.frames.at(-1)).toMatchObject({ type: "protocol_error", code: "unexpected_frame" });
  });

  it("refuses a runner advertising a project bound to another runner, with a logged reason", async () => {
    h = await new Harness().start(RUNNERS);
    const c = connect(h, RUNNERS[0]!.token);
    await opened(c);
    c.ws.send(encodeFrame(hello(new FakeRunService({ projects: [{ project_id: "other", allow_patch: true }] }))));
    await c.closed;
    expect(c.frames.at(-1)).toMatchObject({ type: "protocol_error", code: "unauthorized_project" });
    expect(h.log.lines.join("")).toContain("not bound to project(s): other");
  });

  it("lets the same Runner process resume its live link with the resume secret, fencing the older connection", async () => {
    h = await new Harness().start(RUNNERS);
    const svc = new FakeRunService();
    const old = connect(h, RUNNERS[0]!.token);
    await opened(old);
    old.ws.send(encodeFrame(hello(svc)));
    const ack = await poll(() => old.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(ack.resume_secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const newer = connect(h, RUNNERS[0]!.token);
    await opened(newer);
    newer.ws.send(encodeFrame({ ...hello(svc), resume_secret: String(ack.resume_secret) }));
    const resumed = await poll(() => newer.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(resumed.resume_secret).toBe(ack.resume_secret);
    await old.closed;
    expect(old.frames.at(-1)).toMatchObject({ type: "protocol_error", code: "replaced" });
    expect(newer.ws.readyState).toBe(WebSocket.OPEN);
    const events = async () =>
      (await h.rows<{ event: string }>("SELECT event FROM runner_link_audit ORDER BY id")).map((r) => r.event);
    await poll(async () => (await events()).length >= 2, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
      what: "both links audited",
    });
    expect(await events()).toEqual(["link_granted", "link_resumed"]);
    newer.ws.close();
  });

  it("refuses a hello without the live link's resume secret with link_in_use, audits it, and keeps the live link", async () => {
    h = await new Harness().start(RUNNERS);
    const live = connect(h, RUNNERS[0]!.token);
    await opened(live);
    live.ws.send(encodeFrame(hello(new FakeRunService())));
    await poll(() => live.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    for (const secret of [undefined, "x".repeat(43)]) {
      const impostor = connect(h, RUNNERS[0]!.token);
      await opened(impostor);
      impostor.ws.send(encodeFrame({ ...hello(new FakeRunService()), ...(secret ? { resume_secret: secret } : {}) }));
      await impostor.closed;
      expect(impostor.frames).toEqual([expect.objectContaining({ type: "protocol_error", code: "link_in_use" })]);
    }
    expect(live.ws.readyState).toBe(WebSocket.OPEN);
    expect(live.frames.some((f) => f.type === "protocol_error")).toBe(false);
    expect(h.log.lines.join("")).toContain("possible impersonation");
    // The two refusals share one counted row (LINK_REFUSAL_AUDIT_WINDOW_MS); audit rows are written after
    // the decision, in turn.
    const audited = () =>
      h.rows<{ event: string; count: number }>("SELECT event, count FROM runner_link_audit ORDER BY id");
    await poll(async () => (await audited()).at(-1)?.count === 2, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
      what: "the second refusal counted",
    });
    expect(await audited()).toEqual([
      { event: "link_granted", count: 1 },
      { event: "link_refused_in_use", count: 2 },
    ]);
    live.ws.close();
  });

  it("grants a new Runner process the link once the old connection dropped and its lease ran out", async () => {
    h = await new Harness().start(RUNNERS);
    const old = connect(h, RUNNERS[0]!.token);
    await opened(old);
    old.ws.send(encodeFrame(hello(new FakeRunService())));
    await poll(() => old.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    old.ws.terminate(); // a crash: no close handshake, so the lease runs for the heartbeat timeout
    let granted: Client | undefined;
    let refusals = 0;
    await poll(
      async () => {
        const next = connect(h, RUNNERS[0]!.token);
        await opened(next);
        next.ws.send(encodeFrame(hello(new FakeRunService())));
        const first = await poll(() => next.frames[0], {
          timeoutMs: IN_PROCESS_WAIT_MS,
          intervalMs: IN_PROCESS_POLL_MS,
        });
        if (first.type === "hello.ack") granted = next;
        else refusals++;
        return granted;
      },
      { timeoutMs: GRANT_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS },
    );
    // Refused while the lease was live, granted once it ran out (2 × 1000 ms in the harness), within the poll's
    // GRANT_WAIT_MS.
    expect(refusals).toBeGreaterThan(0);
    granted?.ws.close();
  });

  it("keeps a rotated runner token across a Server restart: the config token stays refused, the new one works", async () => {
    h = await new Harness().start(RUNNERS);
    const fresh = await new RunnerTokenStore(h.server.store.engine).rotate("r1");
    await h.restartServer();
    expect(h.log.lines.join("")).toContain("these runners' tokens were rotated");
    expect(await connect(h, RUNNERS[0]!.token).status).toBe(401);
    const c = connect(h, fresh);
    await opened(c);
    c.ws.send(encodeFrame(hello(new FakeRunService())));
    await poll(() => c.frames.find((f) => f.type === "hello.ack"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(await connect(h, RUNNERS[1]!.token).status).toBeNull(); // other runners keep their config tokens
    c.ws.close();
  });

  it("terminates a connection that stops answering pings", async () => {
    h = await new Harness().start(RUNNERS);
    const ws = new WebSocket(h.wsUrl(), { headers: { authorization: `Bearer ${RUNNERS[0]!.token}` }, autoPong: false });
    const closed = new Promise<void>((r) => ws.on("close", () => r()));
    ws.on("error", () => {});
    await new Promise((r) => ws.once("open", r));
    ws.send(encodeFrame(hello(new FakeRunService())));
    await closed;
    expect(h.log.lines.join("")).toContain("missed a heartbeat");
  });
});
