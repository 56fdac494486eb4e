/**
 * The holder's pushes of a run's updates to the instances following it (cluster/run-push.ts), against a real
 * HTTP server on 127.0.0.1 running the follower's handler: one push per follower and run in flight, the
 * updates meanwhile folded into the next one (newest summary and number, every event in order), a follower
 * dropped when it stops following or cannot be reached, none after the run's end, and the handler taking
 * only pushes signed with the cluster's key and well formed.
 */
import { once } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { refusedPort } from "../../../../scripts/test-support/index.js";
import { CLUSTER_SIGNATURE_HEADER, CLUSTER_TIMESTAMP_HEADER, signedHeaders } from "../../src/cluster/peer-auth.js";
import {
  CLUSTER_RUN_PUSH_PATH,
  handleRunPush,
  MAX_FOLLOWED_RUNS,
  MAX_FOLLOWERS_PER_RUN,
  MAX_PENDING_PUSH_EVENTS,
  type RunPush,
  RunPushes,
} from "../../src/cluster/run-push.js";
import {
  AGENT_INSTANCE,
  event,
  FOLLOWER,
  HOLDER,
  KEY,
  peerAuth,
  RUN_ID,
  until,
  update,
} from "../support/run-pushes.js";

const log = pino({ level: "silent" });

const servers: http.Server[] = [];
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise((resolve) => s.close(resolve));
  }
});

/** A follower: its handler records each push; `hold` keeps the answers back until released. */
async function followerPeer(opts: { following?: (p: RunPush) => boolean; hold?: boolean } = {}) {
  const pushes: RunPush[] = [];
  const held: (() => void)[] = [];
  const auth = peerAuth(FOLLOWER);
  const server = http.createServer((req, res) => {
    void handleRunPush(req, res, auth, (p) => {
      pushes.push(p);
      return opts.following?.(p) ?? true;
    });
  });
  if (opts.hold) {
    // Delay the answer: the handler's end() runs when released.
    server.prependListener("request", (_req, res) => {
      const end = res.end.bind(res);
      res.end = ((...args: Parameters<typeof end>) => {
        held.push(() => end(...args));
        return res;
      }) as typeof res.end;
    });
  }
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  servers.push(server);
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, pushes, held };
}

describe("pushing a run's updates to the instances following it", () => {
  it("keeps one push in flight per follower and folds the updates meanwhile into the next", async () => {
    const f = await followerPeer({ hold: true });
    const pushes = new RunPushes(KEY, HOLDER, log);
    pushes.follow(RUN_ID, { instanceId: FOLLOWER, url: f.url });
    pushes.updated(update(1, [event(1)]));
    await until(() => f.pushes.length === 1, "the first push");
    pushes.updated(update(2, [event(2)]));
    pushes.updated(update(3, [event(3), event(4)]));
    // A push is counted as it is sent, before any await: none was sent for 2 or 3 while the first is in flight.
    expect(pushes.counts.pushes_sent).toBe(1);
    expect(f.pushes).toHaveLength(1);
    f.held.shift()?.();
    await until(() => f.pushes.length === 2, "the folded push");
    expect(f.pushes[0]).toMatchObject({ holder: HOLDER, to: FOLLOWER, update: 1, agentInstanceId: AGENT_INSTANCE });
    expect(f.pushes[1]?.update).toBe(3);
    expect(f.pushes[1]?.run.last_seq).toBe(4);
    expect(f.pushes[1]?.events.map((e) => e.seq)).toEqual([2, 3, 4]);
    f.held.shift()?.();
    await until(() => pushes.counts.pushes_sent === 2 && f.held.length === 0, "the answers");
    expect(pushes.counts.pushes_failed).toBe(0);
  });

  it("leaves the events out of a folded push past its bound: the follower sees it is behind", async () => {
    const f = await followerPeer({ hold: true });
    const pushes = new RunPushes(KEY, HOLDER, log);
    pushes.follow(RUN_ID, { instanceId: FOLLOWER, url: f.url });
    pushes.updated(update(1, [event(1)]));
    await until(() => f.pushes.length === 1, "the first push");
    const many = Array.from({ length: MAX_PENDING_PUSH_EVENTS }, (_, i) => event(i + 2));
    pushes.updated(update(2, many));
    pushes.updated(update(3, [event(MAX_PENDING_PUSH_EVENTS + 2)]));
    f.held.shift()?.();
    await until(() => f.pushes.length === 2, "the folded push");
    expect(f.pushes[1]).toMatchObject({ update: 3, events: [] });
    expect(f.pushes[1]?.run.last_seq).toBe(MAX_PENDING_PUSH_EVENTS + 2);
    f.held.shift()?.();
  });

  it("drops a follower that stops following, one that cannot be reached, and every follower at the run's end", async () => {
    let following = false;
    const f = await followerPeer({ following: () => following });
    const pushes = new RunPushes(KEY, HOLDER, log);
    pushes.follow(RUN_ID, { instanceId: FOLLOWER, url: f.url });
    pushes.updated(update(1, [event(1)]));
    await until(() => f.pushes.length === 1 && pushes.followedRuns === 0, "the follower dropped");
    pushes.updated(update(2, [event(2)]));
    // A push is counted as it is sent, before any await: nothing was sent to the dropped follower.
    expect(pushes.counts.pushes_sent).toBe(1);
    expect(f.pushes).toHaveLength(1);

    // Named again by its next catch-up; then the run ends: pushed, and nobody follows it after.
    following = true;
    pushes.follow(RUN_ID, { instanceId: FOLLOWER, url: f.url });
    pushes.updated(update(3, [event(3)], "completed"));
    await until(() => f.pushes.length === 2, "the end pushed");
    expect(pushes.followedRuns).toBe(0);

    // Nothing listens at a follower's URL any more: dropped, and counted as a failed push.
    pushes.follow(RUN_ID, { instanceId: FOLLOWER, url: `http://127.0.0.1:${await refusedPort()}` });
    pushes.updated(update(4, [event(4)]));
    await until(() => pushes.counts.pushes_failed === 1 && pushes.followedRuns === 0, "the unreachable one dropped");
  });

  it("bounds the runs followed and the followers of one run, and never pushes to itself", async () => {
    const f = await followerPeer();
    const one = new RunPushes(KEY, HOLDER, log);
    for (let i = 0; i <= MAX_FOLLOWERS_PER_RUN; i++) {
      one.follow(RUN_ID, { instanceId: `follower-instance-${String(i).padStart(3, "0")}`, url: f.url });
    }
    one.updated(update(1, [event(1)]));
    // A push is counted as it is sent, before any await: one per follower kept, none to the one past the bound.
    expect(one.counts.pushes_sent).toBe(MAX_FOLLOWERS_PER_RUN);
    await until(() => f.pushes.length === MAX_FOLLOWERS_PER_RUN, "the pushes");
    expect(one.counts.pushes_sent).toBe(MAX_FOLLOWERS_PER_RUN);

    const pushes = new RunPushes(KEY, HOLDER, log);
    pushes.follow(RUN_ID, { instanceId: HOLDER, url: "http://127.0.0.1:1" });
    expect(pushes.followedRuns).toBe(0);
    for (let i = 0; i <= MAX_FOLLOWED_RUNS; i++) {
      pushes.follow(`wc_agent_run_${String(i).padStart(26, "a")}`, { instanceId: FOLLOWER, url: "http://127.0.0.1:1" });
    }
    expect(pushes.followedRuns).toBe(MAX_FOLLOWED_RUNS);
  });

  it("takes only a push signed with the cluster's key, and says which field of a malformed one is wrong", async () => {
    const f = await followerPeer();
    const good = {
      run_id: RUN_ID,
      runner_id: "r1",
      holder: HOLDER,
      update: 1,
      to: FOLLOWER,
      agent_instance_id: AGENT_INSTANCE,
      run: update(1, [event(1)]).run,
      events: [event(1)],
    };
    const send = async (body: unknown, headers?: Record<string, string>) => {
      const bytes = Buffer.from(JSON.stringify(body));
      const res = await fetch(`${f.url}${CLUSTER_RUN_PUSH_PATH}`, {
        method: "POST",
        headers: headers ?? signedHeaders(KEY, bytes),
        body: bytes,
      });
      return { status: res.status, body: (await res.json()) as Record<string, unknown> };
    };
    const wrongKey = signedHeaders(Buffer.alloc(32, 8), Buffer.from(JSON.stringify(good)));
    expect(await send(good, wrongKey)).toMatchObject({ status: 401, body: { error: "bad_signature" } });
    expect(
      await send(good, { [CLUSTER_TIMESTAMP_HEADER]: "1", [CLUSTER_SIGNATURE_HEADER]: "0".repeat(64) }),
    ).toMatchObject({ status: 401, body: { error: "stale_timestamp" } });
    expect(await send({ ...good, update: -1 })).toMatchObject({
      status: 400,
      body: { error: "invalid_request", message: expect.stringMatching(/^update: /) },
    });
    expect(await send({ ...good, events: [{ seq: 1 }] })).toMatchObject({
      status: 400,
      body: { message: expect.stringMatching(/^events\.0/) },
    });
    expect(await send({ ...good, run_id: "wc_agent_run_eeeeeeeeeeeeeeeeeeeeeeeeee" })).toMatchObject({
      status: 400,
      body: { message: "run.run_id must be run_id" },
    });
    expect(await send({ ...good, extra: 1 })).toMatchObject({ status: 400 });
    expect(f.pushes).toEqual([]);
    expect(await send(good)).toEqual({ status: 200, body: { following: true } });
    expect(f.pushes).toHaveLength(1);
  });
});
