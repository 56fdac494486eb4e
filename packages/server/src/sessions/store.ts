/**
 * Durable state of Workflow Sessions (design §11) in the Server's state DB
 * (tables from schema migration 5): sessions, their bounded lifecycle
 * evidence, and which session records which run. Plain rows; the rules live
 * in sessions/service.ts. Evidence rows have no column that could hold a
 * prompt, a message, reasoning, a tool body or an ACP session id.
 *
 * Every method runs on the engine, or — given `q`, a transaction's handle — inside that transaction
 * (state/engine.ts). Evidence is appended in a transaction that locks the session row (SELECT … FOR
 * UPDATE), so appends from any number of Server instances get consecutive `seq`s in commit order and the
 * bound is applied by the same transaction.
 */
import type { EvidenceKind } from "@webcodex/protocol";
import type { StateEngine, StateQueries } from "../state/engine.js";

/** Evidence entries kept per session; older ones are dropped and counted. */
export const MAX_EVIDENCE_PER_SESSION = 256;
// The default of `[server] session_max_idle_secs` lives with that config key.
export { DEFAULT_SESSION_MAX_IDLE_SECS } from "../config-file.js";
/** Sessions one prune deletes at most (the next prune continues). */
export const SESSION_PRUNE_BATCH = 1000;
/** Sessions one principal may own. */
export const MAX_SESSIONS_PER_PRINCIPAL = 1000;

// The evidence kinds are the tools' contract (the protocol package's tools/sessions.ts).
export { EVIDENCE_KINDS, type EvidenceKind } from "@webcodex/protocol";

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

const INSERT_SESSION = `INSERT INTO workflow_sessions (session_id, principal_id, project_id, title, handoff,
  handoff_version, goal, goal_version, version, evidence_last_seq, evidence_dropped, created_at, updated_at)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`;
const INSERT_EVIDENCE = `INSERT INTO workflow_session_evidence (session_id, seq, at, kind, run_id, provider_id, state,
  execution_state, stop_reason, failure_kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`;
/** Whether a session is idle at a cutoff: not updated, no evidence since, no recorded run in flight. */
const IDLE = `s.updated_at < ?
  AND NOT EXISTS (SELECT 1 FROM workflow_session_evidence e WHERE e.session_id = s.session_id AND e.at >= ?)
  AND NOT EXISTS (SELECT 1 FROM workflow_session_runs r WHERE r.session_id = s.session_id AND r.terminal_recorded = 0)`;

export class SessionStore {
  readonly engine: StateEngine;
  readonly #now: () => Date;

  /** `engine` must already carry the session tables (state/schema.ts migrations). */
  constructor(engine: StateEngine, now: () => Date = () => new Date()) {
    this.engine = engine;
    this.#now = now;
  }

  /** The clock of this store's timestamps (and of idle ages). */
  now(): Date {
    return this.#now();
  }

  /** Run `fn` in one engine transaction (state/engine.ts: commit when it resolves, roll back when it throws). */
  transaction<T>(fn: (tx: StateQueries) => Promise<T>, options?: { lock?: string }): Promise<T> {
    return this.engine.transaction(fn, options);
  }

  async session(sessionId: string, q: StateQueries = this.engine): Promise<SessionRow | undefined> {
    return await q.get<SessionRow>("SELECT * FROM workflow_sessions WHERE session_id = ?", [sessionId]);
  }

  /** The session row, locked until `tx` ends: decisions about the session are read through this. */
  async lockSession(sessionId: string, tx: StateQueries): Promise<SessionRow | undefined> {
    return await tx.get<SessionRow>("SELECT * FROM workflow_sessions WHERE session_id = ? FOR UPDATE", [sessionId]);
  }

  async countSessions(principalId: string, q: StateQueries = this.engine): Promise<number> {
    const row = await q.get<{ n: number }>("SELECT COUNT(*) AS n FROM workflow_sessions WHERE principal_id = ?", [
      principalId,
    ]);
    return Number(row?.n ?? 0);
  }

  async insertSession(
    row: Pick<SessionRow, "session_id" | "principal_id" | "project_id" | "title">,
    q: StateQueries = this.engine,
  ): Promise<SessionRow> {
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
    await q.run(INSERT_SESSION, [
      full.session_id,
      full.principal_id,
      full.project_id,
      full.title,
      full.handoff,
      full.handoff_version,
      full.goal,
      full.goal_version,
      full.version,
      full.evidence_last_seq,
      full.evidence_dropped,
      full.created_at,
      full.updated_at,
    ]);
    return full;
  }

  /**
   * Replace handoff and/or goal; each changed text bumps its own version, any change bumps `version`.
   * In one transaction (`q`'s, when given one, else its own): the texts and versions change together.
   */
  async updateTexts(sessionId: string, patch: { handoff?: string; goal?: string }, q?: StateQueries): Promise<void> {
    if (q === undefined) {
      await this.transaction((tx) => this.updateTexts(sessionId, patch, tx));
      return;
    }
    if (patch.handoff !== undefined) {
      await q.run(
        "UPDATE workflow_sessions SET handoff = ?, handoff_version = handoff_version + 1 WHERE session_id = ?",
        [patch.handoff, sessionId],
      );
    }
    if (patch.goal !== undefined) {
      await q.run("UPDATE workflow_sessions SET goal = ?, goal_version = goal_version + 1 WHERE session_id = ?", [
        patch.goal,
        sessionId,
      ]);
    }
    await q.run("UPDATE workflow_sessions SET version = version + 1, updated_at = ? WHERE session_id = ?", [
      this.#now().toISOString(),
      sessionId,
    ]);
  }

  /**
   * Append one entry; past MAX_EVIDENCE_PER_SESSION the oldest goes and is counted. Atomic by the session
   * row's lock: the next `seq`, the insert, the drop and the counters in one transaction (`q`'s, when
   * given one, else its own).
   */
  async appendEvidence(entry: Omit<EvidenceRow, "seq" | "at">, q?: StateQueries): Promise<void> {
    if (q === undefined) {
      await this.transaction((tx) => this.appendEvidence(entry, tx));
      return;
    }
    const at = this.#now().toISOString();
    const s = await this.lockSession(entry.session_id, q);
    if (!s) return;
    const seq = Number(s.evidence_last_seq) + 1;
    await q.run(INSERT_EVIDENCE, [
      entry.session_id,
      seq,
      at,
      entry.kind,
      entry.run_id,
      entry.provider_id,
      entry.state,
      entry.execution_state,
      entry.stop_reason,
      entry.failure_kind,
    ]);
    const dropped = (
      await q.run("DELETE FROM workflow_session_evidence WHERE session_id = ? AND seq <= ?", [
        entry.session_id,
        seq - MAX_EVIDENCE_PER_SESSION,
      ])
    ).changes;
    await q.run(
      "UPDATE workflow_sessions SET evidence_last_seq = ?, evidence_dropped = evidence_dropped + ? WHERE session_id = ?",
      [seq, dropped, entry.session_id],
    );
  }

  async evidenceAfter(
    sessionId: string,
    after: number,
    limit: number,
    q: StateQueries = this.engine,
  ): Promise<EvidenceRow[]> {
    return await q.all<EvidenceRow>(
      "SELECT * FROM workflow_session_evidence WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
      [sessionId, after, limit],
    );
  }

  /** The session recording a run, and whether its terminal entry is written. */
  async recorderOf(
    runId: string,
    q: StateQueries = this.engine,
  ): Promise<{ session_id: string; terminal_recorded: number } | undefined> {
    return await q.get<{ session_id: string; terminal_recorded: number }>(
      "SELECT session_id, terminal_recorded FROM workflow_session_runs WHERE run_id = ?",
      [runId],
    );
  }

  /** Link a run to its recorder; false when it already was (a replay). */
  async linkRun(runId: string, sessionId: string, q: StateQueries = this.engine): Promise<boolean> {
    const { changes } = await q.run(
      "INSERT INTO workflow_session_runs (run_id, session_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
      [runId, sessionId, this.#now().toISOString()],
    );
    return changes === 1;
  }

  /** A re-admitted run (after a pre-admission rejection) gets its own terminal entry again. */
  async resetTerminal(runId: string, q: StateQueries = this.engine): Promise<void> {
    await q.run("UPDATE workflow_session_runs SET terminal_recorded = 0 WHERE run_id = ?", [runId]);
  }

  /** Recorded runs whose terminal entry is not written yet, oldest first (bounded). */
  async openRecordedRuns(limit: number, q: StateQueries = this.engine): Promise<string[]> {
    const rows = await q.all<{ run_id: string }>(
      "SELECT run_id FROM workflow_session_runs WHERE terminal_recorded = 0 ORDER BY created_at, run_id LIMIT ?",
      [limit],
    );
    return rows.map((r) => r.run_id);
  }

  /**
   * Delete sessions idle for `maxIdleMs` — not updated and no evidence since — that record no run still
   * in flight (every linked run has its terminal entry), with their evidence and run links; at most
   * SESSION_PRUNE_BATCH per call. Returns how many. Each candidate is locked (the lock a recorder's
   * `bind` takes before it links a run) and checked again by a fresh statement before it is deleted, so a
   * run linked by another instance meanwhile keeps its session.
   */
  async pruneIdle(maxIdleMs: number, limit = SESSION_PRUNE_BATCH): Promise<number> {
    const cutoff = new Date(this.#now().getTime() - maxIdleMs).toISOString();
    return await this.transaction(async (tx) => {
      const idle = await tx.all<{ session_id: string }>(
        `SELECT s.session_id FROM workflow_sessions s WHERE ${IDLE} ORDER BY s.updated_at, s.session_id LIMIT ?`,
        [cutoff, cutoff, limit],
      );
      let deleted = 0;
      for (const { session_id } of idle) {
        if (!(await this.lockSession(session_id, tx))) continue;
        const still = await tx.get<{ session_id: string }>(
          `SELECT s.session_id FROM workflow_sessions s WHERE s.session_id = ? AND ${IDLE}`,
          [session_id, cutoff, cutoff],
        );
        if (!still) continue;
        await tx.run("DELETE FROM workflow_session_evidence WHERE session_id = ?", [session_id]);
        await tx.run("DELETE FROM workflow_session_runs WHERE session_id = ?", [session_id]);
        await tx.run("DELETE FROM workflow_sessions WHERE session_id = ?", [session_id]);
        deleted += 1;
      }
      return deleted;
    });
  }

  /** Mark the terminal entry written; false when it already was (exactly one caller gets true). */
  async markTerminal(runId: string, q: StateQueries = this.engine): Promise<boolean> {
    const { changes } = await q.run(
      "UPDATE workflow_session_runs SET terminal_recorded = 1 WHERE run_id = ? AND terminal_recorded = 0",
      [runId],
    );
    return changes === 1;
  }
}
