/**
 * Signed webhooks from two Server instances on one PostgreSQL (design §18, issue 43 §2): A and B share the
 * state, a Runner links to A through a TCP proxy (the load balancer), alice subscribes a real receiver that
 * verifies every request with `standardwebhooks`. Runs start on both instances and end. The receiver holds
 * its answer to the first request after every run has started: that attempt is in flight, and the instance
 * making it (found by its open connection, socket-owner.ts) is killed with SIGKILL (the proxy then sends the
 * Runner to the other one). The survivor takes the attempt over when its claim lease (CLAIM_LEASE_MS) runs out:
 * every event arrives, each attempt is made by one instance, a duplicate only ever repeats an id, and one run's
 * events arrive in order.
 */

import { isTerminalState } from "@webcodex/protocol";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DAEMON_POLL_MS, DAEMON_WAIT_MS, type DaemonProcess, poll } from "../../../../scripts/test-support/index.js";
import { type PostgresCluster, startPostgresCluster } from "../../../../scripts/test-support/postgres.js";
import type { ObserveOutput, StartOutput } from "../../src/runs/api.js";
import { CLAIM_LEASE_MS } from "../../src/webhooks/worker.js";
import { CutProxy } from "../support/cut-proxy.js";
import { instanceApi, startInstanceB } from "../support/instance-b.js";
import { freePort, okValue, ProcStack } from "../support/proc-stack.js";
import { socketOwner } from "../support/socket-owner.js";
import { HOLD, WebhookReceiver } from "../support/webhook-receiver.js";
import { subscribe, verified, WEBHOOK_TOML } from "../support/webhooks.js";

/** Runs started, half on each instance (the Runner's max_concurrent_runs). */
const RUNS = 4;
/** A run long enough that some end after every start returned (the receiver holds one of those events). */
const SLOW_PROMPT = "scenario: slow interval_ms=150 count=40";
/** The events that end a run (a run lost while its Runner moves to the survivor may end `lost`). */
const END_EVENTS = ["run.terminal", "run.lost"];

let pg: PostgresCluster;
let stack: ProcStack | null = null;
let b: DaemonProcess | null = null;
let proxy: CutProxy | null = null;
let hook: WebhookReceiver | null = null;

beforeAll(async () => {
  pg = await startPostgresCluster();
}, 120_000);
afterAll(async () => {
  await pg?.close();
});
afterEach(async () => {
  await hook?.close();
  hook = null;
  await b?.stop();
  b = null;
  await stack?.stop();
  stack = null;
  await proxy?.close();
  proxy = null;
});

/** A request whose connection the receiver accepted after the kill, its sender no longer alive: the killed one's. */
const GONE = "gone";
/** A request's sender: an instance's pid, GONE, or undefined when nobody alive was found before the kill. */
type Sender = number | typeof GONE | undefined;

interface Row {
  seq: number;
  event_id: string;
  run_id: string;
  event_type: string;
  status: string;
  attempts: number;
}

describe("webhooks from two instances on PostgreSQL, one killed mid-delivery", () => {
  it("delivers every event once per attempt, the killed instance's attempt by the other, in order per run", async () => {
    proxy = await new CutProxy().listen();
    stack = await new ProcStack({
      runners: [{ id: "r1", projects: ["demo"] }],
      server: "child",
      stateUrl: await pg.createDatabase(),
      linkPort: proxy.port,
      extraServerToml: WEBHOOK_TOML,
    }).init();
    const s = stack;
    const portA = s.port;
    const portB = await freePort();
    b = await startInstanceB(s, portB);
    const pidA = s.serverChild?.pid as number;
    const pidB = b.pid as number;
    const portOf = new Map([
      [pidA, portA],
      [pidB, portB],
    ]);
    proxy.targetPort = portA;
    await s.startRunner("r1");

    // Each request's sender, looked up when its connection is accepted (its sender holds it open then; by the
    // time a loaded receiver reads the request, a sender whose attempt timed out may have closed it). A loaded
    // receiver may accept a connection only after the kill: one whose sender is no longer alive then is GONE,
    // the killed instance's (it is the only process that dies); before the kill, nobody may be unknown.
    const senders: Sender[] = [];
    const owners = new Map<number, Sender>();
    let killing = false;
    let armed = false;
    let held: number | null = null;
    hook = await new WebhookReceiver((req, index) => {
      senders[index] = owners.get(req.remotePort);
      if (armed && held === null) {
        held = index;
        return HOLD;
      }
      return 200;
    }).start();
    const hookPort = Number(new URL(hook.url).port);
    hook.onConnection((socket) => {
      const owner = socketOwner(socket.remotePort ?? 0, hookPort, [pidA, pidB]);
      owners.set(socket.remotePort ?? 0, owner ?? (killing ? GONE : undefined));
    });
    const sub = await subscribe(s.serverConfigFile, "alice", hook.url, "run.started,run.terminal,run.lost");

    const runIds: string[] = [];
    for (let i = 0; i < RUNS; i++) {
      const port = i % 2 === 0 ? portA : portB;
      const started = okValue(
        await instanceApi<StartOutput>(port, "start", {
          project_id: "demo",
          provider_id: "fake",
          idempotency_key: `two-${i}`,
          prompt: SLOW_PROMPT,
        }),
      );
      runIds.push(started.run_id);
    }
    armed = true;
    const { index: heldIndex } = await poll(() => (held === null ? undefined : { index: held }), {
      timeoutMs: DAEMON_WAIT_MS,
      intervalMs: DAEMON_POLL_MS / 5,
      what: "an attempt held by the receiver",
    });
    const killedPid = senders[heldIndex];
    expect(killedPid, "the held attempt's sender is one of the instances").toBeDefined();
    const survivorPid = killedPid === pidA ? pidB : pidA;
    const survivorPort = portOf.get(survivorPid) as number;
    const heldId = hook.received[heldIndex]?.headers["webhook-id"];
    // The Runner's reconnect goes to the survivor; the attempt in flight dies with its instance.
    proxy.targetPort = survivorPort;
    killing = true;
    if (killedPid === pidA) await s.killServer("SIGKILL");
    else {
      await b.signal("SIGKILL");
      b = null;
    }
    const receivedAtKill = hook.received.length;

    for (const runId of runIds) {
      await poll(
        async () => {
          const o = okValue(await instanceApi<ObserveOutput>(survivorPort, "observe", { run_id: runId, wait_secs: 2 }));
          return isTerminalState(o.state) ? o : undefined;
        },
        { timeoutMs: DAEMON_WAIT_MS * 2, intervalMs: DAEMON_POLL_MS, what: `run ${runId} ended` },
      );
    }
    // The killed instance's claims are taken again when their leases run out.
    const rows = await poll(
      async () => {
        const all = await s.stateRows<Row>(
          "SELECT seq, event_id, run_id, event_type, status, attempts FROM webhook_outbox ORDER BY seq",
        );
        const ended = (runId: string) => all.some((r) => r.run_id === runId && END_EVENTS.includes(r.event_type));
        return runIds.every(ended) && all.every((r) => r.status === "delivered")
          ? all.map((r) => ({ ...r, seq: Number(r.seq), attempts: Number(r.attempts) }))
          : undefined;
      },
      { timeoutMs: DAEMON_WAIT_MS + CLAIM_LEASE_MS * 2, intervalMs: DAEMON_POLL_MS, what: "every event delivered" },
    );

    const events = verified(hook, sub.secret);
    const byId = new Map(rows.map((r) => [r.event_id, r]));
    // Every run's start and end arrived, answered 200; nothing arrived that the outbox does not hold.
    for (const runId of runIds) {
      const ofRun = rows.filter((r) => r.run_id === runId).map((r) => r.event_type);
      expect(ofRun[0]).toBe("run.started");
      expect(ofRun.some((t) => END_EVENTS.includes(t))).toBe(true);
    }
    for (const row of rows) {
      expect(
        events.some((e) => e.id === row.event_id && e.status === 200),
        row.event_type,
      ).toBe(true);
    }
    for (const e of events) expect(byId.has(e.id)).toBe(true);
    // A duplicate repeats an id: one id per run and event type.
    for (const row of rows) {
      const ids = new Set(
        events.filter((e) => e.type === row.event_type && e.data.run_id === row.run_id).map((e) => e.id),
      );
      expect([...ids]).toEqual([row.event_id]);
    }
    // In order per run: the arrivals of one run's events never go back to an earlier one.
    for (const runId of runIds) {
      const seqs = events.filter((e) => e.data.run_id === runId).map((e) => byId.get(e.id)?.seq ?? -1);
      expect(seqs).toEqual([...seqs].sort((x, y) => x - y));
    }
    // Each attempt by one instance: every request came from A or B (or, read after the kill, from the killed
    // one), no instance sent an event twice (each answer but the held one was a 200), never more requests than
    // claims, and after the kill only the survivor made new ones.
    expect(
      senders.every((p) => p === pidA || p === pidB || p === GONE),
      JSON.stringify(senders),
    ).toBe(true);
    for (const row of rows) {
      const from = events.flatMap((e, i) =>
        e.id === row.event_id ? [senders[i] === GONE ? killedPid : senders[i]] : [],
      );
      expect(new Set(from).size, row.event_id).toBe(from.length);
      expect(from.length).toBeLessThanOrEqual(row.attempts);
    }
    expect(
      senders.slice(receivedAtKill).every((p) => p === survivorPid || p === GONE),
      JSON.stringify(senders),
    ).toBe(true);
    // The held attempt was the killed instance's; the survivor made the next one, with its id.
    expect(byId.get(heldId ?? "")?.attempts).toBe(2);
    const heldFrom = events.flatMap((e, i) => (e.id === heldId ? [senders[i]] : []));
    expect(heldFrom).toEqual([killedPid, survivorPid]);
    console.log(
      `webhooks on two instances: killed ${killedPid === pidA ? "A (the Runner's link)" : "B"} holding ${byId.get(heldId ?? "")?.event_type}; ${rows.length} events, ${events.length} requests`,
    );
  }, 360_000);
});
