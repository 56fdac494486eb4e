/**
 * Durable state of Workflow Sessions (design §11) in the Server's state DB
 * (tables from schema migration 5): sessions, their bounded lifecycle
 * evidence, and which session records which run. Plain rows; the rules live
 * in sessions/service.ts. Evidence rows have no column that could hold a
 * prompt, a message, reasoning, a tool body or an ACP session id.
 */
import type BetterSqlite3 from "better-sqlite3";

/** Evidence entries kept per session; older ones are dropped and counted. */
export const MAX_EVIDENCE_PER_SESSION = 256;
/** Default of `[server] session_max_idle_secs`: a session untouched this long, with no run in flight, is deleted. */
export const DEFAULT_SESSION_MAX_IDLE_SECS = 90 * 24 * 3600;
/** Sessions one prune deletes at most (the next prune continues). */
export const SESSION_PRUNE_BATCH = 1000;
/** Sessions one principal may own. */
export const MAX_SESSIONS_PER_PRINCIPAL = 1000;

export const EVIDENCE_KINDS = [
  "coding_agent_started",
  "coding_agent_waiting_permission",
  "coding_agent_terminal",
] as const;
export type EvidenceKind = (typeof EVIDENCE_KINDS)[number];

export interface SessionRow {
  session_id: string;
  principal_id: string;
  project_id: string;
  title: string;
  handoff: string;
  handoff_version: number;
  goal: string;
  goal_version: number;
  version: number;
  evidence_last_seq: number;
  evidence_dropped: number;
  created_at: string;
  updated_at: string;
}

export interface EvidenceRow {
  session_id: string;
  seq: number;
  at: string;
  kind: EvidenceKind;
  run_id: string;
  provider_id: string;
  state: string;
  execution_state: string;
  stop_reason: string | null;
  failure_kind: string | null;
}

/** The store's statements, prepared once per database. */
function prepareStatements(db: BetterSqlite3.Database) {
  return {
    session: db.prepare<[string], SessionRow>("SELECT * FROM workflow_sessions WHERE session_id = ?"),
    countSessions: db.prepare<[string], { n: number }>(
      "SELECT COUNT(*) AS n FROM workflow_sessions WHERE principal_id = ?",
    ),
    insertSession: db.prepare<[SessionRow]>(
      `INSERT INTO workflow_sessions (session_id, principal_id, project_id, title, handoff, handoff_version, goal,
         goal_version, version, evidence_last_seq, evidence_dropped, created_at, updated_at)
       VALUES (@session_id, @principal_id, @project_id, @title, @handoff, @handoff_version, @goal, @goal_version,
         @version, @evidence_last_seq, @evidence_dropped, @created_at, @updated_at)`,
    ),
    setHandoff: db.prepare<[string, string]>(
      "UPDATE workflow_sessions SET handoff = ?, handoff_version = handoff_version + 1 WHERE session_id = ?",
    ),
    setGoal: db.prepare<[string, string]>(
      "UPDATE workflow_sessions SET goal = ?, goal_version = goal_version + 1 WHERE session_id = ?",
    ),
    bumpVersion: db.prepare<[string, string]>(
      "UPDATE workflow_sessions SET version = version + 1, updated_at = ? WHERE session_id = ?",
    ),
    insertEvidence: db.prepare<[EvidenceRow]>(
      `INSERT INTO workflow_session_evidence (session_id, seq, at, kind, run_id, provider_id, state, execution_state,
         stop_reason, failure_kind)
       VALUES (@session_id, @seq, @at, @kind, @run_id, @provider_id, @state, @execution_state, @stop_reason,
         @failure_kind)`,
    ),
    dropEvidenceUpTo: db.prepare<[string, number]>(
      "DELETE FROM workflow_session_evidence WHERE session_id = ? AND seq <= ?",
    ),
    countEvidence: db.prepare<[number, number, string]>(
      "UPDATE workflow_sessions SET evidence_last_seq = ?, evidence_dropped = evidence_dropped + ? WHERE session_id = ?",
    ),
    evidenceAfter: db.prepare<[string, number, number], EvidenceRow>(
      "SELECT * FROM workflow_session_evidence WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
    ),
    recorderOf: db.prepare<[string], { session_id: string; terminal_recorded: number }>(
      "SELECT session_id, terminal_recorded FROM workflow_session_runs WHERE run_id = ?",
    ),
    linkRun: db.prepare<[string, string, string]>(
      "INSERT INTO workflow_session_runs (run_id, session_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
    ),
    resetTerminal: db.prepare<[string]>("UPDATE workflow_session_runs SET terminal_recorded = 0 WHERE run_id = ?"),
    openRecordedRuns: db.prepare<[number], { run_id: string }>(
      "SELECT run_id FROM workflow_session_runs WHERE terminal_recorded = 0 ORDER BY created_at LIMIT ?",
    ),
    idleSessions: db.prepare<[string, string, number], { session_id: string }>(
      `SELECT s.session_id FROM workflow_sessions s
       WHERE s.updated_at < ?
         AND NOT EXISTS (SELECT 1 FROM workflow_session_evidence e WHERE e.session_id = s.session_id AND e.at >= ?)
         AND NOT EXISTS (SELECT 1 FROM workflow_session_runs r
                         WHERE r.session_id = s.session_id AND r.terminal_recorded = 0)
       ORDER BY s.updated_at LIMIT ?`,
    ),
    deleteEvidence: db.prepare<[string]>("DELETE FROM workflow_session_evidence WHERE session_id = ?"),
    deleteRuns: db.prepare<[string]>("DELETE FROM workflow_session_runs WHERE session_id = ?"),
    deleteSession: db.prepare<[string]>("DELETE FROM workflow_sessions WHERE session_id = ?"),
    markTerminal: db.prepare<[string]>(
      "UPDATE workflow_session_runs SET terminal_recorded = 1 WHERE run_id = ? AND terminal_recorded = 0",
    ),
  };
}

export class SessionStore {
  readonly #db: BetterSqlite3.Database;
  readonly #now: () => Date;
  readonly #q: ReturnType<typeof prepareStatements>;

  /** `db` must already carry the session tables (state/schema.ts migrations). */
  constructor(db: BetterSqlite3.Database, now: () => Date = () => new Date()) {
    this.#db = db;
    this.#now = now;
    this.#q = prepareStatements(db);
  }

  /** The clock of this store's timestamps (and of idle ages). */
  now(): Date {
    return this.#now();
  }

  atomically<T>(fn: () => T): T {
    return this.#db.transaction(fn)();
  }

  session(sessionId: string): SessionRow | undefined {
    return this.#q.session.get(sessionId);
  }

  countSessions(principalId: string): number {
    return this.#q.countSessions.get(principalId)?.n ?? 0;
  }

  insertSession(row: Pick<SessionRow, "session_id" | "principal_id" | "project_id" | "title">): SessionRow {
    const now = this.#now().toISOString();
    const full: SessionRow = {
      ...row,
      handoff: "",
      handoff_version: 0,
      goal: "",
      goal_version: 0,
      version: 1,
      evidence_last_seq: 0,
      evidence_dropped: 0,
      created_at: now,
      updated_at: now,
    };
    this.#q.insertSession.run(full);
    return full;
  }

  /** Replace handoff and/or goal; each changed text bumps its own version, any change bumps `version`. */
  updateTexts(sessionId: string, patch: { handoff?: string; goal?: string }): void {
    const now = this.#now().toISOString();
    if (patch.handoff !== undefined) this.#q.setHandoff.run(patch.handoff, sessionId);
    if (patch.goal !== undefined) this.#q.setGoal.run(patch.goal, sessionId);
    this.#q.bumpVersion.run(now, sessionId);
  }

  /** Append one entry; past MAX_EVIDENCE_PER_SESSION the oldest goes and is counted. */
  appendEvidence(entry: Omit<EvidenceRow, "seq" | "at">): void {
    const at = this.#now().toISOString();
    this.atomically(() => {
      const s = this.session(entry.session_id);
      if (!s) return;
      const seq = s.evidence_last_seq + 1;
      this.#q.insertEvidence.run({ ...entry, seq, at });
      const dropped = this.#q.dropEvidenceUpTo.run(entry.session_id, seq - MAX_EVIDENCE_PER_SESSION).changes;
      this.#q.countEvidence.run(seq, dropped, entry.session_id);
    });
  }

  evidenceAfter(sessionId: string, after: number, limit: number): EvidenceRow[] {
    return this.#q.evidenceAfter.all(sessionId, after, limit);
  }

  /** The session recording a run, and whether its terminal entry is written. */
  recorderOf(runId: string): { session_id: string; terminal_recorded: number } | undefined {
    return this.#q.recorderOf.get(runId);
  }

  /** Link a run to its recorder; false when it already was (a replay). */
  linkRun(runId: string, sessionId: string): boolean {
    return this.#q.linkRun.run(runId, sessionId, this.#now().toISOString()).changes === 1;
  }

  /** A re-admitted run (after a pre-admission rejection) gets its own terminal entry again. */
  resetTerminal(runId: string): void {
    this.#q.resetTerminal.run(runId);
  }

  /** Recorded runs whose terminal entry is not written yet, oldest first (bounded). */
  openRecordedRuns(limit: number): string[] {
    return this.#q.openRecordedRuns.all(limit).map((r) => r.run_id);
  }

  /**
   * Delete sessions idle for `maxIdleMs` — not updated and no evidence since — that record no run still
   * in flight (every linked run has its terminal entry), with their evidence and run links; at most
   * SESSION_PRUNE_BATCH per call. Returns how many.
   */
  pruneIdle(maxIdleMs: number, limit = SESSION_PRUNE_BATCH): number {
    const cutoff = new Date(this.#now().getTime() - maxIdleMs).toISOString();
    return this.atomically(() => {
      const idle = this.#q.idleSessions.all(cutoff, cutoff, limit);
      for (const { session_id } of idle) {
        this.#q.deleteEvidence.run(session_id);
        this.#q.deleteRuns.run(session_id);
        this.#q.deleteSession.run(session_id);
      }
      return idle.length;
    });
  }

  /** Mark the terminal entry written; false when it already was. */
  markTerminal(runId: string): boolean {
    return this.#q.markTerminal.run(runId).changes === 1;
  }
}
