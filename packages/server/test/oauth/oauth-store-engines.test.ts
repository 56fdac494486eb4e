import { describe, expect, it } from "vitest";
import { CONSOLE_MAX_SESSIONS_PER_PRINCIPAL, ConsoleSessions } from "../../src/console/sessions.js";
import { OperatorReadClients } from "../../src/oauth/operator-read.js";
import { type CodeOutcome, OAuthStore, type RefreshOutcome, type TokenTtls } from "../../src/oauth/store.js";
import type { StateEngine } from "../../src/state/engine.js";
import { ENGINE_NAMES, engineFixture } from "../support/engines.js";
import { created } from "../support/oauth.js";

/** Rounds of each race per engine: each round is a fresh code, token or client and two concurrent calls. */
const RACE_ROUNDS = 25;
/** Registrations racing for the dynamic-client bound (more than the bound, fewer than a pool's connections). */
const REGISTRATIONS = 8;
/** The bound those registrations race for. */
const MAX_REGISTERED = 3;

const REDIRECT = "https://app.example/cb";
const NO_GRACE: TokenTtls = { accessMs: 3_600_000, refreshMs: 86_400_000, reuseGraceMs: 0 };
const GRACE: TokenTtls = { ...NO_GRACE, reuseGraceMs: 30_000 };

const fixture = engineFixture();

/** What one test races on: two engines on one database (the same engine twice on SQLite). */
interface Instances {
  a: StateEngine;
  b: StateEngine;
}

const ENGINES = ENGINE_NAMES.map(({ name }) => ({
  name,
  async instances(): Promise<Instances> {
    const [a, b] = await fixture.instances(name, 2);
    return { a: a as StateEngine, b: b as StateEngine };
  },
}));

describe.each(ENGINES)("OAuth store on $name", ({ instances }) => {
  /** Two stores (two Server instances on PostgreSQL) sharing one clock. */
  async function stores(): Promise<{ a: OAuthStore; b: OAuthStore; clock: { now: number } }> {
    const { a, b } = await instances();
    const clock = { now: Date.now() };
    return { a: new OAuthStore(a, () => clock.now), b: new OAuthStore(b, () => clock.now), clock };
  }

  async function grantWithCode(store: OAuthStore, clientId = "c1"): Promise<{ grant_id: string; code: string }> {
    return await created(
      store.createGrantWithCode(
        {
          client_id: clientId,
          principal_id: "alice",
          key_id: null,
          scopes: ["project:read", "project:write"],
          projects: ["demo"],
          resource: "https://a.example/mcp",
        },
        { redirect_uri: REDIRECT, code_challenge: "challenge" },
      ),
    );
  }

  async function refreshToken(store: OAuthStore): Promise<{ grant_id: string; refresh: string; access: string }> {
    const { grant_id, code } = await grantWithCode(store);
    const r = await store.redeemCode(code, "c1", REDIRECT, NO_GRACE);
    if (!r.ok) throw new Error(`code not redeemed: ${r.reason}`);
    return { grant_id, refresh: r.pair.refresh_token, access: r.pair.access_token };
  }

  async function auditCount(store: OAuthStore, event: string): Promise<number> {
    return (await store.auditRows(10_000)).filter((r) => r.event === event).length;
  }

  it("redeems a code at most once when two redemptions race; the loser revokes the grant", async () => {
    const { a, b } = await stores();
    await a.upsertClient({ client_id: "c1", kind: "dynamic", client_name: null, redirect_uris: [REDIRECT] });
    for (let round = 0; round < RACE_ROUNDS; round += 1) {
      const { grant_id, code } = await grantWithCode(a);
      const outcomes: CodeOutcome[] = await Promise.all([
        a.redeemCode(code, "c1", REDIRECT, NO_GRACE),
        b.redeemCode(code, "c1", REDIRECT, NO_GRACE),
      ]);
      const won = outcomes.filter((o) => o.ok);
      expect(won, `round ${round}`).toHaveLength(1);
      expect(outcomes.filter((o) => !o.ok)).toEqual([{ ok: false, reason: "reused" }]);
      // The reuse took the grant, and the pair the winner got, with it.
      expect((await a.grant(grant_id))?.revoked_reason).toBe("code_reused");
      const pair = won[0]?.ok ? won[0].pair : undefined;
      expect(await b.accessToken(pair?.access_token ?? "")).toBeUndefined();
      expect(await b.rotateRefresh(pair?.refresh_token ?? "", "c1", undefined, NO_GRACE)).toEqual({
        ok: false,
        reason: "unknown",
      });
    }
    expect(await auditCount(a, "code_reused")).toBe(RACE_ROUNDS);
  });

  it("rotates a refresh token at most once when two rotations race; without a grace window the loser revokes the family", async () => {
    const { a, b } = await stores();
    await a.upsertClient({ client_id: "c1", kind: "dynamic", client_name: null, redirect_uris: [REDIRECT] });
    for (let round = 0; round < RACE_ROUNDS; round += 1) {
      const { grant_id, refresh, access } = await refreshToken(a);
      const outcomes: RefreshOutcome[] = await Promise.all([
        a.rotateRefresh(refresh, "c1", undefined, NO_GRACE),
        b.rotateRefresh(refresh, "c1", undefined, NO_GRACE),
      ]);
      expect(
        outcomes.filter((o) => o.ok),
        `round ${round}`,
      ).toHaveLength(1);
      expect(outcomes.filter((o) => !o.ok)).toEqual([{ ok: false, reason: "reused" }]);
      expect((await b.grant(grant_id))?.revoked_reason).toBe("refresh_reused");
      // Every token of the family is gone, the one the winner was just given included.
      const winner = outcomes.find((o) => o.ok);
      for (const token of [access, winner?.ok ? winner.pair.access_token : ""]) {
        expect(await a.accessToken(token)).toBeUndefined();
      }
      const next = winner?.ok ? winner.pair.refresh_token : "";
      expect(await a.rotateRefresh(next, "c1", undefined, NO_GRACE)).toEqual({ ok: false, reason: "unknown" });
    }
    expect(await auditCount(a, "refresh_reused")).toBe(RACE_ROUNDS);
  });

  it("within the grace window, the losing rotation gets the winner's very pair and the family lives on", async () => {
    const { a, b } = await stores();
    await a.upsertClient({ client_id: "c1", kind: "dynamic", client_name: null, redirect_uris: [REDIRECT] });
    for (let round = 0; round < RACE_ROUNDS; round += 1) {
      const { grant_id, refresh } = await refreshToken(a);
      const [x, y] = await Promise.all([
        a.rotateRefresh(refresh, "c1", undefined, GRACE),
        b.rotateRefresh(refresh, "c1", undefined, GRACE),
      ]);
      if (!x?.ok || !y?.ok) throw new Error(`round ${round}: a rotation failed: ${JSON.stringify([x, y])}`);
      expect([x.replayed, y.replayed].sort(), `round ${round}`).toEqual([false, true]);
      expect(y.pair).toEqual(x.pair);
      expect((await a.grant(grant_id))?.revoked_at).toBeNull();
      expect(await b.accessToken(x.pair.access_token)).toBeDefined();
    }
    expect(await auditCount(a, "refresh_replayed")).toBe(RACE_ROUNDS);
    expect(await auditCount(a, "refresh_reused")).toBe(0);
  });

  it("never leaves a live grant under a client revoked while a grant for it was being created", async () => {
    const { a, b } = await stores();
    for (let round = 0; round < RACE_ROUNDS; round += 1) {
      const clientId = `c_race_${round}`;
      await a.upsertClient({ client_id: clientId, kind: "dynamic", client_name: null, redirect_uris: [REDIRECT] });
      const [grant, revoked] = await Promise.all([
        b.createGrantWithCode(
          {
            client_id: clientId,
            principal_id: "alice",
            key_id: null,
            scopes: ["project:read"],
            projects: [],
            resource: "r",
          },
          { redirect_uri: REDIRECT, code_challenge: "challenge" },
        ),
        a.revokeClient(clientId),
      ]);
      expect(revoked).toBe(true);
      const live = (await a.grants({ client_id: clientId })).filter((g) => g.revoked_at === null);
      expect(live, `round ${round}`).toEqual([]);
      if (grant !== null) {
        // Created first, then revoked with its client: its code no longer yields tokens.
        const r = await a.redeemCode(grant.code, clientId, REDIRECT, NO_GRACE);
        expect(r).toEqual({ ok: false, reason: "revoked" });
      }
    }
  });

  it("keeps registered clients within the bound when registrations arrive at both instances at once", async () => {
    const { a, b } = await stores();
    const admitted = await Promise.all(
      Array.from({ length: REGISTRATIONS }, (_, i) =>
        (i % 2 === 0 ? a : b).upsertRegistered(
          { client_id: `dyn_${i}`, kind: "dynamic", client_name: null, redirect_uris: [REDIRECT], issuer: "https://a" },
          MAX_REGISTERED,
        ),
      ),
    );
    // Nothing held a grant, so every registration found room by evicting the oldest.
    expect(admitted).toEqual(Array.from({ length: REGISTRATIONS }, () => true));
    expect(await a.clients()).toHaveLength(MAX_REGISTERED);
    expect(await auditCount(a, "client_registered")).toBe(REGISTRATIONS);
    // Once every held client has a live grant, none can make room: refused, nothing written.
    for (const c of await a.clients()) await grantWithCode(a, c.client_id);
    const full = await Promise.all([
      a.upsertRegistered(
        { client_id: "late_a", kind: "dynamic", client_name: null, redirect_uris: [REDIRECT] },
        MAX_REGISTERED,
      ),
      b.upsertRegistered(
        { client_id: "late_b", kind: "cimd", client_name: null, redirect_uris: [REDIRECT] },
        MAX_REGISTERED,
      ),
    ]);
    expect(full).toEqual([false, false]);
    expect((await b.clients()).map((c) => c.client_id)).not.toContain("late_a");
  });

  it("a rotation, a revocation and a clean-up of expired rows racing on one family all complete; the family ends revoked", async () => {
    const { a, b, clock } = await stores();
    await a.upsertClient({ client_id: "c1", kind: "dynamic", client_name: null, redirect_uris: [REDIRECT] });
    for (let round = 0; round < RACE_ROUNDS; round += 1) {
      const short: TokenTtls = { accessMs: 1_000, refreshMs: 60_000, reuseGraceMs: 5_000 };
      const { grant_id, code } = await grantWithCode(a);
      const first = await a.redeemCode(code, "c1", REDIRECT, short);
      if (!first.ok) throw new Error(first.reason);
      const second = await a.rotateRefresh(first.pair.refresh_token, "c1", undefined, short);
      if (!second.ok) throw new Error(second.reason);
      clock.now += 10_000; // the access tokens expired, the spent refresh token's successor is past its window
      const [rotated, revoked, other] = await Promise.all([
        b.rotateRefresh(second.pair.refresh_token, "c1", undefined, short),
        a.revokeGrant(grant_id, "operator"),
        grantWithCode(b),
      ]);
      // Either the rotation came first and the revocation then took its pair, or it found the family revoked.
      expect(["ok", "unknown", "revoked"]).toContain(rotated.ok ? "ok" : rotated.reason);
      expect(revoked).toBe(true);
      expect(other.code).toMatch(/^wcoc_/);
      expect((await a.grant(grant_id))?.revoked_reason).toBe("operator");
      if (rotated.ok) expect(await a.accessToken(rotated.pair.access_token)).toBeUndefined();
    }
  });
});

describe.each(ENGINES)("operator-read clients and console sessions on $name", ({ instances }) => {
  it("provisions operator:read once, audited with the change, and reads it from any instance", async () => {
    const { a, b } = await instances();
    const storeA = new OAuthStore(a);
    const [first, second] = await Promise.all([
      new OperatorReadClients(storeA).set("c1", true),
      new OperatorReadClients(new OAuthStore(b)).set("c1", true),
    ]);
    expect([first, second].sort()).toEqual([false, true]);
    expect(await new OperatorReadClients(new OAuthStore(b)).has("c1")).toBe(true);
    expect([...(await new OperatorReadClients(storeA).all())]).toEqual(["c1"]);
    expect(await new OperatorReadClients(storeA).set("c1", false)).toBe(true);
    expect(await new OperatorReadClients(new OAuthStore(b)).has("c1")).toBe(false);
    const events = (await storeA.auditRows()).map((r) => `${r.event} ${r.scopes}`);
    expect(events).toEqual(["client_provisioned operator:read", "client_unprovisioned operator:read"]);
  });

  it("keeps a principal within its session bound when logins arrive at both instances at once", async () => {
    const { a, b } = await instances();
    let now = 1_000_000;
    const clock = () => now;
    const sa = new ConsoleSessions(a, clock);
    const sb = new ConsoleSessions(b, clock);
    const logins = CONSOLE_MAX_SESSIONS_PER_PRINCIPAL + 4;
    const ids = await Promise.all(
      Array.from({ length: logins }, (_, i) => (i % 2 === 0 ? sa : sb).open("alice", `tok_${i}`)),
    );
    const live = (await Promise.all(ids.map((id) => sb.get(id)))).filter((s) => s !== null);
    expect(live).toHaveLength(CONSOLE_MAX_SESSIONS_PER_PRINCIPAL);
    const mine = ids.find((_, i) => live.some((s) => s.key_id === `tok_${i}`)) ?? "";
    expect((await sa.get(mine))?.principal_id).toBe("alice");
    await sb.close(mine);
    expect(await sa.get(mine)).toBeNull();
    now += 8 * 60 * 60 * 1000;
    expect((await Promise.all(ids.map((id) => sa.get(id)))).filter((s) => s !== null)).toEqual([]);
  });
});
