import { describe, expect, it } from "vitest";
import { hashSecret, leaseHolderIn, StateLeaseStore } from "../../src/link/lease-store.js";
import { type LeaseAcquired, LinkLeases } from "../../src/link/leases.js";
import { PresenceStore, presenceAt } from "../../src/link/presence.js";
import { LINK_REFUSAL_AUDIT_WINDOW_MS, RunnerTokenStore } from "../../src/link/runner-tokens.js";
import { StateAuditLog } from "../../src/mcp/audit.js";
import { hashToken, principalLookup, TokenStore } from "../../src/principals/tokens.js";
import type { StateEngine } from "../../src/state/engine.js";
import { ENGINE_NAMES, engineFixture } from "../support/engines.js";

/** Rounds of the hello race per engine: each round is a fresh runner id and HELLOS concurrent hellos. */
const RACE_ROUNDS = 20;
/** Concurrent hellos per round, spread over the two instances (within the PostgreSQL pool size). */
const HELLOS = 8;
/** The lease timeout of these tests (two heartbeat intervals of HEARTBEAT_MS). */
const HEARTBEAT_MS = 1_000;
const LEASE_TIMEOUT_MS = 2 * HEARTBEAT_MS;

const fixture = engineFixture();

/** Two connections (pools) to one fresh, migrated database: what two Server instances share (SQLite: one). */
type Instances = [StateEngine, StateEngine];

const ENGINES = ENGINE_NAMES.map(({ name }) => ({
  name,
  async instances(): Promise<Instances> {
    const [a, b] = await fixture.instances(name, 2);
    return [a as StateEngine, b as StateEngine];
  },
}));

class Holder {
  closed = false;
  constructor(public lastHeardAt: number) {}
}

function leasesOn(engine: StateEngine, instanceId: string, now: () => number): LinkLeases {
  return new LinkLeases(LEASE_TIMEOUT_MS, now, new StateLeaseStore(engine), instanceId, HEARTBEAT_MS);
}

interface LeaseRowView {
  secret_hash: string;
  holder: string;
}

async function leaseRow(engine: StateEngine, runnerId: string): Promise<LeaseRowView | undefined> {
  return await engine.get<LeaseRowView>("SELECT secret_hash, holder FROM runner_link_leases WHERE runner_id = ?", [
    runnerId,
  ]);
}

function held(outcomes: readonly LeaseAcquired[]): (LeaseAcquired & { kind: "grant" | "resume" })[] {
  return outcomes.filter((o): o is LeaseAcquired & { kind: "grant" | "resume" } => o.kind !== "refuse");
}

describe.each(ENGINES)("link and principal state on $name", ({ instances }) => {
  it("lets exactly one of several concurrent hellos of one Runner hold its lease, on one instance and across two", async () => {
    const [a, b] = await instances();
    const now = () => Date.now();
    const onA = leasesOn(a, "A", now);
    const onB = leasesOn(b, "B", now);
    for (let round = 0; round < RACE_ROUNDS; round++) {
      const runnerId = `race-${round}`;
      const outcomes = await Promise.all(
        Array.from({ length: HELLOS }, (_, i) =>
          (i % 2 === 0 ? onA : onB).acquire(runnerId, new Holder(Date.now()), undefined),
        ),
      );
      const winners = held(outcomes);
      expect(
        winners.map((w) => w.kind),
        `round ${round}`,
      ).toEqual(["grant"]);
      expect(outcomes.filter((o) => o.kind === "refuse")).toHaveLength(HELLOS - 1);
      // The row names the winner's secret: only it resumes.
      const row = await leaseRow(b, runnerId);
      expect(row?.secret_hash).toBe(hashSecret(winners[0]!.secret).toString("hex"));
      expect(row?.holder).toMatch(/^[AB]\/\d+$/);
    }
  });

  it("after the holder went quiet past the lease, exactly one of two instances' hellos takes it over; the old secret no longer resumes", async () => {
    const [a, b] = await instances();
    let clock = 1_000_000;
    const now = () => clock;
    const onA = leasesOn(a, "A", now);
    const onB = leasesOn(b, "B", now);
    const first = await onA.acquire("r1", new Holder(clock), undefined);
    if (first.kind !== "grant") throw new Error("the first hello was not granted");
    // Held on A: a hello on B without the secret is refused, with it the Runner resumes there.
    clock += HEARTBEAT_MS;
    expect((await onB.acquire("r1", new Holder(clock), undefined)).kind).toBe("refuse");
    // A's holder says nothing more; past timeout + slack the row is dead for everyone.
    clock += LEASE_TIMEOUT_MS + HEARTBEAT_MS;
    const outcomes = await Promise.all([
      onA.acquire("r1", new Holder(clock), undefined),
      onB.acquire("r1", new Holder(clock), undefined),
      onB.acquire("r1", new Holder(clock), undefined),
      onA.acquire("r1", new Holder(clock), undefined),
    ]);
    const winners = held(outcomes);
    expect(winners.map((w) => w.kind)).toEqual(["grant"]);
    expect(winners[0]!.secret).not.toBe(first.secret);
    expect((await onA.acquire("r1", new Holder(clock), first.secret)).kind).toBe("refuse");
    expect(await onB.acquire("r1", new Holder(clock), winners[0]!.secret)).toEqual({
      kind: "resume",
      secret: winners[0]!.secret,
    });
  });

  it("a lease resumed on another instance is lost by the first: it stops extending it and its clean close leaves it alone", async () => {
    const [a, b] = await instances();
    const clock = 5_000_000;
    const onA = leasesOn(a, "A", () => clock);
    const onB = leasesOn(b, "B", () => clock);
    const holderOnA = new Holder(clock);
    const granted = await onA.acquire("r1", holderOnA, undefined);
    if (granted.kind !== "grant") throw new Error("not granted");
    expect(await onB.acquire("r1", new Holder(clock), granted.secret)).toEqual({
      kind: "resume",
      secret: granted.secret,
    });
    expect(await onA.persist()).toEqual(["r1"]);
    await onA.closed("r1", holderOnA, true);
    expect((await leaseRow(a, "r1"))?.holder).toMatch(/^B\//);
  });

  it("tells inside a transaction of either instance which holder the database says holds a lease (RunContext.linkHeld)", async () => {
    const [a, b] = await instances();
    const clock = 5_000_000;
    const onA = leasesOn(a, "A", () => clock);
    const onB = leasesOn(b, "B", () => clock);
    expect(await a.transaction((tx) => leaseHolderIn(tx, "r1"))).toBeUndefined();
    const holderOnA = new Holder(clock);
    const granted = await onA.acquire("r1", holderOnA, undefined);
    if (granted.kind !== "grant") throw new Error("not granted");
    const onAId = onA.holderIdOf("r1", holderOnA);
    expect(onAId).toMatch(/^A\//);
    expect(await b.transaction((tx) => leaseHolderIn(tx, "r1"))).toBe(onAId);
    await onB.acquire("r1", new Holder(clock), granted.secret);
    const now = await a.transaction((tx) => leaseHolderIn(tx, "r1"));
    expect(now).toMatch(/^B\//);
    expect(now).not.toBe(onAId);
  });

  it("verifies a bearer token issued on one instance on the other, and a revocation on either applies at the next verify", async () => {
    const [a, b] = await instances();
    const principals = [{ id: "alice", scopes: ["project:read", "project:write"] as const, projects: ["demo"] }];
    const lookup = principalLookup(principals.map((p) => ({ ...p, scopes: [...p.scopes] })));
    const onA = new TokenStore(a);
    const onB = new TokenStore(b);
    const issued = await onA.issue(
      { principal_id: "alice", scopes: ["project:read"], projects: ["demo"], allowCodingAgentRun: false },
      lookup,
    );
    const seen = await onB.identify(issued.token, lookup);
    expect(seen?.token_id).toBe(issued.token_id);
    expect([...(seen?.principal.scopes ?? [])]).toEqual(["project:read"]);
    expect((await onB.principalOfId(issued.token_id, lookup))?.id).toBe("alice");
    expect(await onB.revoke(issued.token_id)).toBe(true);
    expect(await onA.verify(issued.token, lookup)).toBeNull();
    expect(await onA.principalOfId(issued.token_id, lookup)).toBeNull();
    expect(await onA.revoke(issued.token_id)).toBe(false);
    const listed = await onA.list("alice");
    expect(listed.map((t) => [t.token_id, t.revoked_at !== null])).toEqual([[issued.token_id, true]]);
    // Only the hash is stored.
    const rows = await a.all<{ token_hash: string }>("SELECT token_hash FROM principal_tokens");
    expect(rows).toEqual([{ token_hash: hashToken(issued.token) }]);
  });

  it("a runner token rotated on one instance is the one the other reads, at once; link audit rows aggregate refusals", async () => {
    const [a, b] = await instances();
    const onA = new RunnerTokenStore(a);
    const onB = new RunnerTokenStore(b);
    expect((await onB.overrides()).size).toBe(0);
    const token = await onA.rotate("r1");
    expect((await onB.overrides()).get("r1")).toEqual(Buffer.from(hashToken(token), "hex"));
    const again = await onB.rotate("r1");
    expect((await onA.overrides()).get("r1")).toEqual(Buffer.from(hashToken(again), "hex"));

    const t0 = new Date(2_000_000_000_000);
    const entry = { runner_id: "r1", remote: "10.0.0.9", conn: 3, agent_instance_id: "ai" };
    await onA.audit({ ...entry, event: "link_granted" }, () => t0);
    for (let i = 1; i <= 3; i++) {
      await onA.audit({ ...entry, event: "link_refused_in_use" }, () => new Date(t0.getTime() + i));
    }
    await onA.audit(
      { ...entry, event: "link_refused_in_use" },
      () => new Date(t0.getTime() + LINK_REFUSAL_AUDIT_WINDOW_MS + 1),
    );
    const rows = await onB.auditRows();
    expect(rows.map((r) => [r.event, r.count])).toEqual([
      ["link_granted", 1],
      ["link_refused_in_use", 3],
      ["link_refused_in_use", 1],
    ]);
  });

  it("writes presence in order, reads it from the other instance, and an old link's end does not take a moved link offline; MCP audit rows round-trip", async () => {
    const [a, b] = await instances();
    const failures: unknown[] = [];
    const presence = new PresenceStore(a, (err) => failures.push(err));
    const t0 = 2_000_000_000_000;
    // Not awaited one by one: the store keeps them in order.
    const online = presence.online(
      {
        runner_id: "r1",
        protocol_version: 2,
        agent_instance_id: "ai",
        store_id: "s",
        projects: [{ project_id: "demo", allow_patch: true }],
        providers: [{ provider_id: "fake", name: "Fake", provider_instance_id: "p", allowed_config_options: [] }],
        max_concurrent_runs: 2,
        agents_share_runner_user: null,
        runner_version: "0.1.0",
      },
      new Date(t0),
    );
    const seen = presence.seen(["r1"], t0 + 1_000);
    const offline = presence.offline("r1", new Date(t0 + 2_000));
    await Promise.all([online, seen, offline]);
    expect(failures).toEqual([]);
    const row = (await new PresenceStore(b).rows()).find((r) => r.runner_id === "r1");
    expect(row).toMatchObject({ runner_id: "r1", online: 0, seen_ms: t0 + 1_000, agents_share_runner_user: null });
    expect(presenceAt(row!, t0 + 3_000)).toEqual({ online: false, since: new Date(t0 + 2_000).toISOString() });

    // The Runner's link moves to instance B; A's late end of its own link leaves B's online row alone.
    const onB = new PresenceStore(b, (err) => failures.push(err));
    const advert = {
      runner_id: "r2",
      protocol_version: 2,
      agent_instance_id: "ai2",
      store_id: "s2",
      projects: [],
      providers: [],
      max_concurrent_runs: 1,
      agents_share_runner_user: false,
      runner_version: null,
    };
    await presence.online(advert, new Date(t0));
    await onB.online(advert, new Date(t0 + 500));
    await presence.offline("r2", new Date(t0 + 600), new Date(t0));
    const moved = (await onB.rows()).find((r) => r.runner_id === "r2");
    expect(moved).toMatchObject({ online: 1, since: new Date(t0 + 500).toISOString() });
    await onB.offline("r2", new Date(t0 + 700), new Date(t0 + 500));
    expect((await presence.rows()).find((r) => r.runner_id === "r2")).toMatchObject({ online: 0 });

    const audit = new StateAuditLog(a, { onError: (err) => failures.push(err) });
    for (let i = 0; i < 5; i++) {
      audit.record({
        principal_id: "alice",
        tool: "observe_coding_agent",
        run_id: null,
        task_id: i === 0 ? "task_1" : null,
        outcome: "ok",
        input_bytes: i,
        output_bytes: 1,
        duration_ms: 1,
      });
    }
    await audit.close();
    const listed = await new StateAuditLog(b).list();
    expect(listed.map((r) => [r.input_bytes, r.task_id])).toEqual([
      [0, "task_1"],
      [1, null],
      [2, null],
      [3, null],
      [4, null],
    ]);
    expect(failures).toEqual([]);
  });
});
