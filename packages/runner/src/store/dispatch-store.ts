/**
 * The durable dispatch record (design §4.4): one SQLite row per admitted run
 * holding only the DispatchRow fields — never the prompt, config bodies,
 * transcript, idempotency key, credentials, ACP session id or messages.
 *
 * Durability: WAL journal + synchronous=FULL, so a committed statement (the
 * child's identity, the dispatch barrier, the terminal state) is fsync'd to
 * the WAL before the call returns. Two records on the way to dispatch commit
 * under synchronous=NORMAL, without an fsync of their own: in WAL mode such a
 * commit survives a crash of the process (kill -9), and the next FULL commit
 * fsyncs the WAL up to its end, so it is on disk then too.
 *  - the admission row (`admit`): the run manager makes it durable before it
 *    answers run.start (`ensureDurable`; normally the child's identity, a FULL
 *    commit made right after the fork, already did), so the fsync overlaps the
 *    agent's start-up instead of delaying the spawn. A crash of the process
 *    keeps the row, so recovery and reaping see the run exactly as before; a
 *    crash of the machine before that fsync ends the child too and leaves a run
 *    that nobody was told about and that never reached the barrier.
 *  - the effective-config snapshot, fsync'd by the barrier commit that follows
 *    it before any prompt is written.
 * Schema versions are migrations keyed by PRAGMA user_version.
 *
 * Tombstones: pruning a terminal row (retention) writes, in the same
 * transaction, a compact tombstone — run id, a fingerprint prefix, the final
 * state and the terminal time — that is never pruned (store/tombstone.ts). So every
 * run this store ever admitted is in `runs` or in `tombstones`, for the life
 * of the store, and `admit` refuses an id found in either.
 *
 * Store identity: a random store_id is created with the database (meta
 * table) and mirrored in a marker file `store.json` next to it; opening the
 * store with its marker, and refusing a store that is gone or not the one the
 * marker names, is store/open.ts.
 */
import { randomBytes } from "node:crypto";
import type { EffectiveConfigEntry } from "@webcodex/protocol";
import Database from "better-sqlite3";
import { decodeTombstone, encodeTombstone, runKey, type StoredTombstone, TOMBSTONES_DDL } from "./tombstone.js";
import type {
  AdmissionRow,
  ApplyRow,
  DispatchRow,
  DispatchStore,
  TerminalUpdate,
  Tombstone,
  WorkspaceRow,
} from "./types.js";

/** Random store ids share the instance-id alphabet ([A-Za-z0-9_-], 16-64). */
function newStoreId(): string {
  return `st_${randomBytes(18).toString("base64url")}`;
}

export function nowIso(): string {
  return new Date().toISOString();
}

// ---- schema ----------------------------------------------------------------

type Db = Database.Database;

/** Migration N brings user_version from N to N+1. Append only; never edit a shipped one. */
const MIGRATIONS: ReadonlyArray<(db: Db) => void> = [
  (db) => {
    db.exec(`
      CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
      ) STRICT;
      CREATE TABLE runs (
        run_id               TEXT PRIMARY KEY,
        intent_fingerprint   TEXT NOT NULL,
        project_id           TEXT NOT NULL,
        provider_id          TEXT NOT NULL,
        provider_instance_id TEXT NOT NULL,
        agent_instance_id    TEXT NOT NULL,
        phase                TEXT NOT NULL CHECK (phase IN ('admitted', 'setup', 'dispatch_barrier', 'terminal')),
        state                TEXT NOT NULL,
        execution_state      TEXT NOT NULL,
        stop_reason          TEXT,
        failure_kind         TEXT,
        recovery_kind        TEXT NOT NULL,
        message              TEXT,
        effective_config     TEXT NOT NULL DEFAULT '[]',
        ignored_updates      INTEGER NOT NULL DEFAULT 0,
        last_seq             INTEGER NOT NULL DEFAULT 0,
        created_at           TEXT NOT NULL,
        updated_at           TEXT NOT NULL,
        child_pgid           INTEGER,
        child_start_time     TEXT
      ) STRICT;
      CREATE INDEX runs_by_phase ON runs (phase, updated_at);
    `);
  },
  (db) => {
    db.exec(TOMBSTONES_DDL);
  },
  (db) => {
    // Worktree runs (design §16): recorded before the worktree is made; head_commit once the change is.
    db.exec(`
      CREATE TABLE workspaces (
        run_id      TEXT PRIMARY KEY,
        branch      TEXT NOT NULL,
        base_commit TEXT NOT NULL,
        head_commit TEXT,
        recorded_at TEXT
      ) STRICT;
    `);
  },
  // Continuation (design §17): the run's ACP session id (not a secret), so a later run can resume it.
  (db) => {
    db.exec("ALTER TABLE runs ADD COLUMN acp_session_id TEXT");
  },
  (db) => {
    // Applies of a worktree run's change (design §16): the answer under the SHA-256 of the caller's key. No path,
    // no diff: a conflict's paths are computed again from the two commits when the answer is replayed.
    db.exec(`
      CREATE TABLE applies (
        run_id        TEXT NOT NULL,
        key_hash      TEXT NOT NULL,
        target_branch TEXT NOT NULL,
        result        TEXT NOT NULL,
        target_before TEXT NOT NULL,
        target_after  TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        PRIMARY KEY (run_id, key_hash)
      ) STRICT;
    `);
  },
];

export const SCHEMA_VERSION = MIGRATIONS.length;

function migrate(db: Db): void {
  const from = db.pragma("user_version", { simple: true }) as number;
  if (from > SCHEMA_VERSION) {
    throw new Error(`store schema version ${from} is newer than this Runner supports (${SCHEMA_VERSION})`);
  }
  for (let v = from; v < SCHEMA_VERSION; v++) {
    const step = MIGRATIONS[v]!;
    db.transaction(() => {
      step(db);
      db.pragma(`user_version = ${v + 1}`);
    })();
  }
}

/** Why an existing file is not a usable store (turned into a StoreRefusedError by openDispatchStore). */
export class StoreFileError extends Error {
  override readonly name = "StoreFileError";
  constructor(
    readonly reason: "not_a_store" | "integrity",
    message: string,
  ) {
    super(message);
  }
}

/**
 * Checks on an existing file, before anything writes to it: it must be an
 * SQLite database (a garbage header throws SQLITE_NOTADB here), carry our
 * schema version (a truncated-to-empty file reads as version 0) and pass
 * PRAGMA integrity_check.
 */
function verifyExisting(db: Db): void {
  const version = db.pragma("user_version", { simple: true }) as number;
  if (version === 0) throw new StoreFileError("not_a_store", "the file holds no WebCodex store schema");
  const integrity = db.pragma("integrity_check", { simple: true });
  if (integrity !== "ok") throw new StoreFileError("integrity", "PRAGMA integrity_check failed");
}

/** PRAGMA synchronous levels: FULL for the store, NORMAL for the two records named in the header. */
const SYNCHRONOUS_NORMAL = 1;
const SYNCHRONOUS_FULL = 2;

function applyPragmas(db: Db): void {
  db.pragma("journal_mode = WAL");
  db.pragma(`synchronous = ${SYNCHRONOUS_FULL}`);
  db.pragma("foreign_keys = ON");
}

/** How long a second process waits for the store's lock before giving up. */
export const LOCK_WAIT_MS = 250;

export function isBusy(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return code === "SQLITE_BUSY" || code === "SQLITE_LOCKED";
}

// ---- rows --------------------------------------------------------------------

interface SqlRow {
  run_id: string;
  intent_fingerprint: string;
  project_id: string;
  provider_id: string;
  provider_instance_id: string;
  agent_instance_id: string;
  phase: string;
  state: string;
  execution_state: string;
  stop_reason: string | null;
  failure_kind: string | null;
  recovery_kind: string;
  message: string | null;
  effective_config: string;
  ignored_updates: number;
  last_seq: number;
  created_at: string;
  updated_at: string;
  child_pgid: number | null;
  child_start_time: string | null;
}

function fromSql(r: SqlRow): DispatchRow {
  let effective: EffectiveConfigEntry[] = [];
  try {
    const parsed: unknown = JSON.parse(r.effective_config);
    if (Array.isArray(parsed)) effective = parsed as EffectiveConfigEntry[];
  } catch {
    effective = [];
  }
  // The ACP session id is read on its own (acpSessionOf), never as part of a run's row.
  const { acp_session_id: _session, ...row } = r as SqlRow & { acp_session_id?: string | null };
  // The columns only ever hold values written through this module from the protocol's enums.
  return {
    ...row,
    phase: r.phase as DispatchRow["phase"],
    state: r.state as DispatchRow["state"],
    execution_state: r.execution_state as DispatchRow["execution_state"],
    stop_reason: r.stop_reason as DispatchRow["stop_reason"],
    failure_kind: r.failure_kind as DispatchRow["failure_kind"],
    recovery_kind: r.recovery_kind as DispatchRow["recovery_kind"],
    effective_config: effective,
  };
}

export interface PruneOptions {
  /** Terminal rows older than this many days are removed. */
  retainDays: number;
  /** At most this many terminal rows are kept (newest first). */
  retainMax: number;
  now?: Date;
}

export interface PruneResult {
  byAge: number;
  byCount: number;
  /** The runs whose rows were pruned (their diagnostics files go with them). */
  runIds: string[];
}

/** better-sqlite3 implementation of the DispatchStore contract. */
export class SqliteDispatchStore implements DispatchStore {
  readonly storeId: string;
  readonly path: string;
  readonly #db: Db;
  readonly #stmts;
  /** A commit without an fsync of its own was made since the last fsync'd one. */
  #unsynced = false;

  private constructor(db: Db, path: string, storeId: string) {
    this.#db = db;
    this.path = path;
    this.storeId = storeId;
    this.#stmts = {
      get: db.prepare<[string], SqlRow>("SELECT * FROM runs WHERE run_id = ?"),
      active: db.prepare<[], SqlRow>("SELECT * FROM runs WHERE phase <> 'terminal' ORDER BY created_at DESC, run_id"),
      recentTerminal: db.prepare<[number], SqlRow>(
        "SELECT * FROM runs WHERE phase = 'terminal' ORDER BY updated_at DESC, run_id LIMIT ?",
      ),
      tombstone: db.prepare<[Buffer], StoredTombstone>("SELECT * FROM tombstones WHERE run_key = ?"),
      putTombstone: db.prepare(`
        INSERT OR REPLACE INTO tombstones (run_key, fingerprint, outcome, terminal_at)
        VALUES (@run_key, @fingerprint, @outcome, @terminal_at)`),
      deleteRun: db.prepare("DELETE FROM runs WHERE run_id = ?"),
      insert: db.prepare(`
        INSERT INTO runs (run_id, intent_fingerprint, project_id, provider_id, provider_instance_id,
          agent_instance_id, phase, state, execution_state, stop_reason, failure_kind, recovery_kind, message,
          effective_config, ignored_updates, last_seq, created_at, updated_at, child_pgid, child_start_time)
        VALUES (@run_id, @intent_fingerprint, @project_id, @provider_id, @provider_instance_id,
          @agent_instance_id, 'admitted', 'starting', 'not_started', NULL, NULL, 'wait', NULL,
          '[]', 0, 0, @created_at, @created_at, NULL, NULL)`),
      touch: db.prepare("UPDATE runs SET updated_at = @now WHERE run_id = @run_id"),
      setup: db.prepare(`
        UPDATE runs SET phase = 'setup', child_pgid = @pgid, child_start_time = @start, updated_at = @now
        WHERE run_id = @run_id AND phase = 'admitted'`),
      config: db.prepare(`
        UPDATE runs SET effective_config = @config, updated_at = @now
        WHERE run_id = @run_id AND phase IN ('admitted', 'setup')`),
      acpSession: db.prepare("UPDATE runs SET acp_session_id = @session_id, updated_at = @now WHERE run_id = @run_id"),
      acpSessionOf: db.prepare<[string], { acp_session_id: string | null }>(
        "SELECT acp_session_id FROM runs WHERE run_id = ?",
      ),
      barrier: db.prepare(`
        UPDATE runs SET phase = 'dispatch_barrier', state = 'running', execution_state = 'started',
          updated_at = @now
        WHERE run_id = @run_id AND phase IN ('admitted', 'setup')`),
      terminal: db.prepare(`
        UPDATE runs SET phase = 'terminal', state = @state, execution_state = @execution_state,
          stop_reason = @stop_reason, failure_kind = @failure_kind, recovery_kind = @recovery_kind,
          message = @message, ignored_updates = @ignored_updates, last_seq = @last_seq, updated_at = @now
        WHERE run_id = @run_id AND phase <> 'terminal'`),
      clearChild: db.prepare(
        "UPDATE runs SET child_pgid = NULL, child_start_time = NULL, updated_at = @now WHERE run_id = @run_id",
      ),
      withChild: db.prepare<[], SqlRow>("SELECT * FROM runs WHERE child_pgid IS NOT NULL ORDER BY created_at"),
      // A run whose change is not recorded yet keeps its row (start-up records it: workspace/).
      pruneAge: db.prepare<[string], SqlRow>(
        `SELECT * FROM runs WHERE phase = 'terminal' AND state <> 'lost' AND child_pgid IS NULL AND updated_at < ?
          AND run_id NOT IN (SELECT run_id FROM workspaces WHERE head_commit IS NULL)`,
      ),
      pruneCount: db.prepare<[number], SqlRow>(`
        SELECT * FROM runs WHERE phase = 'terminal' AND state <> 'lost' AND child_pgid IS NULL
          AND run_id NOT IN (SELECT run_id FROM workspaces WHERE head_commit IS NULL)
        ORDER BY updated_at DESC, run_id LIMIT -1 OFFSET ?`),
      deleteWorkspace: db.prepare("DELETE FROM workspaces WHERE run_id = ?"),
      deleteApplies: db.prepare("DELETE FROM applies WHERE run_id = ?"),
      putApply: db.prepare(`
        INSERT INTO applies (run_id, key_hash, target_branch, result, target_before, target_after, created_at)
        VALUES (@run_id, @key_hash, @target_branch, @result, @target_before, @target_after, @now)`),
      getApply: db.prepare<[string, string], ApplyRow>(
        `SELECT run_id, key_hash, target_branch, result, target_before, target_after FROM applies
          WHERE run_id = ? AND key_hash = ?`,
      ),
      countApplies: db.prepare<[string], { n: number }>("SELECT count(*) AS n FROM applies WHERE run_id = ?"),
      putWorkspace: db.prepare(
        "INSERT INTO workspaces (run_id, branch, base_commit) VALUES (@run_id, @branch, @base_commit)",
      ),
      recordChange: db.prepare("UPDATE workspaces SET head_commit = @head, recorded_at = @now WHERE run_id = @run_id"),
      getWorkspace: db.prepare<[string], WorkspaceRow>(
        "SELECT run_id, branch, base_commit, head_commit FROM workspaces WHERE run_id = ?",
      ),
      branchInUse: db.prepare<[string], { one: number }>("SELECT 1 AS one FROM workspaces WHERE branch = ? LIMIT 1"),
      unrecorded: db.prepare<[], WorkspaceRow>(
        "SELECT run_id, branch, base_commit, head_commit FROM workspaces WHERE head_commit IS NULL ORDER BY run_id",
      ),
    };
  }

  /**
   * Open (or create) the database at `path` with the durability pragmas and
   * migrations applied. Low level: no marker logic — use openDispatchStore.
   */
  static openFile(path: string, options: { create: boolean }): SqliteDispatchStore {
    const db = new Database(path, { fileMustExist: !options.create, timeout: LOCK_WAIT_MS });
    try {
      // One process per store: the first access takes SQLite's lock and keeps it until close,
      // so a second Runner on the same state_dir fails with SQLITE_BUSY instead of "recovering"
      // the first one's live runs.
      db.pragma("locking_mode = EXCLUSIVE");
      if (!options.create) verifyExisting(db);
      applyPragmas(db);
      migrate(db);
      db.exec("BEGIN EXCLUSIVE; COMMIT");
      let storeId = (db.prepare("SELECT value FROM meta WHERE key = 'store_id'").get() as { value: string } | undefined)
        ?.value;
      if (storeId === undefined) {
        if (!options.create) throw new StoreFileError("not_a_store", "the database has no store_id");
        storeId = newStoreId();
        db.prepare("INSERT INTO meta (key, value) VALUES ('store_id', ?), ('created_at', ?)").run(storeId, nowIso());
      }
      return new SqliteDispatchStore(db, path, storeId);
    } catch (error) {
      db.close();
      throw error;
    }
  }

  /** Fold the WAL into the main database file. */
  checkpoint(): void {
    this.#db.pragma("wal_checkpoint(TRUNCATE)");
  }

  /** Current value of a pragma (tests and diagnostics). */
  pragma(name: "journal_mode" | "synchronous" | "user_version" | "integrity_check"): unknown {
    return this.#db.pragma(name, { simple: true });
  }

  get(runId: string): DispatchRow | undefined {
    const row = this.#stmts.get.get(runId);
    return row ? fromSql(row) : undefined;
  }

  listForInventory(limit: number): DispatchRow[] {
    const active = this.#stmts.active.all().map(fromSql);
    const room = Math.max(0, limit - active.length);
    const terminal = room > 0 ? this.#stmts.recentTerminal.all(room).map(fromSql) : [];
    return [...active, ...terminal].slice(0, Math.max(0, limit));
  }

  /** Every row that still records a child process group (for the reaper). */
  listWithChild(): DispatchRow[] {
    return this.#stmts.withChild.all().map(fromSql);
  }

  /** Every row not yet terminal (for recovery). */
  listNonTerminal(): DispatchRow[] {
    return this.#stmts.active.all().map(fromSql);
  }

  admit(row: AdmissionRow): DispatchRow {
    return this.#withoutFsync(() =>
      this.#db.transaction(() => {
        if (this.tombstone(row.run_id)) throw new Error(`admit: run ${row.run_id} has a tombstone in this store`);
        this.#stmts.insert.run(row);
        return this.get(row.run_id)!;
      })(),
    );
  }

  ensureDurable(runId: string): void {
    if (!this.#unsynced) return;
    // Any FULL commit fsyncs the WAL up to its end; this one only restamps the run.
    const info = this.#stmts.touch.run({ run_id: runId, now: nowIso() });
    this.#unsynced = false;
    this.#expectOne(info.changes, runId, "ensureDurable");
  }

  tombstone(runId: string): Tombstone | undefined {
    const key = runKey(runId);
    if (!key) return undefined;
    const stored = this.#stmts.tombstone.get(key);
    return stored ? decodeTombstone(runId, stored) : undefined;
  }

  markSetup(runId: string, child: { pgid: number; startTime: string } | null): void {
    const params = { run_id: runId, pgid: child?.pgid ?? null, start: child?.startTime ?? null, now: nowIso() };
    const info = this.#durably(() => this.#stmts.setup.run(params));
    this.#expectOne(info.changes, runId, "markSetup");
  }

  recordEffectiveConfig(runId: string, config: EffectiveConfigEntry[]): void {
    const params = { run_id: runId, config: JSON.stringify(config), now: nowIso() };
    const info = this.#withoutFsync(() => this.#stmts.config.run(params));
    this.#expectOne(info.changes, runId, "recordEffectiveConfig");
  }

  recordAcpSession(runId: string, sessionId: string): void {
    const params = { run_id: runId, session_id: sessionId, now: nowIso() };
    const info = this.#withoutFsync(() => this.#stmts.acpSession.run(params));
    this.#expectOne(info.changes, runId, "recordAcpSession");
  }

  acpSessionOf(runId: string): string | null {
    return this.#stmts.acpSessionOf.get(runId)?.acp_session_id ?? null;
  }

  /** One commit under synchronous=NORMAL, then FULL again (see the header for which and why). */
  #withoutFsync<T>(write: () => T): T {
    if (this.#db.inTransaction) return write();
    this.#db.pragma(`synchronous = ${SYNCHRONOUS_NORMAL}`);
    try {
      const out = write();
      this.#unsynced = true;
      return out;
    } finally {
      this.#db.pragma(`synchronous = ${SYNCHRONOUS_FULL}`);
    }
  }

  /** One FULL commit: everything committed before it is on disk once it returns. */
  #durably<T>(write: () => T): T {
    const out = write();
    if (!this.#db.inTransaction) this.#unsynced = false;
    return out;
  }

  markDispatchBarrier(runId: string): void {
    // A single autocommit UPDATE: with journal_mode=WAL and synchronous=FULL,
    // SQLite fsyncs the WAL before run() returns. Only then may the prompt be written.
    const info = this.#durably(() => this.#stmts.barrier.run({ run_id: runId, now: nowIso() }));
    this.#expectOne(info.changes, runId, "markDispatchBarrier");
  }

  markTerminal(runId: string, update: TerminalUpdate): void {
    const info = this.#durably(() => this.#stmts.terminal.run({ run_id: runId, ...update, now: nowIso() }));
    this.#expectOne(info.changes, runId, "markTerminal");
  }

  clearChild(runId: string): void {
    this.#stmts.clearChild.run({ run_id: runId, now: nowIso() });
  }

  recordWorkspace(runId: string, workspace: { branch: string; base_commit: string }): void {
    this.#stmts.putWorkspace.run({ run_id: runId, ...workspace });
  }

  recordChange(runId: string, headCommit: string): void {
    this.#expectOne(
      this.#stmts.recordChange.run({ run_id: runId, head: headCommit, now: nowIso() }).changes,
      runId,
      "recordChange",
    );
  }

  workspace(runId: string): WorkspaceRow | undefined {
    return this.#stmts.getWorkspace.get(runId);
  }

  unrecordedWorkspaces(): WorkspaceRow[] {
    return this.#stmts.unrecorded.all();
  }

  branchInUse(branch: string): boolean {
    return this.#stmts.branchInUse.get(branch) !== undefined;
  }

  recordApply(row: ApplyRow): void {
    this.#durably(() => this.#stmts.putApply.run({ ...row, now: nowIso() }));
  }

  applyOf(runId: string, keyHash: string): ApplyRow | undefined {
    return this.#stmts.getApply.get(runId, keyHash);
  }

  applyCount(runId: string): number {
    return this.#stmts.countApplies.get(runId)?.n ?? 0;
  }

  /**
   * Retention: remove terminal rows older than retainDays, then all but the
   * newest retainMax terminal rows, each replaced by its tombstone in the same
   * transaction. Rows that are active, lost, or still record a child process
   * group are never pruned; tombstones never are.
   */
  prune(options: PruneOptions): PruneResult {
    const now = options.now ?? new Date();
    const cutoff = new Date(now.getTime() - options.retainDays * 86_400_000).toISOString();
    return this.#db.transaction(() => {
      const runIds: string[] = [];
      const byAge = this.#bury(this.#stmts.pruneAge.all(cutoff), runIds);
      const byCount = this.#bury(this.#stmts.pruneCount.all(Math.max(0, options.retainMax)), runIds);
      return { byAge, byCount, runIds };
    })();
  }

  /** Replace each terminal row by its tombstone (inside prune's transaction). */
  #bury(rows: SqlRow[], runIds: string[]): number {
    for (const sql of rows) {
      this.#stmts.putTombstone.run(encodeTombstone(fromSql(sql)));
      this.#stmts.deleteRun.run(sql.run_id);
      this.#stmts.deleteWorkspace.run(sql.run_id);
      this.#stmts.deleteApplies.run(sql.run_id);
      runIds.push(sql.run_id);
    }
    return rows.length;
  }

  /** Bytes of database pages a table (with its b-tree) occupies (tests and diagnostics; SQLite's dbstat). */
  tableBytes(table: "runs" | "tombstones"): number {
    const row = this.#db.prepare("SELECT coalesce(sum(pgsize), 0) AS n FROM dbstat WHERE name = ?").get(table);
    return (row as { n: number }).n;
  }

  /** Tombstones held (tests and diagnostics). */
  tombstoneCount(): number {
    return (this.#db.prepare("SELECT count(*) AS n FROM tombstones").get() as { n: number }).n;
  }

  /** Run `fn` in one transaction (recovery rewrites all its rows atomically). */
  transaction<T>(fn: () => T): T {
    return this.#db.transaction(fn)();
  }

  close(): void {
    if (this.#db.open) this.#db.close();
  }

  #expectOne(changes: number, runId: string, op: string): void {
    if (changes !== 1) {
      const row = this.get(runId);
      throw new Error(`${op}: run ${runId} ${row ? `is in phase ${row.phase}` : "is not in the store"}`);
    }
  }
}
