/**
 * The run_as pool's leases (process/user-pool.ts) without real users: one user per
 * live run across agents, refusal when none is free, and quarantine of a
 * user whose processes survive the sweep (which real processes cannot be
 * made to do on demand, so that sweep is handed in).
 */
import { pino } from "pino";
import { describe, expect, test } from "vitest";
import type { AgentConfig } from "../src/config/config.js";
import type { RunAs } from "../src/process/run-as.js";
import { UserPool } from "../src/process/user-pool.js";

/** Uids far above any a test host hands out: the start-up sweep finds nothing of them. */
const user = (n: number): RunAs => ({
  user: `wc-pool-${n}`,
  uid: 3_999_000 + n,
  gid: 3_999_000 + n,
  group: null,
  setpriv: "/usr/bin/setpriv",
  clearBoundingSet: true,
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
    expect(pool.acquire({ runAs: null })).toEqual({ ok: true, user: null });
    expect(pool.acquire(single)).toEqual({ ok: true, user: u1 });
    expect(pool.acquire(pooled)).toEqual({ ok: true, user: u2 });
    expect(pool.acquire(pooled)).toEqual({ ok: false });
    await pool.release(u1, "wc_agent_run_a");
    expect(pool.state(u1.uid)).toBe("free");
    expect(pool.acquire(pooled)).toEqual({ ok: true, user: u1 });
  });

  test("a user whose processes survive the sweep serves no more runs, logged with the user and counts only", async () => {
    const { logger, lines } = captureLogs();
    const u1 = user(1);
    const pool = new UserPool([agent(u1)], { logger, sweep: async () => ({ killed: 3, survivors: 1 }) });
    await pool.ready;
    expect(pool.acquire(agent(u1))).toEqual({ ok: true, user: u1 });
    await pool.release(u1, "wc_agent_run_q");
    expect(pool.state(u1.uid)).toBe("quarantined");
    expect(pool.acquire(agent(u1))).toEqual({ ok: false });
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
    expect(pool.acquire(agent(u1))).toEqual({ ok: true, user: u1 });
    await pool.release(u1, "wc_agent_run_t");
    expect(pool.state(u1.uid)).toBe("quarantined");
    expect(lines.find((l) => l.level === 50)).toMatchObject({ run_id: "wc_agent_run_t", err_name: "Error" });
  });
});
