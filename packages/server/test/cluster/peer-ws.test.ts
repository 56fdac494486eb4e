/**
 * Requests between instances over standing WebSockets (cluster/peer-ws.ts), against a real HTTP server on
 * 127.0.0.1 serving the other instance's side: one channel carries every push to a peer and each gets its own
 * answer; forwarded run.syncs go over a channel of their own and cancels stay POSTs; a peer without the
 * channel gets POSTs (and is not asked again at once); a stuck channel is replaced; the peer refuses an
 * unsigned channel, a push with a wrong signature, a malformed push (which field), and a message that is
 * not a request at all.
 */
import { once } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import WebSocket from "ws";
import {
  CLUSTER_LINK_REQUEST_PATH,
  type ExecuteLinkRequest,
  handleLinkRequest,
  takeLinkRequest,
} from "../../src/cluster/link-request.js";
import { signedHeaders } from "../../src/cluster/peer-auth.js";
import { type PeerAnswer, type Post, postToPeer } from "../../src/cluster/peer-http.js";
import { type ChannelHandler, PeerChannelEndpoint, PeerChannels } from "../../src/cluster/peer-ws.js";
import { RemoteRunnerConnection } from "../../src/cluster/remote-runner.js";
import {
  CLUSTER_RUN_PUSH_PATH,
  handleRunPush,
  RUN_PUSH_ANSWER_MAX_BYTES,
  type RunPush,
  RunPushes,
  takeRunPush,
} from "../../src/cluster/run-push.js";
import {
  AGENT_INSTANCE,
  pushBody as bodyOf,
  event,
  FOLLOWER,
  HOLDER,
  KEY,
  peerAuth,
  RUN_ID,
  until,
  update,
} from "../support/run-pushes.js";

const pushBody = (n: number) => bodyOf(update(n, [event(n)]));

const log = pino({ level: "silent" });

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

type Transport = "post" | "channel";

/**
 * A peer instance: POSTs and (unless `channel: false`) channel upgrades on one listener, for pushes and link
 * requests; each records how it came. `answer` false: channels take requests and never answer (a stuck peer).
 */
async function followerPeer(opts: { channel?: boolean; answer?: boolean; instanceId?: string } = {}) {
  const auth = peerAuth(opts.instanceId ?? FOLLOWER);
  const pushes: { push: RunPush; by: Transport }[] = [];
  const requests: { type: string; by: Transport }[] = [];
  const apply = (by: Transport) => (p: RunPush) => {
    pushes.push({ push: p, by });
    return true;
  };
  const execute =
    (by: Transport): ExecuteLinkRequest =>
    async (_runnerId, frame) => {
      requests.push({ type: frame.type, by });
      return { ok: false, reason: "busy" };
    };
  const server = http.createServer((req, res) => {
    if (req.url === CLUSTER_LINK_REQUEST_PATH) void handleLinkRequest(req, res, auth, execute("post"));
    else void handleRunPush(req, res, auth, apply("post"));
  });
  const endpoint = new PeerChannelEndpoint(
    auth,
    new Map<string, ChannelHandler>([
      [CLUSTER_RUN_PUSH_PATH, { take: (body) => takeRunPush(body, apply("channel")), afterWoken: true }],
      [CLUSTER_LINK_REQUEST_PATH, { take: (body) => takeLinkRequest(body, execute("channel")) }],
    ]),
    log,
  );
  let upgrades = 0;
  if (opts.channel !== false) {
    server.on("upgrade", (req, socket, head) => {
      upgrades += 1;
      endpoint.handleUpgrade(req.url ?? "/", req, socket, head);
      if (opts.answer === false) {
        // The channel is accepted; everything it carries is left unread.
        socket.on("data", () => undefined);
        socket.pause();
      }
    });
  }
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  cleanups.push(async () => {
    endpoint.close();
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, pushes, requests, upgrades: () => upgrades };
}

function channels(http: Post = postToPeer): PeerChannels {
  const c = new PeerChannels(KEY, log, http);
  cleanups.push(() => c.close());
  return c;
}

describe("pushes over a standing channel to the following instance", () => {
  it("opens the channel when a peer is named a follower and sends every push over it, each with its own answer", async () => {
    const f = await followerPeer();
    const ch = channels();
    const pushes = new RunPushes(KEY, HOLDER, log, ch.post, (url) => ch.prepare(url));
    pushes.follow(RUN_ID, { instanceId: FOLLOWER, url: f.url });
    // Before any push: the first one does not wait for the upgrade.
    await until(() => f.upgrades() === 1, "the channel to be opened ahead of the first push");
    expect(ch.counts).toMatchObject({ pushes_by_channel: 0, pushes_by_post: 0 });
    for (let n = 1; n <= 5; n++) {
      pushes.updated(update(n, [event(n)]));
      await until(() => f.pushes.length === n && pushes.counts.pushes_sent === n, `push ${n}`);
    }
    // Unanswered pushes would have been failed and the follower dropped: every answer came back.
    await until(() => ch.counts.pushes_by_channel === 5, "the last answer");
    expect(pushes.counts.pushes_failed).toBe(0);
    expect(f.pushes.map((p) => [p.push.update, p.by])).toEqual([1, 2, 3, 4, 5].map((n) => [n, "channel"]));
    expect(f.upgrades()).toBe(1);
    expect(ch.counts).toMatchObject({ pushes_by_channel: 5, pushes_by_post: 0 });

    // Several at once, in flight together on the channel: each answer reaches its own push.
    const answers = await Promise.all(
      [6, 7, 8].map((n) => {
        const body = pushBody(n);
        return ch.post(`${f.url}${CLUSTER_RUN_PUSH_PATH}`, signedHeaders(KEY, body), body, 2_000, 1_024);
      }),
    );
    expect(answers).toEqual(
      [6, 7, 8].map(() => ({
        kind: "answered",
        status: 200,
        text: JSON.stringify({ following: true }),
        signer: FOLLOWER,
        signature: expect.stringMatching(/^[0-9a-f]{64}$/),
      })),
    );
    expect(f.upgrades()).toBe(1);
  });

  it("pushes as POSTs to a peer without the channel, and does not ask it again at once", async () => {
    const f = await followerPeer({ channel: false });
    const ch = channels();
    const pushes = new RunPushes(KEY, HOLDER, log, ch.post);
    pushes.follow(RUN_ID, { instanceId: FOLLOWER, url: f.url });
    for (let n = 1; n <= 3; n++) {
      pushes.updated(update(n, [event(n)]));
      await until(() => f.pushes.length === n && pushes.counts.pushes_sent === n, `push ${n}`);
    }
    await until(() => ch.counts.pushes_by_post === 3, "the third answer");
    expect(pushes.counts.pushes_failed).toBe(0);
    expect(f.pushes.map((p) => p.by)).toEqual(["post", "post", "post"]);
    expect(ch.counts.pushes_by_channel).toBe(0);
    expect(ch.channels).toBe(0);
  });

  it("fails a push nobody answers, replaces the silent channel, and fails what waits when closed", async () => {
    const stuck = await followerPeer({ answer: false });
    const ch = channels();
    const post = (n: number, timeoutMs: number): Promise<PeerAnswer> => {
      const body = pushBody(n);
      return ch.post(`${stuck.url}${CLUSTER_RUN_PUSH_PATH}`, signedHeaders(KEY, body), body, timeoutMs, 1_024);
    };
    expect(await post(1, 200)).toEqual({ kind: "failed", sent: true, code: "timeout" });
    await until(() => ch.channels === 0, "the silent channel to be closed");
    const waiting = post(2, 5_000);
    await until(() => stuck.upgrades() === 2 && ch.counts.pushes_by_channel === 2, "a new channel to carry it");
    ch.close();
    expect(await waiting).toEqual({ kind: "failed", sent: true, code: "closed" });
    expect(ch.counts).toMatchObject({ pushes_by_channel: 2, pushes_by_post: 0 });
  });

  it("refuses an unsigned channel, a wrong signature, a malformed push and a message that is no push", async () => {
    const f = await followerPeer();
    const wsUrl = `${f.url.replace("http:", "ws:")}${CLUSTER_RUN_PUSH_PATH}`;
    // The upgrade itself is signed.
    const unsigned = new WebSocket(wsUrl);
    unsigned.on("error", () => undefined); // terminated before it opened
    const [, res] = (await once(unsigned, "unexpected-response")) as [unknown, http.IncomingMessage];
    expect(res.statusCode).toBe(401);
    unsigned.terminate();
    const wrongKey = new WebSocket(wsUrl, { headers: signedHeaders(Buffer.alloc(32, 8), Buffer.alloc(0)) });
    wrongKey.on("error", () => undefined);
    const [, res2] = (await once(wrongKey, "unexpected-response")) as [unknown, http.IncomingMessage];
    expect(res2.statusCode).toBe(401);
    wrongKey.terminate();

    const ws = new WebSocket(wsUrl, { headers: signedHeaders(KEY, Buffer.alloc(0)) });
    cleanups.push(() => ws.terminate());
    await once(ws, "open");
    const ask = async (id: number, headers: Record<string, string>, body: Buffer) => {
      const ts = headers["x-webcodex-cluster-timestamp"];
      const sig = headers["x-webcodex-cluster-signature"];
      ws.send(Buffer.concat([Buffer.from(`${id} ${ts} ${sig}\n`), body]), { binary: false });
      const [data] = (await once(ws, "message")) as [Buffer];
      const text = data.toString("utf8");
      const nl = text.indexOf("\n");
      return { head: text.slice(0, nl), answer: JSON.parse(text.slice(nl + 1)) as Record<string, unknown> };
    };
    const good = pushBody(1);
    expect(await ask(1, signedHeaders(Buffer.alloc(32, 8), good), good)).toMatchObject({
      head: expect.stringMatching(/^1 401 follower-instance-1 [0-9a-f]{64}$/),
      answer: { error: "bad_signature" },
    });
    const stale = { ...signedHeaders(KEY, good), "x-webcodex-cluster-timestamp": "1" };
    expect(await ask(2, stale, good)).toMatchObject({
      head: expect.stringMatching(/^2 401 follower-instance-1 [0-9a-f]{64}$/),
      answer: { error: "stale_timestamp" },
    });
    const bad = Buffer.from(JSON.stringify({ ...JSON.parse(good.toString()), update: -1 }));
    expect(await ask(3, signedHeaders(KEY, bad), bad)).toMatchObject({
      head: expect.stringMatching(/^3 400 follower-instance-1 [0-9a-f]{64}$/),
      answer: { error: "invalid_request", message: expect.stringMatching(/^update: /) },
    });
    expect(f.pushes).toEqual([]);
    expect(await ask(4, signedHeaders(KEY, good), good)).toEqual({
      head: expect.stringMatching(/^4 200 follower-instance-1 [0-9a-f]{64}$/),
      answer: { following: true },
    });
    expect(f.pushes.map((p) => p.by)).toEqual(["channel"]);

    // No header line: no answer can be matched, the channel is closed.
    ws.send("not a push");
    const [code] = (await once(ws, "close")) as [number];
    expect(code).toBe(1008);
  });

  it("sends a forwarded run.sync over a channel, and a cancel as a POST", async () => {
    const f = await followerPeer({ instanceId: HOLDER });
    const ch = channels();
    const holder = new RemoteRunnerConnection("r1", HOLDER, f.url, KEY, 2_000, log, {
      agentInstanceId: AGENT_INSTANCE,
      syncPost: ch.post,
    });
    // The holder's answer ("busy") comes back through each transport as its outcome.
    for (let i = 0; i < 3; i++) {
      expect(await holder.request({ type: "run.sync", run_id: RUN_ID, after_seq: i, max_events: 10 })).toEqual({
        ok: false,
        reason: "busy",
      });
    }
    expect(await holder.request({ type: "run.cancel", run_id: RUN_ID })).toEqual({ ok: false, reason: "busy" });
    expect(f.requests).toEqual([
      { type: "run.sync", by: "channel" },
      { type: "run.sync", by: "channel" },
      { type: "run.sync", by: "channel" },
      { type: "run.cancel", by: "post" },
    ]);
    expect(f.upgrades()).toBe(1);
    // The cancel never reached ch.post: starts and cancels go straight to postToPeer.
    expect(ch.counts).toMatchObject({ link_requests_by_channel: 3, link_requests_by_post: 0 });
  });

  it("takes a channel's answer only from the instance it asked, signed for that request", async () => {
    // The peer at the holder's URL is another instance of the cluster (same key): its answers are not the holder's.
    const f = await followerPeer({ instanceId: FOLLOWER });
    const ch = channels();
    const holder = new RemoteRunnerConnection("r1", HOLDER, f.url, KEY, 2_000, log, { syncPost: ch.post });
    expect(await holder.request({ type: "run.sync", run_id: RUN_ID, after_seq: 0, max_events: 10 })).toEqual({
      ok: false,
      reason: "timeout",
    });
    expect(f.requests).toEqual([{ type: "run.sync", by: "channel" }]);
    // A push is taken only from its follower's answer; the same peer signing as FOLLOWER is that follower.
    const pushes = new RunPushes(KEY, HOLDER, log, ch.post);
    pushes.follow(RUN_ID, { instanceId: "not-that-follower-1", url: f.url });
    pushes.updated(update(1, [event(1)]));
    await until(() => pushes.counts.pushes_failed === 1, "the push refused as another instance's answer");
  });

  it("fails an answer longer than the push allows", async () => {
    const f = await followerPeer();
    const ch = channels();
    const body = pushBody(1);
    // The follower's answer (`{"following":true}`) is longer than 4 bytes.
    expect(await ch.post(`${f.url}${CLUSTER_RUN_PUSH_PATH}`, signedHeaders(KEY, body), body, 2_000, 4)).toEqual({
      kind: "failed",
      sent: true,
      code: "body_too_large",
    });
    expect(
      await ch.post(
        `${f.url}${CLUSTER_RUN_PUSH_PATH}`,
        signedHeaders(KEY, body),
        body,
        2_000,
        RUN_PUSH_ANSWER_MAX_BYTES,
      ),
    ).toMatchObject({ kind: "answered", status: 200 });
  });
});
