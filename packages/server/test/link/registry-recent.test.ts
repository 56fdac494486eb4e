/**
 * `Registry.lookupRecent` (link/registry.ts): observe's catch-ups reuse a remote view of a Runner linked to
 * another instance for REMOTE_VIEW_REUSE_MS, but never one that names another agent instance than the
 * mirror's, never one a request found stale (the holder answered not_sent), and never past its time.
 * The forwarded sync through such a view names its agent instance, which the holder checks
 * (cluster-routing.test.ts).
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { ClusterDirectory, RemoteRunnerView } from "../../src/cluster/directory.js";
import { handleLinkRequest } from "../../src/cluster/link-request.js";
import { PeerAuth } from "../../src/cluster/peer-auth.js";
import { remoteRunners } from "../../src/cluster/remote-runner.js";
import { buildServerConfig } from "../../src/config.js";
import { REMOTE_VIEW_REUSE_MS, Registry } from "../../src/link/registry.js";

const INSTANCE_X = `ai_${"x".repeat(22)}`;
const INSTANCE_Y = `ai_${"y".repeat(22)}`;

let holder: Server | null = null;
afterEach(async () => {
  vi.useRealTimers();
  await new Promise<void>((resolve) => (holder ? holder.close(() => resolve()) : resolve()));
  holder = null;
});

/** A holder that answers every link request `not_sent` (it no longer has the Runner). */
async function holderWithoutTheRunner(): Promise<string> {
  // The holder's own answer, signed for the request (cluster/peer-auth.ts).
  const auth = new PeerAuth(Buffer.alloc(32, 1), "holder", pino({ level: "silent" }));
  const server = createServer((req, res) => {
    void handleLinkRequest(req, res, auth, async () => ({ ok: false, reason: "not_sent" }));
  });
  holder = server;
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function registryWith(
  views: RemoteRunnerView[],
  url = "http://127.0.0.1:9",
): { registry: Registry; reads: () => number } {
  let reads = 0;
  const directory = {
    remoteRunner: async () => {
      const view = views[Math.min(reads, views.length - 1)];
      reads += 1;
      return view === undefined ? undefined : { ...view, holderUrl: url };
    },
  } as unknown as ClusterDirectory;
  const config = buildServerConfig({ server: { port: 0 } }, { file: null, baseDir: "/" });
  const registry = new Registry(config);
  registry.joinCluster(
    remoteRunners({
      directory,
      key: Buffer.alloc(32, 1),
      requestTimeoutMs: 1_000,
      log: pino({ level: "silent" }),
    }),
  );
  return { registry, reads: () => reads };
}

function view(agentInstanceId: string): RemoteRunnerView {
  return {
    runnerId: "r1",
    holderInstanceId: "holder",
    holderLease: "holder/1",
    holderUrl: "",
    agentInstanceId,
    storeId: "st_1",
    providers: [],
    projects: [],
    maxConcurrentRuns: 1,
    connectedAt: new Date().toISOString(),
    agentsShareRunnerUser: false,
  };
}

describe("a remote view reused by observe's catch-ups", () => {
  it("is read once for the mirror's agent instance within REMOTE_VIEW_REUSE_MS, and again after it", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    const { registry, reads } = registryWith([view(INSTANCE_X)]);
    expect((await registry.lookupRecent("r1", INSTANCE_X))?.agentInstanceId).toBe(INSTANCE_X);
    expect((await registry.lookupRecent("r1", INSTANCE_X))?.agentInstanceId).toBe(INSTANCE_X);
    expect(reads()).toBe(1);
    vi.setSystemTime(Date.now() + REMOTE_VIEW_REUSE_MS);
    await registry.lookupRecent("r1", INSTANCE_X);
    expect(reads()).toBe(2);
    // `lookup` (decisions: starts, cancels) always reads.
    await registry.lookup("r1");
    expect(reads()).toBe(3);
  });

  it("is read once for the lookups of one Runner that start while it is being read", async () => {
    const { registry, reads } = registryWith([view(INSTANCE_X)]);
    const all = await Promise.all(Array.from({ length: 20 }, () => registry.lookupRecent("r1", INSTANCE_X)));
    expect(all.every((r) => r?.agentInstanceId === INSTANCE_X)).toBe(true);
    expect(reads()).toBe(1);
  });

  it("is read again when the mirror follows another agent instance, or has none yet", async () => {
    const { registry, reads } = registryWith([view(INSTANCE_X), view(INSTANCE_Y)]);
    await registry.lookupRecent("r1", INSTANCE_X);
    expect((await registry.lookupRecent("r1", INSTANCE_Y))?.agentInstanceId).toBe(INSTANCE_Y);
    expect(reads()).toBe(2);
    await registry.lookupRecent("r1", null);
    expect(reads()).toBe(3);
  });

  it("is read again once a request through it found the holder without that Runner", async () => {
    const url = await holderWithoutTheRunner();
    const { registry, reads } = registryWith([view(INSTANCE_X)], url);
    const runner = await registry.lookupRecent("r1", INSTANCE_X);
    const outcome = await runner?.conn.request({
      type: "run.sync",
      run_id: `wc_agent_run_${"a".repeat(26)}`,
      after_seq: 0,
      max_events: 0,
    });
    expect(outcome).toEqual({ ok: false, reason: "not_sent" });
    await registry.lookupRecent("r1", INSTANCE_X);
    expect(reads()).toBe(2);
  });
});
