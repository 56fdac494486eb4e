/**
 * Retention of Workflow Sessions: a session untouched for `[server] session_max_idle_secs` (not updated,
 * no evidence since) with no run in flight is deleted with its evidence and run links; busy or recent
 * ones stay. Real SQLite file through the Server's StateStore (migrated schema), injected clock.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { buildServerConfig } from "../src/config.js";
import type { Principal } from "../src/runs/api.js";
import { SESSION_PRUNE_INTERVAL_MS, SessionService } from "../src/sessions/service.js";
import { DEFAULT_SESSION_MAX_IDLE_SECS, MAX_SESSIONS_PER_PRINCIPAL, SessionStore } from "../src/sessions/store.js";
import { StateStore } from "../src/state/store.js";

const dirs: string[] = [];
const stores: StateStore[] = [];
afterEach(() => {
  for (const s of stores.splice(0)) s.close();
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const DAY = 24 * 3600 * 1000;

function open() {
  const dir = mkdtempSync(join(tmpdir(), "wc-sess-ret-"));
  dirs.push(dir);
  const state = new StateStore(dir);
  stores.push(state);
  let now = Date.parse("2026-01-01T00:00:00Z");
  const sessions = new SessionStore(state.db, () => new Date(now));
  return { state, sessions, advance: (ms: number) => (now += ms) };
}

function count(state: StateStore, table: string, sessionId: string): number {
  return (state.db.prepare(`SELECT COUNT(*) AS n FROM ${table} WHERE session_id = ?`).get(sessionId) as { n: number })
    .n;
}

function evidence(sessions: SessionStore, sessionId: string, runId: string) {
  sessions.appendEvidence({
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
  it("deletes idle sessions with their evidence and links; keeps updated, recently recorded and in-flight ones", () => {
    const { state, sessions, advance } = open();
    const mk = (id: string) =>
      sessions.insertSession({ session_id: id, principal_id: "alice", project_id: "demo", title: id });
    mk("idle");
    mk("updated");
    mk("recorded");
    mk("inflight");
    evidence(sessions, "idle", "wc_agent_run_idle");
    sessions.linkRun("wc_agent_run_idle", "idle");
    sessions.markTerminal("wc_agent_run_idle");
    sessions.linkRun("wc_agent_run_busy", "inflight"); // no terminal entry yet: a run in flight
    advance(10 * DAY);
    sessions.updateTexts("updated", { goal: "still used" });
    evidence(sessions, "recorded", "wc_agent_run_recent");
    advance(1 * DAY);

    expect(sessions.pruneIdle(5 * DAY)).toBe(1);
    expect(sessions.session("idle")).toBeUndefined();
    expect(count(state, "workflow_session_evidence", "idle")).toBe(0);
    expect(count(state, "workflow_session_runs", "idle")).toBe(0);
    for (const kept of ["updated", "recorded", "inflight"]) expect(sessions.session(kept)).toBeDefined();
    expect(sessions.pruneIdle(5 * DAY)).toBe(0);

    // Once the in-flight run has its terminal entry, that session is idle too.
    sessions.markTerminal("wc_agent_run_busy");
    expect(sessions.pruneIdle(5 * DAY)).toBe(1);
    expect(sessions.session("inflight")).toBeUndefined();
  });

  it("the Server's session service prunes at start with the configured age", () => {
    const { state, sessions, advance } = open();
    sessions.insertSession({ session_id: "old", principal_id: "alice", project_id: "demo", title: "t" });
    advance(2 * DAY);
    new SessionService(sessions, state, pino({ level: "silent" }), 3 * 24 * 3600);
    expect(sessions.session("old")).toBeDefined();
    new SessionService(sessions, state, pino({ level: "silent" }), 24 * 3600);
    expect(sessions.session("old")).toBeUndefined();
  });

  it("a create prunes at most once per interval, and always before refusing a principal at its cap", () => {
    const { state, sessions, advance } = open();
    const alice: Principal = { id: "alice", scopes: new Set(["runtime:write"]), projects: new Set(["demo"]) };
    const service = new SessionService(sessions, state, pino({ level: "silent" }), 24 * 3600);
    const prunes = vi.spyOn(sessions, "pruneIdle");
    const create = () => service.create(alice, { project_id: "demo", title: "t" });

    sessions.insertSession({ session_id: "old", principal_id: "alice", project_id: "demo", title: "t" });
    for (let i = 0; i < 3; i++) expect(create().ok).toBe(true);
    expect(prunes).not.toHaveBeenCalled(); // the constructor's prune was less than an interval ago

    advance(DAY - 1000);
    expect(create().ok).toBe(true);
    expect(prunes).toHaveBeenCalledTimes(1);
    expect(sessions.session("old")).toBeDefined(); // not idle for a day yet

    sessions.atomically(() => {
      for (let i = sessions.countSessions("alice"); i < MAX_SESSIONS_PER_PRINCIPAL; i++) {
        sessions.insertSession({ session_id: `fill-${i}`, principal_id: "alice", project_id: "demo", title: "t" });
      }
    });
    advance(2000); // "old" is idle now; the interval has not passed
    expect(SESSION_PRUNE_INTERVAL_MS).toBeGreaterThan(2000);
    expect(create().ok).toBe(true);
    expect(prunes).toHaveBeenCalledTimes(2);
    // "old" and the three created with it went; the one created a day later stays.
    expect(sessions.session("old")).toBeUndefined();
    expect(sessions.countSessions("alice")).toBe(MAX_SESSIONS_PER_PRINCIPAL - 3);
  });

  it("prepares its statements once, when it is made, not on each call", () => {
    const { state, sessions, advance } = open();
    sessions.atomically(() => undefined); // the driver prepares BEGIN/COMMIT once per database
    const prepare = vi.spyOn(state.db, "prepare");
    sessions.insertSession({ session_id: "s", principal_id: "alice", project_id: "demo", title: "t" });
    sessions.updateTexts("s", { handoff: "h", goal: "g" });
    evidence(sessions, "s", "wc_agent_run_a");
    sessions.linkRun("wc_agent_run_a", "s");
    sessions.resetTerminal("wc_agent_run_a");
    expect(sessions.recorderOf("wc_agent_run_a")?.session_id).toBe("s");
    expect(sessions.openRecordedRuns(10)).toEqual(["wc_agent_run_a"]);
    expect(sessions.markTerminal("wc_agent_run_a")).toBe(true);
    expect(sessions.evidenceAfter("s", 0, 10)).toHaveLength(1);
    expect(sessions.countSessions("alice")).toBe(1);
    advance(DAY);
    expect(sessions.pruneIdle(1000)).toBe(1);
    expect(sessions.session("s")).toBeUndefined();
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
