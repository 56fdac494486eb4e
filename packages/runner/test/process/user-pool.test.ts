/**
 * The run_as pool's leases (process/user-pool.ts) without real users: one user per
 * live run across agents, refusal when none is free, and quarantine of a
 * user whose processes survive the sweep (which real processes cannot be
 * made to do on demand, so that sweep is handed in).
 */

import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { describe, expect, test } from "vitest";
import type { AgentConfig } from "../../src/config/config.js";
import type { RunAs } from "../../src/config/run-as.js";
import { PoolHomeError } from "../../src/process/pool-homes.js";
import { BINDINGS_FILE, BindingsFileError, FilePoolBindings, NO_TENANT } from "../../src/process/user-bindings.js";
import { UserPool } from "../../src/process/user-pool.js";

const DAY_MS = 24 * 60 * 60 * 1000;

/** Tenant tags as the Server derives them (tn_ + 26 base32). */
const T1 = "tn_aaaaaaaaaaaaaaaaaaaaaaaaaa";
const T2 = "tn_bbbbbbbbbbbbbbbbbbbbbbbbbb";

/** Uids far above any a test host hands out: the start-up sweep finds nothing of them. */
const user = (n: number): RunAs => ({
  user: `wc-pool-${n}`,
  uid: 3_999_000 + n,
  gid: 3_999_000 + n,
  group: null,
  home: `/nonexistent/wc-pool-${n}`,
  setpriv: "/usr/bin/setpriv",
  clearBoundingSet: true,
  sandbox: null,
});
const agent = (...users: RunAs[]) => ({ runAs: { users } }) as unknown as AgentConfig;

function captureLogs() {
  const lines: Record<string, unknown>[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => lines.push(JSON.parse(line)) });
  return { logger, lines };
}

describe("UserPool", () => {
  test("each live run holds a user of its own, across agents sharing users; none free: refused", async () => {
    const [u1, u2] = [user(1), user(2)];
    const pooled = agent(u1, u2);
    const single = agent(u1);
    const pool = new UserPool([pooled, single]);
    await pool.ready;
    expect(pool.acquire({ runAs: null }, T1)).toEqual({ ok: true, user: null });
    expect(pool.acquire(single, T1)).toEqual({ ok: true, user: u1 });
    expect(pool.acquire(pooled, T1)).toEqual({ ok: true, user: u2 });
    expect(pool.acquire(pooled, T1)).toEqual({ ok: false, reason: "pool_busy" });
    await pool.release(u1, "wc_agent_run_a");
    expect(pool.state(u1.uid)).toBe("free");
    expect(pool.acquire(pooled, T1)).toEqual({ ok: true, user: u1 });
  });

  test("a user whose processes survive the sweep serves no more runs, logged with the user and counts only", async () => {
    const { logger, lines } = captureLogs();
    const u1 = user(1);
    const pool = new UserPool([agent(u1)], { logger, sweep: async () => ({ killed: 3, survivors: 1 }) });
    await pool.ready;
    expect(pool.acquire(agent(u1), T1)).toEqual({ ok: true, user: u1 });
    await pool.release(u1, "wc_agent_run_q");
    expect(pool.state(u1.uid)).toBe("quarantined");
    expect(pool.acquire(agent(u1), T1)).toEqual({ ok: false, reason: "pool_busy" });
    const error = lines.find((l) => l.level === 50);
    expect(error).toMatchObject({ run_id: "wc_agent_run_q", user: u1.user, uid: u1.uid, killed: 3, survivors: 1 });
    expect(Object.keys(error ?? {}).sort()).toEqual(
      ["hostname", "killed", "level", "msg", "pid", "run_id", "survivors", "time", "uid", "user"].sort(),
    );
  });

  test("a sweep that throws quarantines the user and still lets the run settle", async () => {
    const { logger, lines } = captureLogs();
    const u1 = user(1);
    const pool = new UserPool([agent(u1)], {
      logger,
      sweep: async () => {
        throw new Error("EMFILE");
      },
    });
    expect(pool.acquire(agent(u1), T1)).toEqual({ ok: true, user: u1 });
    await pool.release(u1, "wc_agent_run_t");
    expect(pool.state(u1.uid)).toBe("quarantined");
    expect(lines.find((l) => l.level === 50)).toMatchObject({ run_id: "wc_agent_run_t", err_name: "Error" });
  });

  describe("bound to one caller (design §4.2)", () => {
    let dir = "";
    const fresh = () => {
      dir = mkdtempSync(join(tmpdir(), "wc-bindings-"));
      return new FilePoolBindings(dir);
    };
    const cleanup = () => rmSync(dir, { recursive: true, force: true });

    test("a user that served one caller never serves another, even when it is the only free one; that survives a restart", async () => {
      const [u1, u2] = [user(1), user(2)];
      const pooled = agent(u1, u2);
      try {
        const pool = new UserPool([pooled], { bindings: fresh() });
        expect(pool.acquire(pooled, T1)).toEqual({ ok: true, user: u1 });
        await pool.release(u1, "wc_agent_run_1");
        // u1 is free but bound to T1: T2 gets the unbound u2.
        expect(pool.acquire(pooled, T2)).toEqual({ ok: true, user: u2 });
        await pool.release(u2, "wc_agent_run_2");
        // Both free, each bound: each caller gets its own, again and again.
        expect(pool.acquire(pooled, T2)).toEqual({ ok: true, user: u2 });
        expect(pool.acquire(pooled, T1)).toEqual({ ok: true, user: u1 });
        await pool.release(u1, "wc_agent_run_3");
        await pool.release(u2, "wc_agent_run_4");
        // A third caller: users are free, but none is its to take.
        const T3 = "tn_cccccccccccccccccccccccccc";
        expect(pool.acquire(pooled, T3)).toEqual({ ok: false, reason: "pool_bound" });
        // An untagged start is a tenant of its own.
        expect(pool.acquire(pooled, undefined)).toEqual({ ok: false, reason: "pool_bound" });

        // After a restart (a new pool reading the same file) the bindings hold.
        const again = new UserPool([pooled], { bindings: new FilePoolBindings(dir) });
        expect(again.acquire(pooled, T2)).toEqual({ ok: true, user: u2 });
        expect(again.acquire(pooled, T1)).toEqual({ ok: true, user: u1 });
        const file = join(dir, BINDINGS_FILE);
        expect(statSync(file).mode & 0o777).toBe(0o600);
        const kept = JSON.parse(readFileSync(file, "utf8")) as { bindings: { uid: number; tenant: string }[] };
        expect(kept.bindings.map((b) => [b.uid, b.tenant])).toEqual([
          [u1.uid, T1],
          [u2.uid, T2],
        ]);
      } finally {
        cleanup();
      }
    });

    test("caller_limit for the caller whose own user is serving a live run, pool_busy for another", async () => {
      const u1 = user(1);
      try {
        const pool = new UserPool([agent(u1)], { bindings: fresh() });
        expect(pool.acquire(agent(u1), T1)).toEqual({ ok: true, user: u1 });
        expect(pool.acquire(agent(u1), T1)).toEqual({ ok: false, reason: "caller_limit" });
        expect(pool.acquire(agent(u1), T2)).toEqual({ ok: false, reason: "pool_busy" });
      } finally {
        cleanup();
      }
    });

    test("a user is recycled for another caller only once its caller has left it unused for binding_idle_days (clock injected)", async () => {
      const [u1, u2] = [user(1), user(2)];
      const pooled = agent(u1, u2);
      const T3 = "tn_cccccccccccccccccccccccccc";
      let clock = Date.parse("2026-01-01T00:00:00Z");
      const recycled: number[] = [];
      const sweep = async () => ({ killed: 0, survivors: 0 });
      try {
        const pool = new UserPool([pooled], {
          bindings: fresh(),
          now: () => new Date(clock),
          sweep,
          bindingIdleDays: 30,
          recycleHome: async (u) => {
            recycled.push(u.uid);
            return { removed: 0, copied: 0 };
          },
        });
        expect(pool.acquire(pooled, T1)).toEqual({ ok: true, user: u1 });
        expect(pool.acquire(pooled, T2)).toEqual({ ok: true, user: u2 });
        await pool.release(u1, "wc_agent_run_1");
        await pool.release(u2, "wc_agent_run_2");
        clock += 29 * DAY_MS;
        expect(pool.acquire(pooled, T3)).toEqual({ ok: false, reason: "pool_bound" });
        // T1 uses its user again on day 31: that use counts, so only T2's user is idle.
        clock += 2 * DAY_MS;
        expect(pool.acquire(pooled, T1)).toEqual({ ok: true, user: u1 });
        await pool.release(u1, "wc_agent_run_3");
        const lease = pool.acquire(pooled, T3);
        expect(lease).toMatchObject({ ok: false, reason: "recycling" });
        expect(pool.state(u2.uid)).toBe("recycling");
        // While it is being recycled it counts as T3's: a second start of T3 is at its limit.
        expect(pool.acquire(pooled, T3)).toEqual({ ok: false, reason: "caller_limit" });
        if (!lease.ok && lease.reason === "recycling") await lease.ready;
        expect(recycled).toEqual([u2.uid]);
        expect(pool.acquire(pooled, T3)).toEqual({ ok: true, user: u2 });
        expect(new FilePoolBindings(dir).load().get(u2.uid)?.tenant).toBe(T3);
        // T2 lost its user; u1 is free but T1's and used today: refused, and retrying soon will not help.
        expect(pool.acquire(pooled, T2)).toEqual({ ok: false, reason: "pool_bound" });
      } finally {
        cleanup();
      }
    });

    test("a recycle that fails quarantines the user and keeps its old binding", async () => {
      const u1 = user(1);
      const { logger, lines } = captureLogs();
      let clock = Date.parse("2026-01-01T00:00:00Z");
      try {
        const pool = new UserPool([agent(u1)], {
          bindings: fresh(),
          logger,
          now: () => new Date(clock),
          sweep: async () => ({ killed: 0, survivors: 0 }),
          recycleHome: async () => {
            throw new PoolHomeError("holds a mount point");
          },
        });
        expect(pool.acquire(agent(u1), T1)).toEqual({ ok: true, user: u1 });
        await pool.release(u1, "wc_agent_run_1");
        clock += 31 * DAY_MS;
        const lease = pool.acquire(agent(u1), T2);
        if (lease.ok || lease.reason !== "recycling")
          throw new Error(`expected recycling, got ${JSON.stringify(lease)}`);
        await lease.ready;
        expect(pool.state(u1.uid)).toBe("quarantined");
        expect(new FilePoolBindings(dir).load().get(u1.uid)?.tenant).toBe(T1);
        expect(lines.find((l) => l.level === 50)).toMatchObject({ user: u1.user, reason: "holds a mount point" });
      } finally {
        cleanup();
      }
    });

    test("a binding that cannot be written starts nothing and leaves the user free and unbound", async () => {
      const u1 = user(1);
      const failing = {
        load: () => new Map(),
        bind: () => {
          throw new Error("EROFS");
        },
      };
      const pool = new UserPool([agent(u1)], { bindings: failing });
      expect(pool.acquire(agent(u1), T1)).toEqual({ ok: false, reason: "unrecorded" });
      expect(pool.state(u1.uid)).toBe("free");
    });

    test("without bindings (single_tenant) any free user serves any caller", async () => {
      const u1 = user(1);
      const pool = new UserPool([agent(u1)], { bindings: null });
      expect(pool.acquire(agent(u1), T1)).toEqual({ ok: true, user: u1 });
      await pool.release(u1, "wc_agent_run_s");
      expect(pool.acquire(agent(u1), T2)).toEqual({ ok: true, user: u1 });
    });

    test("a malformed bindings file is refused with the file and the field, never read as 'nobody is bound'", () => {
      try {
        const bindings = fresh();
        const file = join(dir, BINDINGS_FILE);
        writeFileSync(
          file,
          JSON.stringify({
            version: 1,
            bindings: [{ uid: 5, user: "x", tenant: "nope", bound_at: "2026-01-01T00:00:00Z" }],
          }),
        );
        expect(() => new UserPool([agent(user(1))], { bindings })).toThrow(BindingsFileError);
        expect(() => new FilePoolBindings(dir).load()).toThrow(/bindings\.0\.tenant/);
        writeFileSync(file, "{");
        expect(() => new FilePoolBindings(dir).load()).toThrow(/not JSON/);
        // release() forgets a binding; the user is then unbound again.
        writeFileSync(
          file,
          JSON.stringify({
            version: 1,
            bindings: [{ uid: 5, user: "x", tenant: NO_TENANT, bound_at: "2026-01-01T00:00:00Z" }],
          }),
        );
        const ok = new FilePoolBindings(dir);
        expect(ok.release(5)).toBe(true);
        expect(ok.release(5)).toBe(false);
        expect(new FilePoolBindings(dir).load().size).toBe(0);
      } finally {
        cleanup();
      }
    });
  });
});
