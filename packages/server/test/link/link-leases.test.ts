/** The lease decisions of link/leases.ts and the refusal log's rate bound, on an injected clock. */
import { createHash } from "node:crypto";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { hashSecret, MemoryLeaseStore } from "../../src/link/lease-store.js";
import { LinkLeases } from "../../src/link/leases.js";
import { RefusalLog } from "../../src/refusal-log.js";

class Holder {
  closed = false;
  constructor(public lastHeardAt: number) {}
}

/** The secret of a grant or resume (fails the test on a refusal). */
function secretOf(outcome: Awaited<ReturnType<LinkLeases["acquire"]>>): string {
  if (outcome.kind === "refuse") throw new Error(`refused (${outcome.liveForMs} ms left)`);
  return outcome.secret;
}

describe("link leases", () => {
  it("grants a free runner id, resumes only with the holder's secret, refuses anyone else while the lease is live", async () => {
    let now = 1000;
    const leases = new LinkLeases(2000, () => now);
    const granted = await leases.acquire("r1", new Holder(now), undefined);
    expect(granted.kind).toBe("grant");
    const secret = secretOf(granted);
    expect(secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    now += 1500;
    expect(await leases.acquire("r1", new Holder(now), undefined)).toEqual({ kind: "refuse", liveForMs: 500 });
    expect(await leases.acquire("r1", new Holder(now), `${secret.slice(0, -1)}x`)).toMatchObject({ kind: "refuse" });
    expect(await leases.acquire("r1", new Holder(now), secret)).toEqual({ kind: "resume", secret });
    expect((await leases.acquire("r2", new Holder(now), undefined)).kind).toBe("grant");
  });

  it("keeps a lease for the heartbeat timeout after an abnormal close, counted from the holder's last word", async () => {
    let now = 0;
    const leases = new LinkLeases(2000, () => now);
    const a = new Holder(now);
    await leases.acquire("r1", a, undefined);
    now = 500;
    a.closed = true;
    await leases.closed("r1", a, false);
    a.lastHeardAt = 10_000; // what a closed holder says later does not extend its lease
    now = 1999;
    expect(await leases.acquire("r1", new Holder(now), undefined)).toEqual({ kind: "refuse", liveForMs: 1 });
    now = 2000;
    expect((await leases.acquire("r1", new Holder(now), undefined)).kind).toBe("grant");
  });

  it("ends a lease at once on the holder's clean close or a release, and ignores closes of non-holders", async () => {
    const now = 0;
    const leases = new LinkLeases(2000, () => now);
    const a = new Holder(now);
    await leases.acquire("r1", a, undefined);
    await leases.closed("r1", new Holder(now), true); // not the holder: nothing changes
    expect(await leases.acquire("r1", new Holder(now), undefined)).toMatchObject({ kind: "refuse" });
    await leases.closed("r1", a, true);
    const b = new Holder(now);
    const first = secretOf(await leases.acquire("r1", b, undefined));
    await leases.release("r1");
    const again = await leases.acquire("r1", new Holder(now), first);
    expect(again.kind).toBe("grant");
    expect(secretOf(again)).not.toBe(first);
  });
});

describe("refusal log", () => {
  it("logs at most N refusals per second per address and reports the suppressed count on the next logged line", () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino({ level: "info" }, { write: (s: string) => lines.push(JSON.parse(s)) });
    let now = 0;
    const log = new RefusalLog(logger, 3, () => now);
    for (let i = 0; i < 10; i++) log.refused("10.0.0.1", { path: "/mcp" }, "refused");
    for (let i = 0; i < 2; i++) log.refused("10.0.0.2", { path: "/mcp" }, "refused");
    expect(lines.filter((l) => l.remote === "10.0.0.1")).toHaveLength(3);
    expect(lines.filter((l) => l.remote === "10.0.0.2")).toHaveLength(2);
    expect(lines.some((l) => "suppressed" in l)).toBe(false);
    now = 999;
    log.refused("10.0.0.1", {}, "refused");
    expect(lines.filter((l) => l.remote === "10.0.0.1")).toHaveLength(3);
    now = 1000;
    log.refused("10.0.0.1", {}, "refused");
    expect(lines.at(-1)).toMatchObject({ remote: "10.0.0.1", suppressed: 8, msg: "refused" });
    log.refused("10.0.0.1", {}, "refused");
    expect(lines.at(-1)).not.toHaveProperty("suppressed");
  });
});

describe("link leases written down (a restarted Server, another instance)", () => {
  it("refuses a hello without the secret until the written-down lease expires; the holder's secret resumes", async () => {
    let now = 0;
    const store = new MemoryLeaseStore();
    const before = new LinkLeases(2000, () => now, store, "before");
    const a = new Holder(now);
    const secret = secretOf(await before.acquire("r1", a, undefined));
    now = 1500;
    a.lastHeardAt = 1500;
    expect(await before.persist()).toEqual([]);
    expect(store.rows.get("r1")?.expiresAtMs).toBe(3500);
    // The Server restarts: a new instance, the same store.
    const after = new LinkLeases(2000, () => now, store, "after");
    now = 2000;
    expect(await after.acquire("r1", new Holder(now), undefined)).toEqual({ kind: "refuse", liveForMs: 1500 });
    expect(await after.acquire("r1", new Holder(now), `${secret.slice(0, -1)}x`)).toMatchObject({ kind: "refuse" });
    expect(await after.acquire("r1", new Holder(now), secret)).toEqual({ kind: "resume", secret });
    const later = new LinkLeases(2000, () => now, store, "later");
    now = 3999;
    expect(await later.acquire("r1", new Holder(now), undefined)).toMatchObject({ kind: "refuse" });
    now = 4000;
    expect((await later.acquire("r1", new Holder(now), undefined)).kind).toBe("grant");
  });

  it("writes the digest computed when the lease was held on every heartbeat, with one interval of slack", async () => {
    let now = 0;
    const store = new MemoryLeaseStore();
    const leases = new LinkLeases(2000, () => now, store, "i1", 1000);
    const a = new Holder(now);
    const secret = secretOf(await leases.acquire("r1", a, undefined));
    const held = store.rows.get("r1")?.secretHash;
    expect(held).toEqual(createHash("sha256").update(secret, "utf8").digest());
    expect(store.rows.get("r1")?.expiresAtMs).toBe(3000);
    for (let beat = 1; beat <= 3; beat++) {
      now = beat * 500;
      a.lastHeardAt = now;
      await leases.persist();
      expect(store.rows.get("r1")?.secretHash).toEqual(held);
      expect(store.rows.get("r1")?.expiresAtMs).toBe(now + 3000);
    }
  });

  it("a clean close or a rotation erases the written-down lease", async () => {
    const store = new MemoryLeaseStore();
    const leases = new LinkLeases(2000, () => 0, store);
    const a = new Holder(0);
    await leases.acquire("r1", a, undefined);
    await leases.closed("r1", a, true);
    expect(store.rows.get("r1")).toBeUndefined();
    await leases.acquire("r2", new Holder(0), undefined);
    await leases.release("r2");
    expect(store.rows.get("r2")).toBeUndefined();
  });

  it("an instance whose lease another instance took stops extending it and reports it lost", async () => {
    let now = 0;
    const store = new MemoryLeaseStore();
    const a = new LinkLeases(2000, () => now, store, "A");
    const b = new LinkLeases(2000, () => now, store, "B");
    const holder = new Holder(0);
    const secret = secretOf(await a.acquire("r1", holder, undefined));
    // The Runner resumes on instance B while its old socket on A is still open.
    now = 100;
    expect(await b.acquire("r1", new Holder(now), secret)).toEqual({ kind: "resume", secret });
    expect(store.rows.get("r1")?.holder).toMatch(/^B\//);
    holder.lastHeardAt = 200;
    now = 200;
    expect(await a.persist()).toEqual(["r1"]);
    // A's later clean close of that socket does not end B's lease.
    await a.closed("r1", holder, true);
    expect(store.rows.get("r1")?.holder).toMatch(/^B\//);
    expect(store.rows.get("r1")?.secretHash).toEqual(hashSecret(secret));
  });
});
