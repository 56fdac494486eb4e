/** The link against a scripted fake Server: protocol errors close and reconnect; requests are answered. */
import type { AddressInfo } from "node:net";
import {
  MAX_EVENT_TEXT_BYTES,
  MAX_FRAME_BYTES,
  MAX_MESSAGE_LENGTH,
  PROTOCOL_VERSION,
  parseRunnerFrame,
  RunnerFrame,
} from "@webcodex/protocol";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { type WebSocket, WebSocketServer } from "ws";
import { IN_PROCESS_POLL_MS, IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import { FakeRunService } from "../../../server/test/support/fake-run-service.js";
import { chunkUpdate, type LinkHandle, startLink } from "../../src/link/link.js";

interface Peer {
  ws: WebSocket;
  frames: Array<Record<string, unknown>>;
  auth: string | undefined;
}

async function fakeServer() {
  const wss = new WebSocketServer({ port: 0, host: "127.0.0.1" });
  await new Promise((r) => wss.once("listening", r));
  const peers: Peer[] = [];
  wss.on("connection", (ws, req) => {
    const peer: Peer = { ws, frames: [], auth: req.headers.authorization };
    ws.on("message", (d) => peer.frames.push(JSON.parse(String(d)) as Record<string, unknown>));
    peers.push(peer);
  });
  return { wss, peers, url: `ws://127.0.0.1:${(wss.address() as AddressInfo).port}/runner` };
}

/** A run on the fake service, admitted on its current instance. */
function startRun(svc: FakeRunService, run_id: string) {
  return svc.start({
    run_id,
    intent_fingerprint: "a".repeat(64),
    project_id: "demo",
    provider_id: "fake",
    provider_instance_id: svc.providerInstanceId,
    agent_instance_id: svc.agentInstanceId,
    prompt: "p",
  } as never);
}

const ack = {
  type: "hello.ack",
  runner_id: "r1",
  server_instance_id: "server_instance_0001",
  heartbeat_interval_ms: 1000,
  resume_secret: "resume_secret_for_tests_0000000000000000000",
};

describe("runner link protocol", () => {
  let link: LinkHandle | undefined;
  let close: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await link?.close();
    await close?.();
  });

  it("sends the bearer token and a hello with inventory, then answers requests through the RunService", async () => {
    const s = await fakeServer();
    close = () => new Promise((r) => s.wss.close(() => r()));
    const svc = new FakeRunService();
    link = startLink({ url: s.url, token: "tok-123", service: svc, logger: pino({ level: "silent" }) });
    const peer = await poll(() => (s.peers[0]?.frames.length ? s.peers[0] : undefined), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(peer.auth).toBe("Bearer tok-123");
    expect(peer.frames[0]).toMatchObject({
      type: "hello",
      protocol_version: PROTOCOL_VERSION,
      agent_instance_id: svc.agentInstanceId,
      inventory: [],
    });
    peer.ws.send(JSON.stringify(ack));
    await poll(() => link?.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    peer.ws.send(
      JSON.stringify({
        type: "run.sync",
        request_id: "q2",
        run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa",
        after_seq: 0,
        max_events: 10,
      }),
    );
    await poll(() => peer.frames.length >= 2, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    expect(peer.frames[1]).toMatchObject({ type: "error", request_id: "q2", code: "not_found" });
  });

  it("answers run.sync for a ring of 1000 CJK events with one frame within MAX_FRAME_BYTES and has_more", async () => {
    const s = await fakeServer();
    close = () => new Promise((r) => s.wss.close(() => r()));
    const svc = new FakeRunService();
    const runId = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
    await startRun(svc, runId);
    // 1365 three-byte characters: a full 4 KiB text body, but only ~1.4 K UTF-16 units.
    const text = "漢".repeat(Math.floor(MAX_EVENT_TEXT_BYTES / 3));
    svc.emit(
      runId,
      Array.from({ length: 1000 }, () => ({ kind: "agent_message" as const, text, truncated: false })),
      { silent: true },
    );
    const raw: Buffer[] = [];
    s.wss.on("connection", (ws) => ws.on("message", (d) => raw.push(Buffer.from(d as Buffer))));
    link = startLink({ url: s.url, token: "t", service: svc, logger: pino({ level: "silent" }) });
    const peer = await poll(() => (s.peers[0]?.frames.length ? s.peers[0] : undefined), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    peer.ws.send(JSON.stringify(ack));
    await poll(() => link?.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    peer.ws.send(JSON.stringify({ type: "run.sync", request_id: "q1", run_id: runId, after_seq: 0, max_events: 1000 }));
    const reply = await poll(() => peer.frames.find((f) => f.request_id === "q1"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(reply).toMatchObject({ type: "run.sync.result", has_more: true });
    const events = reply.events as Array<{ seq: number }>;
    expect(events.length).toBeGreaterThan(0);
    expect(events.length).toBeLessThan(1000);
    expect(events[0]?.seq).toBe(1);
    const frameBytes = raw.map((b) => b.byteLength);
    expect(Math.max(...frameBytes)).toBeLessThanOrEqual(MAX_FRAME_BYTES);
    expect(parseRunnerFrame(raw.find((b) => b.includes('"q1"'))?.toString("utf8")).ok).toBe(true);
  });

  it("sends a pushed batch that fits as one run.update, and splits one that does not", async () => {
    const s = await fakeServer();
    close = () => new Promise((r) => s.wss.close(() => r()));
    const svc = new FakeRunService();
    const run_id = "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa";
    await startRun(svc, run_id);
    link = startLink({ url: s.url, token: "t", service: svc, logger: pino({ level: "silent" }) });
    const peer = await poll(() => (s.peers[0]?.frames.length ? s.peers[0] : undefined), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    peer.ws.send(JSON.stringify(ack));
    await poll(() => link?.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    const body = (i: number) => ({ kind: "agent_message" as const, text: `m${i}`, truncated: false });
    const updates = () => peer.frames.filter((f) => f.type === "run.update") as { events: { seq: number }[] }[];
    svc.emit(
      run_id,
      Array.from({ length: 10 }, (_, i) => body(i)),
    );
    await poll(() => updates().length === 1, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    expect(updates()[0]?.events).toHaveLength(10);
    // A service that ignores the RunUpdateListener bound still gets frames the protocol accepts.
    svc.emit(
      run_id,
      Array.from({ length: 600 }, (_, i) => body(i)),
    );
    await poll(() => updates().flatMap((u) => u.events).length === 610, {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(updates().map((u) => u.events.length)).toEqual([10, 256, 256, 88]);
    expect(updates().flatMap((u) => u.events.map((e) => e.seq))).toEqual(Array.from({ length: 610 }, (_, i) => i + 1));
    for (const f of peer.frames) expect(parseRunnerFrame(JSON.stringify(f)).ok).toBe(true);
  });

  it("splits pushed updates of non-ASCII events by UTF-8 bytes, each frame within MAX_FRAME_BYTES", () => {
    const text = "漢".repeat(Math.floor(MAX_EVENT_TEXT_BYTES / 3));
    const events = Array.from({ length: 256 }, (_, i) => ({
      seq: i + 1,
      at: "t",
      kind: "agent_message" as const,
      text,
      truncated: false,
    }));
    const frames = chunkUpdate({} as never, events);
    expect(frames.length).toBeGreaterThan(1);
    for (const f of frames) expect(Buffer.byteLength(JSON.stringify(f), "utf8")).toBeLessThanOrEqual(MAX_FRAME_BYTES);
  });

  it("leaves an inventory row the protocol rejects out of hello, and answers requests about it with an error", async () => {
    const s = await fakeServer();
    close = () => new Promise((r) => s.wss.close(() => r()));
    const svc = new FakeRunService();
    const ids = ["wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa", "wc_agent_run_bbbbbbbbbbbbbbbbbbbbbbbbbb"] as const;
    for (const run_id of ids) await startRun(svc, run_id);
    const bad = svc.runs.get(ids[0]);
    if (!bad) throw new Error("no run");
    bad.summary = { ...bad.summary, message: "m".repeat(MAX_MESSAGE_LENGTH + 1) };
    const lines: string[] = [];
    link = startLink({
      url: s.url,
      token: "t",
      service: svc,
      logger: pino({ level: "error" }, { write: (l: string) => lines.push(l) }),
      backoffInitialMs: 20,
    });
    const peer = await poll(() => (s.peers[0]?.frames.length ? s.peers[0] : undefined), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    const hello = peer.frames[0] as { type: string; inventory: Array<{ run_id: string }> };
    expect(hello.type).toBe("hello");
    expect(hello.inventory.map((r) => r.run_id)).toEqual([ids[1]]);
    expect(lines.some((l) => l.includes('"type":"hello"') && l.includes('"path":"message"'))).toBe(true);
    peer.ws.send(JSON.stringify(ack));
    await poll(() => link?.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    peer.ws.send(JSON.stringify({ type: "run.sync", request_id: "q1", run_id: ids[0], after_seq: 0, max_events: 10 }));
    peer.ws.send(JSON.stringify({ type: "run.sync", request_id: "q2", run_id: ids[1], after_seq: 0, max_events: 10 }));
    await poll(() => peer.frames.length >= 3, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    expect(peer.frames.find((f) => f.request_id === "q1")).toEqual({
      type: "error",
      request_id: "q1",
      code: "internal",
      message: "The Runner could not encode the reply.",
    });
    expect(peer.frames.find((f) => f.request_id === "q2")).toMatchObject({
      type: "run.sync.result",
      run: { run_id: ids[1] },
    });
    for (const f of peer.frames) expect(RunnerFrame.safeParse(f).success).toBe(true);
    expect(s.peers.length).toBe(1);
    expect(lines.some((l) => l.includes('"type":"run.sync.result"') && l.includes('"path":"run.message"'))).toBe(true);
  });

  it("answers a malformed frame with protocol_error, closes, and reconnects with a fresh hello", async () => {
    const s = await fakeServer();
    close = () => new Promise((r) => s.wss.close(() => r()));
    link = startLink({
      url: s.url,
      token: "t",
      service: new FakeRunService(),
      logger: pino({ level: "silent" }),
      backoffInitialMs: 20,
    });
    const first = await poll(() => (s.peers[0]?.frames.length ? s.peers[0] : undefined), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    first.ws.send(JSON.stringify(ack));
    await poll(() => link?.connected, { timeoutMs: IN_PROCESS_WAIT_MS, intervalMs: IN_PROCESS_POLL_MS });
    first.ws.send(JSON.stringify({ type: "run.start", request_id: "x", surprise: true }));
    await poll(() => first.frames.find((f) => f.type === "protocol_error"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    const second = await poll(() => (s.peers[1]?.frames.length ? s.peers[1] : undefined), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(second.frames[0]).toMatchObject({ type: "hello" });
  });

  it("refuses requests before hello.ack", async () => {
    const s = await fakeServer();
    close = () => new Promise((r) => s.wss.close(() => r()));
    link = startLink({
      url: s.url,
      token: "t",
      service: new FakeRunService(),
      logger: pino({ level: "silent" }),
      backoffInitialMs: 20,
    });
    const peer = await poll(() => (s.peers[0]?.frames.length ? s.peers[0] : undefined), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    peer.ws.send(
      JSON.stringify({ type: "run.cancel", request_id: "q1", run_id: "wc_agent_run_aaaaaaaaaaaaaaaaaaaaaaaaaa" }),
    );
    await poll(() => peer.frames.find((f) => f.type === "protocol_error"), {
      timeoutMs: IN_PROCESS_WAIT_MS,
      intervalMs: IN_PROCESS_POLL_MS,
    });
    expect(peer.frames.find((f) => f.type === "protocol_error")).toMatchObject({ code: "unexpected_frame" });
  });
});
