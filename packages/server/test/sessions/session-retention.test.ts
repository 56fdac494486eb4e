/**
 * Retention of Workflow Sessions: a session untouched for `[server] session_max_idle_secs` (not updated,
 * no evidence since) with no run in flight is deleted with its evidence and run links; busy or recent
 * ones stay. The Server's StateStore (migrated schema) on the pass's state engine (support/test-state.ts),
 * injected clock.
 */
import { pino } from "pino";
import { describe, expect, it, vi } from "vitest";
import { buildServerConfig } from "../../src/config.js";
import type { Principal } from "../../src/runs/api.js";
import { SESSION_PRUNE_INTERVAL_MS, SessionService } from "../../src/sessions/service.js";
import { DEFAULT_SESSION_MAX_IDLE_SECS, MAX_SESSIONS_PER_PRINCIPAL, SessionStore } from "../../src/sessions/store.js";
import type { StateStore } from "../../src/state/store.js";
import { openTestState } from "../support/test-state.js";

const DAY = 24 * 3600 * 1000;

/** `sqlite`: on a SQLite file in either pass (see openTestState). */
async function open(options: { sqlite?: boolean } = {}) {
  const { store: state } = await openTestState(options);
  let now = Date.parse("2026-01-01T00:00:00Z");
  const sessions = new SessionStore(state.engine, () => new Date(now));
  return { state, sessions, advance: (ms: number) => (now += ms) };
}

async function count(state: StateStore, table: string, sessionId: string): Promise<number> {
  return (
    (await state.engine.get<{ n: number }>(`SELECT COUNT(*) AS n FROM ${table} WHERE session_id = ?`, [sessionId]))
      ?.n ?? -1
  );
}

async function evidence(sessions: SessionStore, sessionId: string, runId: string) {
  await sessions.appendEvidence({
    session_id: sessionId,
    kind: "coding_agent_started",
    run_id: runId,
    provider_id: "fake",
    state: "starting",
    execution_state: "not_started",
    stop_reason: null,
    failure_kind: null,
  });
}

describe("workflow session retention", () => {
  it("deletes idle sessions with their evidence and links; keeps updated, recently recorded and in-flight ones", async () => {
    const { state, sessions, advance } = await open();
    const mk = (id: string) =>
      sessions.insertSession({ session_id: id, principal_id: "alice", project_id: "demo", title: id });
    await mk("idle");
    await mk("updated");
    await mk("recorded");
    await mk("inflight");
    await evidence(sessions, "idle", "wc_agent_run_idle");
    await sessions.linkRun("wc_agent_run_idle", "idle");
    await sessions.markTerminal("wc_agent_run_idle");
    await sessions.linkRun("wc_agent_run_busy", "inflight"); // no terminal entry yet: a run in flight
    advance(10 * DAY);
    await sessions.updateTexts("updated", { goal: "still used" });
    await evidence(sessions, "recorded", "wc_agent_run_recent");
    advance(1 * DAY);

    expect(await sessions.pruneIdle(5 * DAY)).toBe(1);
    expect(await sessions.session("idle")).toBeUndefined();
    expect(await count(state, "workflow_session_evidence", "idle")).toBe(0);
    expect(await count(state, "workflow_session_runs", "idle")).toBe(0);
    for (const kept of ["updated", "recorded", "inflight"]) expect(await sessions.session(kept)).toBeDefined();
    expect(await sessions.pruneIdle(5 * DAY)).toBe(0);

    // Once the in-flight run has its terminal entry, that session is idle too.
    await sessions.markTerminal("wc_agent_run_busy");
    expect(await sessions.pruneIdle(5 * DAY)).toBe(1);
    expect(await sessions.session("inflight")).toBeUndefined();
  });

  it("the Server's session service prunes at start with the configured age", async () => {
    const { state, sessions, advance } = await open();
    await sessions.insertSession({ session_id: "old", principal_id: "alice", project_id: "demo", title: "t" });
    advance(2 * DAY);
    await new SessionService(sessions, state, pino({ level: "silent" }), 3 * 24 * 3600).start();
    expect(await sessions.session("old")).toBeDefined();
    await new SessionService(sessions, state, pino({ level: "silent" }), 24 * 3600).start();
    expect(await sessions.session("old")).toBeUndefined();
  });

  it("a create prunes at most once per interval, and always before refusing a principal at its cap", async () => {
    const { state, sessions, advance } = await open();
    const alice: Principal = { id: "alice", scopes: new Set(["runtime:write"]), projects: new Set(["demo"]) };
    const service = new SessionService(sessions, state, pino({ level: "silent" }), 24 * 3600);
    await service.start();
    const prunes = vi.spyOn(sessions, "pruneIdle");
    const create = async () => (await service.create(alice, { project_id: "demo", title: "t" })).ok;

    await sessions.insertSession({ session_id: "old", principal_id: "alice", project_id: "demo", title: "t" });
    for (let i = 0; i < 3; i++) expect(await create()).toBe(true);
    expect(prunes).not.toHaveBeenCalled(); // the start's prune was less than an interval ago

    advance(DAY - 1000);
    expect(await create()).toBe(true);
    expect(prunes).toHaveBeenCalledTimes(1);
    expect(await sessions.session("old")).toBeDefined(); // not idle for a day yet

    await sessions.transaction(async (tx) => {
      for (let i = await sessions.countSessions("alice", tx); i < MAX_SESSIONS_PER_PRINCIPAL; i++) {
        await sessions.insertSession(
          { session_id: `fill-${i}`, principal_id: "alice", project_id: "demo", title: "t" },
          tx,
        );
      }
    });
    advance(2000); // "old" is idle now; the interval has not passed
    expect(SESSION_PRUNE_INTERVAL_MS).toBeGreaterThan(2000);
    expect(await create()).toBe(true);
    expect(prunes).toHaveBeenCalledTimes(2);
    // "old" and the three created with it went; the one created a day later stays.
    expect(await sessions.session("old")).toBeUndefined();
    expect(await sessions.countSessions("alice")).toBe(MAX_SESSIONS_PER_PRINCIPAL - 3);
  });

  // SQLite only: its engine keeps prepared statements per connection; PostgreSQL's sends each statement as is.
  it("prepares each statement once per connection, not on each call", async () => {
    const { state, sessions, advance } = await open({ sqlite: true });
    const everything = async (id: string, run: string) => {
      await sessions.insertSession({ session_id: id, principal_id: "alice", project_id: "demo", title: "t" });
      await sessions.updateTexts(id, { handoff: "h", goal: "g" });
      await evidence(sessions, id, run);
      await sessions.linkRun(run, id);
      await sessions.resetTerminal(run);
      expect((await sessions.recorderOf(run))?.session_id).toBe(id);
      expect(await sessions.openRecordedRuns(10)).toEqual([run]);
      expect(await sessions.markTerminal(run)).toBe(true);
      expect(await sessions.evidenceAfter(id, 0, 10)).toHaveLength(1);
      expect(await sessions.countSessions("alice")).toBe(1);
      advance(DAY);
      expect(await sessions.pruneIdle(1000)).toBe(1);
      expect(await sessions.session(id)).toBeUndefined();
    };
    await everything("s1", "wc_agent_run_a");
    const prepare = vi.spyOn(state.sqlite, "prepare");
    await everything("s2", "wc_agent_run_b");
    expect(prepare).not.toHaveBeenCalled();
  });

  it("[server] session_max_idle_secs defaults to 90 days and is bounded", () => {
    expect(DEFAULT_SESSION_MAX_IDLE_SECS).toBe(90 * 24 * 3600);
    const config = (server: Record<string, unknown>) =>
      buildServerConfig(
        {
          server: { port: 0, state_dir: "s", ...server },
          runners: [{ id: "r1", token_sha256: "0".repeat(64), projects: ["demo"] }],
        },
        { file: null, baseDir: "/" },
      );
    expect(config({}).sessionMaxIdleSecs).toBe(DEFAULT_SESSION_MAX_IDLE_SECS);
    expect(config({ session_max_idle_secs: 3600 }).sessionMaxIdleSecs).toBe(3600);
    expect(() => config({ session_max_idle_secs: 1 })).toThrow(/session_max_idle_secs/);
  });
});
