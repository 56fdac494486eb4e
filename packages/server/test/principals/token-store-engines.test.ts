/**
 * Principal tokens remembered between requests (principals/tokens.ts) stay revocable: a revocation through
 * another Server instance applies on this one as soon as it can know of it — at once on SQLite (one
 * connection), when its notice arrives on PostgreSQL (moments after the commit, well within half of
 * TOKEN_CACHE_TTL_MS) — and on PostgreSQL a revocation whose notice never came (a row changed without
 * `revoke`) applies within TOKEN_CACHE_TTL_MS. The revocation by another process on SQLite is in tokens.test.ts.
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { poll } from "../../../../scripts/test-support/index.js";
import { principalLookup, TOKEN_CACHE_TTL_MS, TokenStore } from "../../src/principals/tokens.js";
import { ENGINE_NAMES, type EngineName, engineFixture } from "../support/engines.js";

const fixture = engineFixture();
const principals = [{ id: "alice", scopes: ["coding_agent:run", "project:read"] as const, projects: ["demo"] }];
const lookup = principalLookup(principals.map((p) => ({ ...p, scopes: [...p.scopes] })));

/** Verifications in a row on the remembering instance before anything is revoked. */
const WARM_VERIFICATIONS = 5;
/** Bound on a revocation's notice reaching the other instance (milliseconds on loopback when quiet). */
const NOTICE_WAIT_MS = 10_000;

afterEach(() => {
  vi.useRealTimers();
});

/** Stop the wall clock the stores read (Date only; timers and I/O run): what is remembered never runs out by itself. */
function freezeClock(): number {
  vi.useFakeTimers({ toFake: ["Date"] });
  return Date.now();
}

async function twoInstances(name: EngineName) {
  const [a, b] = await fixture.instances(name, 2);
  if (a === undefined || b === undefined) throw new Error("two instances expected");
  const onA = new TokenStore(a);
  await onA.followRevocations();
  const onB = new TokenStore(b);
  const issued = await onB.issue(
    { principal_id: "alice", scopes: ["project:read"], projects: ["demo"], allowCodingAgentRun: false },
    lookup,
  );
  for (let i = 0; i < WARM_VERIFICATIONS; i++) expect((await onA.verify(issued.token, lookup))?.id).toBe("alice");
  return { a, b, onA, onB, issued };
}

describe.each(ENGINE_NAMES)("principal tokens remembered on $name", ({ name }) => {
  it("refuses a token revoked through another instance from the next verification on", async () => {
    // The bound on remembering (TOKEN_CACHE_TTL_MS) cannot run out: on PostgreSQL only the notice can refuse it.
    freezeClock();
    const { onA, onB, issued } = await twoInstances(name);
    try {
      expect(await onB.revoke(issued.token_id)).toBe(true);
      await poll(async () => (await onA.verify(issued.token, lookup)) === null, {
        timeoutMs: NOTICE_WAIT_MS,
        intervalMs: 5,
        what: "the revocation applied on the other instance",
      });
      expect(await onA.identify(issued.token, lookup)).toBeNull();
    } finally {
      onA.close();
    }
  });
});

describe("principal tokens remembered on PostgreSQL", () => {
  const name = "postgres";
  it("refuses a token whose row was revoked without a notice within TOKEN_CACHE_TTL_MS", async () => {
    const readAt = freezeClock();
    const { b, onA, issued } = await twoInstances(name);
    try {
      // The row changes with no notice (as if the notice were lost): only the bound on remembering applies.
      await b.run("UPDATE principal_tokens SET revoked_at = ? WHERE token_id = ?", [
        new Date().toISOString(),
        issued.token_id,
      ]);
      // Every read of the row was at `readAt` (the clock stands still): once the bound has passed, refused.
      vi.setSystemTime(readAt + TOKEN_CACHE_TTL_MS);
      expect(await onA.verify(issued.token, lookup)).toBeNull();
    } finally {
      onA.close();
    }
  });

  it("reads the row on every verification while it does not follow notices", async () => {
    const [a, b] = await fixture.instances(name, 2);
    if (a === undefined || b === undefined) throw new Error("two instances expected");
    const onA = new TokenStore(a);
    const issued = await new TokenStore(b).issue(
      { principal_id: "alice", scopes: ["project:read"], projects: ["demo"], allowCodingAgentRun: false },
      lookup,
    );
    expect((await onA.verify(issued.token, lookup))?.id).toBe("alice");
    await b.run("UPDATE principal_tokens SET revoked_at = ? WHERE token_id = ?", [
      new Date().toISOString(),
      issued.token_id,
    ]);
    expect(await onA.verify(issued.token, lookup)).toBeNull();
  });
});

describe("one read of a token's row for verifications at once, on PostgreSQL", () => {
  const name = "postgres";
  /** Verifications of one token started together, as a client's burst or many observers connecting. */
  const AT_ONCE = 8;

  it("shares the read among verifications that start while it is in flight", async () => {
    const [a, b] = await fixture.instances(name, 2);
    if (a === undefined || b === undefined) throw new Error("two instances expected");
    const onA = new TokenStore(a);
    await onA.followRevocations();
    try {
      const issued = await new TokenStore(b).issue(
        { principal_id: "alice", scopes: ["project:read"], projects: ["demo"], allowCodingAgentRun: false },
        lookup,
      );
      const reads = vi.spyOn(a, "get");
      const all = await Promise.all(Array.from({ length: AT_ONCE }, () => onA.verify(issued.token, lookup)));
      expect(all.map((p) => p?.id)).toEqual(Array(AT_ONCE).fill("alice"));
      expect(reads).toHaveBeenCalledTimes(1);
    } finally {
      onA.close();
    }
  });

  it("never shares a read begun before a revocation with a verification after it", async () => {
    const [a] = await fixture.instances(name, 1);
    if (a === undefined) throw new Error("an instance expected");
    const onA = new TokenStore(a);
    await onA.followRevocations();
    try {
      const issued = await onA.issue(
        { principal_id: "alice", scopes: ["project:read"], projects: ["demo"], allowCodingAgentRun: false },
        lookup,
      );
      // The first read of the row is held in flight until the token has been revoked.
      let release = () => {};
      const held = new Promise<void>((resolve) => {
        release = resolve;
      });
      const get = a.get.bind(a);
      const reads = vi.spyOn(a, "get").mockImplementationOnce(async (sql, params) => {
        await held;
        return await get(sql, params);
      });
      const before = onA.verify(issued.token, lookup);
      await poll(() => reads.mock.calls.length === 1, {
        timeoutMs: 5_000,
        intervalMs: 5,
        what: "the first read begun",
      });
      expect(await onA.revoke(issued.token_id)).toBe(true);
      expect(await onA.verify(issued.token, lookup)).toBeNull();
      expect(reads).toHaveBeenCalledTimes(2);
      release();
      await before;
    } finally {
      onA.close();
    }
  });
});
