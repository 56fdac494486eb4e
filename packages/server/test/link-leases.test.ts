/** The lease table of link/leases.ts and the refusal log's rate bound, on an injected clock. */
import { createHash } from "node:crypto";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { LinkLeases } from "../src/link/leases.js";
import { RefusalLog } from "../src/refusal-log.js";

class Holder {
  closed = false;
  constructor(public lastHeardAt: number) {}
}

describe("link leases", () => {
  it("grants a free runner id, resumes only with the holder's secret, refuses anyone else while the lease is live", () => {
    let now = 1000;
    const leases = new LinkLeases(2000, () => now);
    expect(leases.decide("r1", undefined)).toEqual({ kind: "grant" });
    const a = new Holder(now);
    const secret = leases.hold("r1", a, "grant");
    expect(secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    now += 1500;
    expect(leases.decide("r1", undefined)).toEqual({ kind: "refuse", liveForMs: 500 });
    expect(leases.decide("r1", `${secret.slice(0, -1)}x`)).toMatchObject({ kind: "refuse" });
    expect(leases.decide("r1", secret)).toEqual({ kind: "resume" });
    const b = new Holder(now);
    expect(leases.hold("r1", b, "resume")).toBe(secret);
    expect(leases.decide("r2", undefined)).toEqual({ kind: "grant" });
  });

  it("keeps a lease for the heartbeat timeout after an abnormal close, counted from the holder's last word", () => {
    let now = 0;
    const leases = new LinkLeases(2000, () => now);
    const a = new Holder(now);
    leases.hold("r1", a, "grant");
    now = 500;
    a.closed = true;
    leases.closed("r1", a, false);
    a.lastHeardAt = 10_000; // what a closed holder says later does not extend its lease
    now = 1999;
    expect(leases.decide("r1", undefined)).toEqual({ kind: "refuse", liveForMs: 1 });
    now = 2000;
    expect(leases.decide("r1", undefined)).toEqual({ kind: "grant" });
  });

  it("ends a lease at once on the holder's clean close or a release, and ignores closes of non-holders", () => {
    const now = 0;
    const leases = new LinkLeases(2000, () => now);
    const a = new Holder(now);
    leases.hold("r1", a, "grant");
    leases.closed("r1", new Holder(now), true); // not the holder: nothing changes
    expect(leases.decide("r1", undefined)).toMatchObject({ kind: "refuse" });
    leases.closed("r1", a, true);
    expect(leases.decide("r1", undefined)).toEqual({ kind: "grant" });
    const b = new Holder(now);
    const first = leases.hold("r1", b, "grant");
    leases.release("r1");
    expect(leases.decide("r1", first)).toEqual({ kind: "grant" });
    expect(leases.hold("r1", new Holder(now), "grant")).not.toBe(first);
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

describe("link leases written down (a restarted Server)", () => {
  class MemStore {
    readonly rows = new Map<string, { secretHash: Buffer; expiresAtMs: number }>();
    get(id: string) {
      return this.rows.get(id);
    }
    save(entries: readonly { runnerId: string; secretHash: Buffer; expiresAtMs: number }[]) {
      for (const e of entries) this.rows.set(e.runnerId, { secretHash: e.secretHash, expiresAtMs: e.expiresAtMs });
    }
    delete(id: string) {
      this.rows.delete(id);
    }
  }

  it("refuses a hello without the secret until the written-down lease expires; the holder's secret resumes", () => {
    let now = 0;
    const store = new MemStore();
    const before = new LinkLeases(2000, () => now, store);
    const a = new Holder(now);
    const secret = before.hold("r1", a, "grant");
    now = 1500;
    a.lastHeardAt = 1500;
    before.persist();
    expect(store.get("r1")?.expiresAtMs).toBe(3500);
    // The Server restarts: a new table in memory, the same store.
    const after = new LinkLeases(2000, () => now, store);
    now = 2000;
    expect(after.decide("r1", undefined)).toEqual({ kind: "refuse", liveForMs: 1500 });
    expect(after.decide("r1", `${secret.slice(0, -1)}x`)).toMatchObject({ kind: "refuse" });
    expect(after.decide("r1", secret)).toEqual({ kind: "resume" });
    expect(after.hold("r1", new Holder(now), "resume", secret)).toBe(secret);
    const later = new LinkLeases(2000, () => now, store);
    now = 3999;
    expect(later.decide("r1", undefined)).toMatchObject({ kind: "refuse" });
    now = 4000;
    expect(later.decide("r1", undefined)).toEqual({ kind: "grant" });
  });

  it("writes the digest computed when the lease was held on every heartbeat, never hashing the secret again", () => {
    let now = 0;
    const store = new MemStore();
    const leases = new LinkLeases(2000, () => now, store);
    const a = new Holder(now);
    const secret = leases.hold("r1", a, "grant");
    const held = store.get("r1")?.secretHash;
    expect(held).toEqual(createHash("sha256").update(secret, "utf8").digest());
    for (let beat = 1; beat <= 3; beat++) {
      now = beat * 500;
      a.lastHeardAt = now;
      leases.persist();
      expect(store.get("r1")?.secretHash).toBe(held);
    }
  });

  it("a clean close or a rotation erases the written-down lease", () => {
    const store = new MemStore();
    const leases = new LinkLeases(2000, () => 0, store);
    const a = new Holder(0);
    leases.hold("r1", a, "grant");
    leases.closed("r1", a, true);
    expect(store.get("r1")).toBeUndefined();
    leases.hold("r2", new Holder(0), "grant");
    leases.release("r2");
    expect(store.get("r2")).toBeUndefined();
  });
});
