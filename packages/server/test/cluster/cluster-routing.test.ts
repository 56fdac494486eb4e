/**
 * Routing between Server instances (issue 29 §2, design §14): two `webcodex-server run` children (A and B) on
 * one real PostgreSQL, a Runner daemon whose link goes through a TCP proxy (the load balancer) to B, and the
 * fake agent with its prompt ledger. Everything is asked of A, which does not hold the Runner's link:
 *
 * - a start reaches the Runner exactly once, observe returns its events to the end, and a long-poll on A
 *   wakes within moments of an event B received (database notifications, not the observe wait running out);
 * - a slow run is cancelled through A; `tasks/get` and a task's `subscriptions/listen` on A follow the run;
 * - the holder's internal endpoint refuses a forged, expired, malformed or oversized request, and a
 *   signed run.start for a run with no `sent` record is not dispatched;
 * - a forwarded start whose answer was lost stays unknown (`sent`), is settled by reconciliation, runs once;
 * - a stale remote view of the Runner (an agent instance it no longer has) is refused by the Runner and
 *   nothing is dispatched;
 * - a run ended by B's reconciliation (its Runner killed and restarted), with no run.update, wakes a
 *   long-poll on A through the state change's notification;
 * - B `kill -9`'d mid-run: the Runner reconnects through the proxy to A, the run still completes, once;
 * - instances on https with a private CA, and instances whose requests to each other go to a listener of
 *   their own (`[server.cluster] listen_port`), which is all that listener serves.
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { request as httpsRequest } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isTerminalState, MAX_OBSERVE_WAIT_SECS } from "@webcodex/protocol";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, type DaemonProcess, poll } from "../../../../scripts/test-support/index.js";
import { type PostgresCluster, startPostgresCluster } from "../../../../scripts/test-support/postgres.js";
import { CLUSTER_LINK_REQUEST_PATH } from "../../src/cluster/link-request.js";
import {
  CLUSTER_MAX_BODY_BYTES,
  CLUSTER_MAX_CLOCK_SKEW_MS,
  CLUSTER_SIGNATURE_HEADER,
  CLUSTER_TIMESTAMP_HEADER,
  clusterKey,
  signedHeaders,
  signLinkRequest,
} from "../../src/cluster/peer-auth.js";
import { CLUSTER_RUN_PUSH_PATH } from "../../src/cluster/run-push.js";
import type { Scope } from "../../src/principals/principal.js";
import type { ApiResult, CancelOutput, ObserveOutput, ProjectView, StartOutput } from "../../src/runs/api.js";
import { consoleLogin } from "../support/console-login.js";
import { CutProxy } from "../support/cut-proxy.js";
import { instanceApi, startInstanceB } from "../support/instance-b.js";
import { MODERN, postModern, tasksMeta } from "../support/modern-mcp.js";
import { issueKey } from "../support/oauth.js";
import { freePort, okValue, ProcStack } from "../support/proc-stack.js";
import { makeTestCa } from "../support/test-ca.js";

/** An observe long-poll's wait in these tests: far longer than a notified wake-up may take. */
const LONG_POLL_SECS = 20;
/**
 * A long-poll on A answers within this of its start (the agent emits an event every 1.5 s): well before its
 * LONG_POLL_SECS wait ends, i.e. woken, not timed out. How fast is the bench's business (wake latency).
 */
const WAKE_BOUND_MS = (LONG_POLL_SECS * 1000) / 2;
/** The longest observe wait (protocol MAX_OBSERVE_WAIT_SECS). */
const MAX_WAIT_SECS = MAX_OBSERVE_WAIT_SECS;

let pg: PostgresCluster;
let stack: ProcStack | null = null;
let b: DaemonProcess | null = null;
let proxy: CutProxy | null = null;

beforeAll(async () => {
  pg = await startPostgresCluster();
}, 120_000);
afterAll(async () => {
  await pg?.close();
});
afterEach(async () => {
  await b?.stop();
  b = null;
  await stack?.stop();
  stack = null;
  await proxy?.close();
  proxy = null;
});

interface Cluster {
  s: ProcStack;
  /** A's port (the ProcStack's Server) and B's. */
  a: number;
  b: number;
  proxy: CutProxy;
}

/** What the cluster paths did on the instance at `port` (test API: forwarded syncs, pushes, skipped notices). */
async function clusterStats(port: number): Promise<Record<string, number>> {
  const res = await fetch(`http://127.0.0.1:${port}/__test/cluster-stats`);
  return (await res.json()) as Record<string, number>;
}

async function projectsOn(port: number): Promise<ProjectView[]> {
  try {
    return (await (await fetch(`http://127.0.0.1:${port}/__test/projects?principal_id=alice`)).json()) as ProjectView[];
  } catch {
    return [];
  }
}

/** A and B on one database; the Runner linked to B through the proxy; A sees it through the shared rows. */
async function cluster(extraScopes: Scope[] = []): Promise<Cluster> {
  proxy = await new CutProxy().listen();
  const url = await pg.createDatabase();
  stack = await new ProcStack({
    runners: [{ id: "r1", projects: ["demo"] }],
    server: "child",
    stateUrl: url,
    linkPort: proxy.port,
    extraScopes,
  }).init();
  const s = stack;
  const portB = await freePort();
  b = await startInstanceB(s, portB);
  proxy.targetPort = portB;
  await s.startRunner("r1", [], {}, { waitOnline: false });
  await poll(async () => (await projectsOn(portB)).find((p) => p.project_id === "demo")?.runner_online, {
    timeoutMs: DAEMON_WAIT_MS,
    intervalMs: DAEMON_POLL_MS,
    what: "the Runner online on B",
  });
  // A holds no link: it learns of the Runner from the presence row B writes after the hello.
  await poll(
    async () =>
      (
        await s.stateRows<{ store_id: string | null }>("SELECT store_id FROM runner_presence WHERE runner_id = ?", [
          "r1",
        ])
      )[0]?.store_id,
    { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the Runner's presence row" },
  );
  // A lists the Runner linked to B, with what its hello advertised.
  const onA = (await projectsOn(s.port)).find((p) => p.project_id === "demo");
  expect(onA).toMatchObject({ runner_online: true, providers: [expect.objectContaining({ provider_id: "fake" })] });
  return { s, a: s.port, b: portB, proxy };
}

async function startOn(port: number, key: string, prompt: string): Promise<ApiResult<StartOutput>> {
  return await instanceApi<StartOutput>(port, "start", {
    project_id: "demo",
    provider_id: "fake",
    idempotency_key: key,
    prompt,
  });
}

/** Observe on `port` with the token chain until terminal; every event seen, in order. */
async function observeToEnd(port: number, runId: string): Promise<{ last: ObserveOutput; seqs: number[] }> {
  const seqs: number[] = [];
  let token: string | undefined;
  const deadline = Date.now() + DAEMON_WAIT_MS;
  for (;;) {
    const o = okValue(
      await instanceApi<ObserveOutput>(port, "observe", {
        run_id: runId,
        wait_secs: 5,
        ...(token ? { after_observation_token: token } : {}),
      }),
    );
    seqs.push(...o.events.map((e) => e.seq));
    token = o.observation_token;
    if (isTerminalState(o.state) && !o.has_more) return { last: o, seqs };
    if (Date.now() > deadline) throw new Error(`run ${runId} not terminal on ${port}: ${JSON.stringify(o)}`);
  }
}

type Answer = { result?: Record<string, unknown>; error?: { code: number; message: string } };

async function mcpPost(port: number, token: string, method: string, params: Record<string, unknown>, name?: string) {
  return await postModern(port, token, method, params, {
    ...(name !== undefined ? { name } : {}),
    clientName: "cluster-test",
  });
}

/** A signed link request to `port` as another instance would send it (the key from the shared secret). */
async function linkRequest(
  port: number,
  key: Buffer,
  body: Buffer,
  opts: { timestamp?: string; signature?: string } = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const timestamp = opts.timestamp ?? String(Date.now());
  const res = await fetch(`http://127.0.0.1:${port}${CLUSTER_LINK_REQUEST_PATH}`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      [CLUSTER_TIMESTAMP_HEADER]: timestamp,
      [CLUSTER_SIGNATURE_HEADER]: opts.signature ?? signLinkRequest(key, timestamp, body),
    },
    body,
  });
  return { status: res.status, body: (await res.json().catch(() => ({}))) as Record<string, unknown> };
}

/** The status a signed upgrade to a cluster channel (cluster/peer-ws.ts) gets on `port`: 101 when it is served there. */
async function channelStatus(port: number, path: string, key: Buffer): Promise<number> {
  const ws = new WebSocket(`ws://127.0.0.1:${port}${path}`, {
    headers: signedHeaders(key, Buffer.alloc(0)),
  });
  ws.on("error", () => undefined); // a refused upgrade is terminated below
  try {
    return await new Promise<number>((resolve) => {
      ws.once("open", () => resolve(101));
      ws.once("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0));
    });
  } finally {
    ws.terminate();
  }
}

/** The port of the instances' own listener of the instance whose clients' port is `port` (its directory row). */
async function peerPortOf(port: number): Promise<number> {
  const { url } = (await (await fetch(`http://127.0.0.1:${port}/__test/cluster-peer`)).json()) as {
    url: string | null;
  };
  if (url === null) throw new Error(`the instance at ${port} has no directory row`);
  return Number(new URL(url).port);
}

async function sharedKey(s: ProcStack): Promise<Buffer> {
  const [row] = await s.stateRows<{ secret: string }>("SELECT secret FROM server_secret WHERE id = 1");
  return clusterKey(Buffer.from(row?.secret ?? "", "hex"));
}

describe("several Server instances: any of them answers", () => {
  it("starts through A once, observes to the end with the events, and a long-poll on A wakes at B's events", async () => {
    const c = await cluster();
    const started = okValue(await startOn(c.a, "through-a", "scenario: hello"));
    expect(started.replayed).toBe(false);
    const { last, seqs } = await observeToEnd(c.a, started.run_id);
    expect(last.state).toBe("completed");
    expect(seqs.length).toBeGreaterThan(0);
    expect(seqs).toEqual([...seqs].sort((x, y) => x - y));
    expect(c.s.prompts("r1")).toHaveLength(1);
    // The same key through B replays the run: nothing dispatched again.
    expect(okValue(await startOn(c.b, "through-a", "scenario: hello"))).toMatchObject({
      run_id: started.run_id,
      replayed: true,
    });
    expect(c.s.prompts("r1")).toHaveLength(1);

    // One event every 1.5 s: each long-poll on A answers with the next one long before its wait ends.
    const [aBefore, bBefore] = [await clusterStats(c.a), await clusterStats(c.b)];
    const slow = okValue(await startOn(c.a, "wake", "scenario: slow interval_ms=1500 count=4"));
    let token = slow.observation_token;
    const waits: number[] = [];
    for (let answered = 0; answered < 3; ) {
      const t0 = Date.now();
      const o = okValue(
        await instanceApi<ObserveOutput>(c.a, "observe", {
          run_id: slow.run_id,
          wait_secs: LONG_POLL_SECS,
          after_observation_token: token,
        }),
      );
      token = o.observation_token;
      if (o.events.length === 0 && !isTerminalState(o.state)) continue; // a state change without events
      waits.push(Date.now() - t0);
      answered++;
      if (isTerminalState(o.state)) break;
    }
    for (const ms of waits) expect(ms).toBeLessThan(WAKE_BOUND_MS);
    expect(c.s.prompts("r1")).toHaveLength(2);
    // The ticks reached A pushed by B (cluster/run-push.ts), and their notices asked B nothing more.
    const delta = (after: Record<string, number>, before: Record<string, number>, key: string) =>
      (after[key] ?? 0) - (before[key] ?? 0);
    // A notice leaves NOTICE_DELAY_MS after its update (cluster/change-notices.ts): the last one may still be
    // on its way when the last answer came.
    await poll(async () => delta(await clusterStats(c.a), aBefore, "notices_skipped") >= waits.length - 1, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "A to skip the notices of the updates pushed to it",
    });
    const [aAfter, bAfter] = [await clusterStats(c.a), await clusterStats(c.b)];
    // (The first answer may come from the catch-up that made A a follower.)
    expect(delta(aAfter, aBefore, "pushes_applied")).toBeGreaterThanOrEqual(waits.length - 1);
    expect(delta(aAfter, aBefore, "notices_skipped")).toBeGreaterThanOrEqual(waits.length - 1);
    expect(delta(bAfter, bBefore, "pushes_sent")).toBeGreaterThanOrEqual(delta(aAfter, aBefore, "pushes_applied"));
    expect(delta(bAfter, bBefore, "pushes_failed")).toBe(0);
    // Over B's standing channel to A (cluster/peer-ws.ts), not a POST each; A's catch-ups through B over A's.
    expect(delta(bAfter, bBefore, "pushes_by_channel")).toBe(delta(bAfter, bBefore, "pushes_sent"));
    expect(delta(bAfter, bBefore, "pushes_by_post")).toBe(0);
    expect(delta(aAfter, aBefore, "link_requests_by_channel")).toBeGreaterThan(0);
    expect(delta(aAfter, aBefore, "link_requests_by_post")).toBe(0);
  }, 180_000);

  it("cancels a slow run through A, and A's tasks/get and subscriptions/listen follow a task on B's Runner", async () => {
    const c = await cluster();
    const slow = okValue(await startOn(c.a, "cancel-me", "scenario: slow interval_ms=200 count=500"));
    await poll(
      async () =>
        okValue(await instanceApi<ObserveOutput>(c.a, "observe", { run_id: slow.run_id })).state === "running",
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the slow run running" },
    );
    const cancelled = okValue(await instanceApi<CancelOutput>(c.a, "cancel", { run_id: slow.run_id }));
    expect(cancelled).toMatchObject({ cancel_requested: true, already_terminal: false });
    const { last } = await observeToEnd(c.a, slow.run_id);
    expect(last.state).toBe("cancelled");

    const alice = c.s.principalTokens.get("alice") ?? "";
    const args = {
      project_id: "demo",
      provider_id: "fake",
      idempotency_key: "task-through-a",
      prompt: "scenario: slow interval_ms=300 count=8",
    };
    const created = (await (
      await mcpPost(c.a, alice, "tools/call", { name: "start_coding_agent", arguments: args }, "start_coding_agent")
    ).json()) as Answer;
    expect(created.result, JSON.stringify(created)).toMatchObject({ resultType: "task" });
    const taskId = created.result?.taskId as string;
    const got = (await (await mcpPost(c.a, alice, "tasks/get", { taskId }, taskId)).json()) as Answer;
    expect(got.result).toMatchObject({ taskId, status: "working" });

    // The listen on A ends (gracefully) once the task is completed: within moments of the run's end on B,
    // not one observe wait (30 s) later.
    const t0 = Date.now();
    const res = await fetch(`http://127.0.0.1:${c.a}/mcp`, {
      method: "POST",
      headers: {
        Authorization: `Bearer ${alice}`,
        Accept: "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "subscriptions/listen",
      },
      body: JSON.stringify({
        jsonrpc: "2.0",
        id: "l1",
        method: "subscriptions/listen",
        params: { notifications: { taskIds: [taskId] }, _meta: tasksMeta("cluster-test") },
      }),
    });
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    const text = await res.text();
    const elapsed = Date.now() - t0;
    const tasks = text
      .split("\n")
      .filter((l) => l.startsWith("data: "))
      .map((l) => JSON.parse(l.slice(6)) as { method?: string; params?: Record<string, unknown> })
      .filter((m) => m.method === "notifications/tasks");
    expect(tasks.at(-1)?.params).toMatchObject({ taskId, status: "completed" });
    // The run lasts about 8 × 300 ms; a missed wake-up would hold the stream a full observe wait.
    expect(elapsed).toBeLessThan((MAX_WAIT_SECS - 5) * 1000);
    expect(c.s.prompts("r1")).toHaveLength(2);
  }, 180_000);

  it("shows a run's events on A's operator console while its Runner is linked to B", async () => {
    const { s, a, b: portB } = await cluster(["operator:read"]);
    const started = okValue(await startOn(portB, "console-a", "scenario: tools"));
    await observeToEnd(portB, started.run_id);
    // The console of the instance without the link: its events come through B (runs.followEvents).
    const key = await issueKey(s.serverConfigFile, "alice", ["operator:read", "project:read"], []);
    const origin = `http://127.0.0.1:${a}`;
    const { cookie } = await consoleLogin(origin, key);
    expect(cookie).not.toBeNull();
    const res = await fetch(`${origin}/console/api/snapshot?run=${started.run_id}`, {
      headers: { cookie: cookie ?? "" },
    });
    expect(res.status).toBe(200);
    const snapshot = (await res.json()) as { run_events: { held: boolean; events: { kind: string }[] } | null };
    expect(snapshot.run_events?.held).toBe(true);
    const kinds = snapshot.run_events?.events.map((e) => e.kind) ?? [];
    expect(kinds).toContain("tool_activity");
    expect(kinds.at(-1)).toBe("terminal");
  }, 120_000);

  it("refuses forged, expired, malformed and oversized link requests, and sends no start without its sent record", async () => {
    const c = await cluster();
    const key = await sharedKey(c.s);
    const canary = `canary-${randomBytes(16).toString("hex")}`;
    const frame = {
      type: "run.sync",
      run_id: `wc_agent_run_${"a".repeat(26)}`,
      after_seq: 0,
      max_events: 0,
    };
    const body = Buffer.from(JSON.stringify({ runner_id: "r1", frame, timeout_ms: 1000 }));
    // The instances' endpoints are on their own listeners (the default), not on the clients' ones.
    const [peerA, peerB] = [await peerPortOf(c.a), await peerPortOf(c.b)];
    expect((await linkRequest(c.b, key, body)).status).toBe(404);

    const unsigned = await fetch(`http://127.0.0.1:${peerB}${CLUSTER_LINK_REQUEST_PATH}`, { method: "POST", body });
    expect(unsigned.status).toBe(401);
    expect(await unsigned.json()).toMatchObject({ error: "bad_timestamp" });
    const wrongKey = await linkRequest(peerB, randomBytes(32), body);
    expect(wrongKey).toMatchObject({ status: 401, body: { error: "bad_signature" } });
    const tampered = await linkRequest(peerB, key, body, {
      signature: signLinkRequest(key, String(Date.now()), Buffer.from(`${body.toString()} `)),
    });
    expect(tampered).toMatchObject({ status: 401, body: { error: "bad_signature" } });
    const expired = await linkRequest(peerB, key, body, {
      timestamp: String(Date.now() - CLUSTER_MAX_CLOCK_SKEW_MS - 5_000),
    });
    expect(expired).toMatchObject({ status: 401, body: { error: "stale_timestamp" } });
    const oversized = await linkRequest(peerB, key, Buffer.alloc(CLUSTER_MAX_BODY_BYTES + 1, 0x20));
    expect(oversized).toMatchObject({ status: 413, body: { error: "body_too_large" } });
    const badFrame = await linkRequest(
      peerB,
      key,
      Buffer.from(JSON.stringify({ runner_id: "r1", frame: { type: "hello.ack" }, timeout_ms: 1000 })),
    );
    expect(badFrame.status).toBe(400);
    expect(String(badFrame.body.message)).toContain(
      "frame.type must be run.start, run.sync, run.cancel, run.changes or run.apply",
    );
    const badTimeout = await linkRequest(
      peerB,
      key,
      Buffer.from(JSON.stringify({ runner_id: "r1", frame, timeout_ms: 10 ** 9 })),
    );
    expect(badTimeout.status).toBe(400);
    expect(String(badTimeout.body.message)).toContain("timeout_ms must be an integer");

    // A properly signed request is executed over B's own link: the Runner does not know this run.
    const sync = await linkRequest(peerB, key, body);
    expect(sync.status, JSON.stringify(sync.body)).toBe(200);
    expect(sync.body).toMatchObject({ ok: true, frame: { type: "error", code: "not_found" } });
    const [presence] = await c.s.stateRows<{ agent_instance_id: string; provider_adverts: string }>(
      "SELECT agent_instance_id, provider_adverts FROM runner_presence WHERE runner_id = ?",
      ["r1"],
    );
    // A run.sync sent from a view of another agent instance is not answered by this one's link; one from
    // a view of this instance is; an agent_instance_id that is not one, or on another frame, is refused.
    const withInstance = (agentInstanceId: unknown, f: object = frame) =>
      Buffer.from(JSON.stringify({ runner_id: "r1", frame: f, timeout_ms: 1000, agent_instance_id: agentInstanceId }));
    const otherInstance = await linkRequest(peerB, key, withInstance(`ai_${"z".repeat(22)}`));
    expect(otherInstance).toMatchObject({ status: 200, body: { ok: false, reason: "not_sent" } });
    const sameInstance = await linkRequest(peerB, key, withInstance(presence?.agent_instance_id));
    expect(sameInstance).toMatchObject({ status: 200, body: { ok: true, frame: { code: "not_found" } } });
    const notAnInstance = await linkRequest(peerB, key, withInstance("../x"));
    expect(notAnInstance.status).toBe(400);
    expect(String(notAnInstance.body.message)).toContain("agent_instance_id");
    const onCancel = await linkRequest(
      peerB,
      key,
      withInstance(presence?.agent_instance_id, { type: "run.cancel", run_id: frame.run_id }),
    );
    expect(onCancel.status).toBe(400);
    // A signed run.start for a run with no `sent` record is never sent to the Runner.
    const provider = (JSON.parse(presence?.provider_adverts ?? "[]") as { provider_instance_id: string }[])[0];
    const start = {
      type: "run.start",
      run_id: `wc_agent_run_${"b".repeat(26)}`,
      intent_fingerprint: "f".repeat(64),
      project_id: "demo",
      provider_id: "fake",
      agent_instance_id: presence?.agent_instance_id,
      provider_instance_id: provider?.provider_instance_id,
      prompt: `scenario: hello ${canary}`,
      config: {},
      timeout_secs: null,
    };
    const forgedStart = await linkRequest(
      peerB,
      key,
      Buffer.from(JSON.stringify({ runner_id: "r1", frame: start, timeout_ms: 5000 })),
    );
    expect(forgedStart.status, JSON.stringify(forgedStart.body)).toBe(200);
    expect(forgedStart.body).toEqual({ ok: false, reason: "closed" });
    // A instance that holds no link answers not_sent (never forwards again).
    const onA = await linkRequest(peerA, key, body);
    expect(onA.body).toEqual({ ok: false, reason: "not_sent" });
    expect(c.s.prompts("r1")).toHaveLength(0);
    expect(JSON.stringify(c.s.logs.get("r1") ?? "")).not.toContain(canary);
  }, 180_000);

  it("a stale view of the Runner on A is refused by the Runner, and nothing is dispatched", async () => {
    const c = await cluster();
    // The view A reads names an agent instance the Runner no longer has (as between a Runner restart and
    // the presence row's rewrite).
    const stale = `ai_${randomBytes(8).toString("hex")}`;
    await c.s.stateRows("UPDATE runner_presence SET agent_instance_id = ? WHERE runner_id = ? RETURNING runner_id", [
      stale,
      "r1",
    ]);
    const refused = await startOn(c.a, "stale-view", "scenario: hello");
    expect(refused.ok).toBe(false);
    expect(refused.ok ? null : refused.error.code).toBe("stale_runner");
    expect(c.s.prompts("r1")).toHaveLength(0);
    const [rec] = await c.s.stateRows<{ admission: string; execution_state: string }>(
      "SELECT admission, execution_state FROM admission_records",
    );
    expect(rec).toMatchObject({ admission: "rejected_pre_admission", execution_state: "not_started" });
    const [failure] = await c.s.stateRows<{ failure_kind: string }>("SELECT failure_kind FROM admission_records");
    expect(failure?.failure_kind).toBe("runner_restarted");
  }, 180_000);

  it("leaves a forwarded start whose answer was lost unknown (never not started), and it runs once", async () => {
    const c = await cluster();
    // The run.start B forwards reaches the Runner, then the link is cut: B's answer to A is "closed".
    c.proxy.cutAfterNextRunStart();
    const started = await startOn(c.a, "answer-lost", "scenario: slow interval_ms=100 count=10");
    await c.proxy.cutDone;
    expect(started.ok, JSON.stringify(started)).toBe(true);
    const run = okValue(started);
    expect(run.state).toBe("starting");
    const [rec] = await c.s.stateRows<{ admission: string }>("SELECT admission FROM admission_records");
    expect(["sent", "admitted"]).toContain(rec?.admission);
    // The Runner resumes its link on B; B's reconciliation finds the run; A follows it to the end.
    const { last } = await observeToEnd(c.a, run.run_id);
    expect(last.state).toBe("completed");
    expect(c.s.prompts("r1")).toHaveLength(1);
  }, 180_000);

  it("wakes a long-poll on A when B's reconciliation ends the run (the Runner was kill -9'd and restarted)", async () => {
    const c = await cluster();
    const run = okValue(await startOn(c.a, "runner-dies", "scenario: slow interval_ms=200 count=500"));
    let token = run.observation_token;
    await poll(
      async () => {
        const o = okValue(
          await instanceApi<ObserveOutput>(c.a, "observe", { run_id: run.run_id, after_observation_token: token }),
        );
        token = o.observation_token;
        return o.state === "running";
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the run running" },
    );
    // Drain what is there, then wait on A while the Runner dies and comes back (its old link's lease runs out
    // first): the end is written by B's reconciliation of the restarted Runner's hello, with no run.update.
    for (;;) {
      const o = okValue(
        await instanceApi<ObserveOutput>(c.a, "observe", { run_id: run.run_id, after_observation_token: token }),
      );
      token = o.observation_token;
      if (!o.has_more) break;
    }
    await c.s.killRunner("r1", "SIGKILL");
    const t0 = Date.now();
    const waiting = instanceApi<ObserveOutput>(c.a, "observe", {
      run_id: run.run_id,
      wait_secs: MAX_WAIT_SECS,
      after_observation_token: token,
    });
    await c.s.startRunner("r1", [], {}, { waitOnline: false });
    let o = okValue(await waiting);
    // Events already on their way may answer first; the state change must follow within moments.
    while (!isTerminalState(o.state)) {
      o = okValue(
        await instanceApi<ObserveOutput>(c.a, "observe", {
          run_id: run.run_id,
          wait_secs: MAX_WAIT_SECS,
          after_observation_token: o.observation_token,
        }),
      );
    }
    expect(o.state).toBe("lost");
    expect(Date.now() - t0).toBeLessThan((MAX_WAIT_SECS - 5) * 1000);
    expect(c.s.prompts("r1")).toHaveLength(1);
  }, 180_000);

  it("keeps a run started through A truthful when B is kill -9'd mid-run: the Runner moves to A, one dispatch", async () => {
    const c = await cluster();
    const started = okValue(await startOn(c.a, "holder-dies", "scenario: slow interval_ms=250 count=24"));
    await poll(
      async () =>
        okValue(await instanceApi<ObserveOutput>(c.a, "observe", { run_id: started.run_id })).state === "running",
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the run running" },
    );
    // The load balancer now sends the Runner's reconnect to A.
    c.proxy.targetPort = c.a;
    await b?.signal("SIGKILL");
    b = null;
    const { last } = await observeToEnd(c.a, started.run_id);
    expect(last.state).toBe("completed");
    expect((await projectsOn(c.a)).find((p) => p.project_id === "demo")?.runner_online).toBe(true);
    expect(c.s.prompts("r1")).toHaveLength(1);
  }, 180_000);
});

describe("instances trust only each other", () => {
  it("sends no prompt to a process that took a killed holder's cluster port: the start is refused, nothing dispatched", async () => {
    // Leases long enough that the rows still name B as the holder while A starts (a heartbeat of 10 s).
    proxy = await new CutProxy().listen();
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      stateUrl: await pg.createDatabase(),
      linkPort: proxy.port,
      heartbeatIntervalMs: 10_000,
    }).init();
    const s = stack;
    const portB = await freePort();
    b = await startInstanceB(s, portB);
    proxy.targetPort = portB;
    await s.startRunner("r1", [], {}, { waitOnline: false });
    await poll(async () => (await projectsOn(s.port)).find((p) => p.project_id === "demo")?.runner_online, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "A to see the Runner linked to B",
    });
    const peerB = await peerPortOf(portB);
    await b.signal("SIGKILL");
    b = null;
    // An impostor on B's cluster port: it records everything it is sent and claims whatever it is asked.
    const received: string[] = [];
    const impostor = createHttpServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        received.push(`${req.url ?? ""}\n${JSON.stringify(req.headers)}\n${Buffer.concat(chunks).toString("utf8")}`);
        res.writeHead(200, { "content-type": "application/json" }).end('{"holds":true,"ok":false,"reason":"busy"}');
      });
    });
    await poll(
      () =>
        new Promise<boolean>((resolve) => {
          impostor.once("error", () => resolve(false));
          impostor.listen(peerB, "127.0.0.1", () => resolve(true));
        }),
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the impostor to bind B's cluster port" },
    );
    try {
      const canary = randomBytes(24).toString("hex");
      const started = await startOn(s.port, "to-the-impostor", `scenario: hello ${canary}`);
      // The impostor was asked (the rows still named B), proved nothing, and got no prompt.
      expect(received.length).toBeGreaterThan(0);
      for (const r of received) expect(r).not.toContain(canary);
      expect(started.ok, JSON.stringify(started)).toBe(false);
      expect(JSON.stringify(started)).not.toContain(canary);
      const [rec] = await s.stateRows<{ admission: string }>("SELECT admission FROM admission_records");
      expect(rec?.admission).toBe("rejected_pre_admission");
      expect(s.prompts("r1")).toHaveLength(0);
    } finally {
      impostor.closeAllConnections();
      await new Promise((resolve) => impostor.close(resolve));
    }
  }, 180_000);
});

describe("several Server instances on https://", () => {
  /** A test API call over https, trusting `ca` only. */
  function httpsApi<T>(port: number, path: string, ca: Buffer, body?: unknown): Promise<T> {
    return new Promise((resolve, reject) => {
      const req = httpsRequest(
        {
          host: "127.0.0.1",
          port,
          path,
          method: body === undefined ? "GET" : "POST",
          ca,
          headers: { "content-type": "application/json" },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            try {
              resolve(JSON.parse(Buffer.concat(chunks).toString("utf8")) as T);
            } catch (err) {
              reject(err);
            }
          });
        },
      );
      req.on("error", reject);
      req.end(body === undefined ? undefined : JSON.stringify({ principal_id: "alice", input: body }));
    });
  }

  it("forwards a start and pushes its updates between instances that serve https and trust a private CA", async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-cluster-ca-"));
    try {
      const ca = makeTestCa(dir);
      const caPem = readFileSync(ca.caFile);
      // Node's own trust for a private CA: every peer request of an instance verifies the other's certificate.
      const trust = { NODE_EXTRA_CA_CERTS: ca.caFile };
      const portB = await freePort();
      stack = await new ProcStack({
        runners: [{ id: "r1", projects: ["demo"] }],
        server: "child",
        stateUrl: await pg.createDatabase(),
        linkPort: portB,
        tls: ca,
        serverEnv: trust,
        // The instances' endpoints on the clients' listener: only by the explicit opt-in, warned at start.
        clusterListenPort: "client",
      }).init();
      const s = stack;
      b = await startInstanceB(s, portB, trust);
      await s.startRunner("r1", [], {}, { waitOnline: false });
      await poll(
        async () =>
          (await httpsApi<ProjectView[]>(s.port, "/__test/projects?principal_id=alice", caPem).catch(() => [])).find(
            (p) => p.project_id === "demo",
          )?.runner_online === true,
        { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "A to see the Runner linked to B" },
      );
      const urls = await s.stateRows<{ url: string }>("SELECT url FROM server_instances ORDER BY url");
      expect(urls).toHaveLength(2);
      for (const { url } of urls) expect(url).toMatch(/^https:\/\/127\.0\.0\.1:/);
      expect(urls.map((u) => Number(new URL(u.url).port)).sort()).toEqual([s.port, portB].sort());
      expect(s.logs.get("server") ?? "").toContain("serve_on_client_listener = true");

      const started = okValue(
        await httpsApi<ApiResult<StartOutput>>(s.port, "/__test/runs/start", caPem, {
          project_id: "demo",
          provider_id: "fake",
          idempotency_key: "over-tls",
          prompt: "scenario: slow interval_ms=300 count=4",
        }),
      );
      let token: string | undefined;
      const seqs: number[] = [];
      for (let i = 0; i < 40; i++) {
        const o = okValue(
          await httpsApi<ApiResult<ObserveOutput>>(s.port, "/__test/runs/observe", caPem, {
            run_id: started.run_id,
            wait_secs: 10,
            ...(token ? { after_observation_token: token } : {}),
          }),
        );
        seqs.push(...o.events.map((e) => e.seq));
        token = o.observation_token;
        if (isTerminalState(o.state) && !o.has_more) {
          expect(o.state).toBe("completed");
          break;
        }
      }
      expect(seqs.length).toBeGreaterThan(3);
      expect(s.prompts("r1")).toHaveLength(1);
      // The run's updates reached A pushed by B, over https.
      const onA = await httpsApi<Record<string, number>>(s.port, "/__test/cluster-stats", caPem);
      const onB = await httpsApi<Record<string, number>>(portB, "/__test/cluster-stats", caPem);
      expect(onA.pushes_applied).toBeGreaterThan(0);
      expect(onB.pushes_failed).toBe(0);
      expect(onB.pushes_by_channel).toBe(onB.pushes_sent); // over wss
      expect(onB.pushes_by_post).toBe(0);
      expect(onA.link_requests_by_channel).toBeGreaterThan(0); // A's catch-ups through B, over wss too
      expect(onA.link_requests_by_post).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);
});

describe("the instances' requests on a listener of their own (the default; [server.cluster] listen_port)", () => {
  it("advertises that listener, forwards and pushes over it, and serves /_wc/ nowhere else", async () => {
    const portB = await freePort();
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      stateUrl: await pg.createDatabase(),
      linkPort: portB,
    }).init();
    const s = stack;
    b = await startInstanceB(s, portB);
    await s.startRunner("r1", [], {}, { waitOnline: false });
    await poll(async () => (await projectsOn(s.port)).find((p) => p.project_id === "demo")?.runner_online, {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS,
      what: "A to see the Runner linked to B",
    });
    // Each instance advertises its own peer listener: a port of its own, neither client port.
    const urls = (await s.stateRows<{ url: string }>("SELECT url FROM server_instances")).map((r) => r.url);
    expect(urls).toHaveLength(2);
    const peerPorts = urls.map((u) => Number(new URL(u).port));
    for (const p of peerPorts) expect([s.port, portB]).not.toContain(p);

    // The client listeners do not serve the instances' endpoints; the peer listeners serve nothing else.
    const key = await sharedKey(s);
    const body = Buffer.from("{}");
    for (const port of [s.port, portB]) expect((await linkRequest(port, key, body)).status).toBe(404);
    for (const p of peerPorts) {
      expect((await linkRequest(p, key, body)).status).toBe(400); // reached the handler: the body is no request
      expect((await fetch(`http://127.0.0.1:${p}/__test/projects?principal_id=alice`)).status).toBe(404);
      expect((await fetch(`http://127.0.0.1:${p}/mcp`, { method: "POST", body: "{}" })).status).toBe(404);
    }

    // A start on A reaches the Runner on B once, and B pushes its updates to A over those listeners.
    const started = okValue(await startOn(s.port, "own-listener", "scenario: slow interval_ms=200 count=4"));
    const { last, seqs } = await observeToEnd(s.port, started.run_id);
    expect(last.state).toBe("completed");
    expect(seqs.length).toBeGreaterThan(3);
    expect(s.prompts("r1")).toHaveLength(1);
    expect((await clusterStats(s.port)).pushes_applied).toBeGreaterThan(0);
    const onB = await clusterStats(portB);
    expect(onB.pushes_failed).toBe(0);
    expect(onB.pushes_by_channel).toBe(onB.pushes_sent);
    // The channels, too, are on the peer listeners only.
    for (const path of [CLUSTER_RUN_PUSH_PATH, CLUSTER_LINK_REQUEST_PATH]) {
      for (const port of [s.port, portB]) expect(await channelStatus(port, path, key)).toBe(404);
      for (const p of peerPorts) expect(await channelStatus(p, path, key)).toBe(101);
    }
  }, 180_000);
});
