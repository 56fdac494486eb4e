/**
 * The Server's durable state: opens the state dir (its secret, state/server-secret.ts; the SQLite file in WAL
 * with synchronous=FULL, its schema) and keeps the admission records (state/record.ts) on a StateEngine
 * (state/engine.ts) — the SQLite file by default, or an engine handed in (PostgreSQL) — with their cache,
 * the compare-and-set writes and the state-change listeners.
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { type RunState, TERMINAL_STATES } from "@webcodex/protocol";
import Database from "better-sqlite3";
import {
  type SqlParam,
  type StateEngine,
  type StateQueries,
  StateUsageError,
  type TransactionOptions,
} from "./engine.js";
import { SQLITE_BUSY_TIMEOUT_MS, SqliteEngine } from "./engine-sqlite.js";
import {
  type AdmissionRecord,
  type AdmissionStatus,
  type CostTotal,
  fromRow,
  PATCHABLE,
  RECORD_COLUMNS,
  type RecordFilter,
  type RecordListing,
  type RecordPatch,
  type RecordRow,
  sameRecord,
} from "./record.js";
import { migrate } from "./schema.js";
import { loadOrCreateServerSecret } from "./server-secret.js";

/**
 * Admission records kept in memory after a read, most recently used last — on SQLite only, where this
 * process is the only writer of admission_records (one Server per state dir, `server.lock`), so the
 * cache is never stale: every write drops the entry. It exists because every observe call reads its
 * run's record several times (ownership, admission, the view). On PostgreSQL several Server instances
 * write the same rows, so `get` always reads the database; only `peek` (what observe shows) answers from
 * records read before (RECORD_PEEK_TTL_MS).
 */
export const RECORD_CACHE_ENTRIES = 4096;
/**
 * PostgreSQL: `peek` answers from records read before, which another instance's write drops through its
 * notification (RECORD_CHANGES_CHANNEL, sent in the writing transaction) — and at the latest after this
 * long, which bounds how stale a copy can be when a notification was lost (the listening connection down).
 */
export const RECORD_PEEK_TTL_MS = 1_000;
/** PostgreSQL: every write of an admission record tells every instance the run id on this channel. */
export const RECORD_CHANGES_CHANNEL = "webcodex_record_changes";

/** SQLite `synchronous = FULL` (PRAGMA value): every commit is fsynced before it returns. */
const SYNCHRONOUS_FULL = 2;

export const STATE_DB_FILE = "server.sqlite3";

/** Told of a change of a record's `state`, inside the transaction that wrote it (`tx`). */
export type StateChangeListener = (
  record: AdmissionRecord,
  previous: RunState,
  tx: StateQueries,
) => void | Promise<void>;

export interface UpdateOptions {
  /** Write inside this transaction (its commit decides), else in a transaction of its own. */
  tx?: StateQueries;
  /**
   * Write only when the record still has these values (compare-and-set in the one UPDATE statement):
   * otherwise nothing is written and `update` resolves to undefined.
   */
  expect?: Pick<AdmissionRecord, "admission" | "state" | "updated_at">;
}

/** A PostgreSQL state made ready by `openPostgresState`. */
export interface OpenedState {
  readonly engine: StateEngine;
  readonly serverSecret: Buffer;
  readonly migrated: readonly number[];
}

export interface StateStoreOptions {
  /**
   * The engine the admission records are kept on. Default: the SQLite file this store opens, behind
   * SqliteEngine. An engine handed in (PostgreSQL) must already be migrated (`migrateState`) and is
   * closed by whoever opened it. The secret and the SQLite file are still opened here for the stores not
   * yet on the engine.
   */
  engine?: StateEngine;
}

/** The terminal states as an SQL list, `('completed', …)`. */
const TERMINAL_LIST = `(${[...TERMINAL_STATES].map((s) => `'${s}'`).join(", ")})`;
const SELECT_RECORD = "SELECT * FROM admission_records WHERE run_id = ?";
const INSERT_RECORD = `INSERT INTO admission_records (${RECORD_COLUMNS.join(", ")}) VALUES (${RECORD_COLUMNS.map(() => "?").join(", ")})
  ON CONFLICT (run_id) DO NOTHING`;

/** What `StateStore.decide` answers when the record is no longer the one the decision was made on. */
export const RECORD_CHANGED: unique symbol = Symbol("admission record changed");

export class StateStore {
  /** The SQLite connection (null on PostgreSQL); every store reads and writes through `engine`. */
  readonly db: Database.Database | null;
  /** Where the admission records live (state/engine.ts); the stores that moved onto the engine use it too. */
  readonly engine: StateEngine;
  readonly serverSecret: Buffer;
  /** Schema versions this open stepped through (empty when the file was current); see state/schema.ts. */
  readonly migrated: readonly number[];
  /** SQLite only (see RECORD_CACHE_ENTRIES); null on an engine several instances share. */
  readonly #cache: Map<string, AdmissionRecord> | null;
  /** PostgreSQL: records `peek` may answer from, with when each was read (see RECORD_PEEK_TTL_MS). */
  readonly #recent = new Map<string, { record: AdmissionRecord; readAt: number }>();
  /** PostgreSQL: whether record changes are followed (`followChanges`), so `#recent` may be used. */
  #following = false;
  #unfollow: (() => void) | null = null;
  /** Counts writes: a read that a write overtook does not fill the cache with what it read. */
  #writes = 0;
  /** PostgreSQL: the `peek` reads in flight by run id, with `#writes` when each began (at most one per run). */
  readonly #peeking = new Map<string, { writes: number; read: Promise<AdmissionRecord | undefined> }>();
  readonly #listeners: StateChangeListener[] = [];

  /** The SQLite connection, for what only SQLite has (pragmas, checkpoints; tests); throws on PostgreSQL. */
  get sqlite(): Database.Database {
    if (this.db === null) throw new StateUsageError("this state is on PostgreSQL: there is no SQLite connection");
    return this.db;
  }

  /** Whether `close` ends the engine too (one this store opened on PostgreSQL). */
  readonly #ownsEngine: boolean;

  /**
   * SQLite: the state dir's file and secret (`stateDir`). Or the parts `openPostgresState` made: a migrated
   * engine this store owns, and the secret kept in that database.
   */
  constructor(stateDir: string | OpenedState, options: StateStoreOptions = {}) {
    if (typeof stateDir !== "string") {
      this.db = null;
      this.engine = stateDir.engine;
      this.serverSecret = stateDir.serverSecret;
      this.migrated = stateDir.migrated;
      this.#ownsEngine = true;
      this.#cache = null;
      return;
    }
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    this.serverSecret = loadOrCreateServerSecret(stateDir);
    const file = join(stateDir, STATE_DB_FILE);
    const db = new Database(file);
    this.db = db;
    db.pragma("journal_mode = WAL");
    db.pragma(`synchronous = ${SYNCHRONOUS_FULL}`);
    db.pragma(`busy_timeout = ${SQLITE_BUSY_TIMEOUT_MS}`);
    this.migrated = migrate(db, file);
    this.engine = options.engine ?? new SqliteEngine(db);
    this.#ownsEngine = false;
    this.#cache = this.engine.dialect === "sqlite" ? new Map() : null;
  }

  /**
   * The record (frozen: change it with `update`), or undefined when the run does not exist. With `tx`,
   * read inside that transaction (and never cached: it may roll back).
   */
  async get(runId: string, tx?: StateQueries): Promise<AdmissionRecord | undefined> {
    if (tx !== undefined) {
      const row = await tx.get<RecordRow>(SELECT_RECORD, [runId]);
      return row ? fromRow(row) : undefined;
    }
    const cached = this.#cache?.get(runId);
    if (cached !== undefined) return this.#remember(cached);
    const writes = this.#writes;
    const row = await this.engine.get<RecordRow>(SELECT_RECORD, [runId]);
    if (!row) return undefined;
    const record = fromRow(row);
    return writes === this.#writes ? this.#remember(record) : record;
  }

  /**
   * The record for showing it (observe's ownership check and view), never for deciding anything: on
   * SQLite exactly `get`; on PostgreSQL, once `followChanges` listens, possibly a copy read before that
   * no instance has told a change of since (at most RECORD_PEEK_TTL_MS old) — a moment behind another
   * instance's commit, until its notification arrives.
   */
  async peek(runId: string): Promise<AdmissionRecord | undefined> {
    if (this.#cache !== null || !this.#following) return await this.get(runId);
    const recent = this.#recent.get(runId);
    if (recent !== undefined && Date.now() - recent.readAt < RECORD_PEEK_TTL_MS) return recent.record;
    this.#recent.delete(runId);
    // Peeks of one record while it is being read share that read, unless a write was told since it began.
    const reading = this.#peeking.get(runId);
    if (reading !== undefined && reading.writes === this.#writes) return await reading.read;
    const writes = this.#writes;
    const readAt = Date.now();
    const read = this.get(runId).then((record) => {
      if (record !== undefined && writes === this.#writes && this.#following) {
        if (this.#recent.size >= RECORD_CACHE_ENTRIES) {
          const oldest = this.#recent.keys().next().value;
          if (oldest !== undefined) this.#recent.delete(oldest);
        }
        this.#recent.set(runId, { record, readAt });
      }
      return record;
    });
    const entry = { writes, read };
    this.#peeking.set(runId, entry);
    try {
      return await read;
    } finally {
      if (this.#peeking.get(runId) === entry) this.#peeking.delete(runId);
    }
  }

  /**
   * PostgreSQL: listen for every instance's record writes (RECORD_CHANGES_CHANNEL), so that `peek` may
   * answer from records read before. A no-op on SQLite. Throws when the database cannot be reached.
   */
  async followChanges(): Promise<void> {
    if (this.engine.dialect !== "postgres" || this.#unfollow !== null) return;
    this.#unfollow = await this.engine.listen(RECORD_CHANGES_CHANNEL, (runId) => {
      this.#writes += 1;
      if (runId === null) this.#recent.clear();
      else this.#recent.delete(runId);
    });
    this.#following = true;
  }

  /** Tell the other instances (PostgreSQL) that `runId`'s record changed: inside `tx`, when it commits. */
  async #tell(runId: string, tx?: StateQueries): Promise<void> {
    if (this.engine.dialect !== "postgres") return;
    if (tx !== undefined) await tx.get("SELECT pg_notify(?, ?) AS notified", [RECORD_CHANGES_CHANNEL, runId]);
    else await this.engine.notify(RECORD_CHANGES_CHANNEL, runId);
  }

  /**
   * The record read `FOR UPDATE` inside `tx`: on PostgreSQL another transaction that locks or writes it
   * waits until `tx` ends (SQLite runs one transaction at a time anyway). For a run id that may not have
   * a record yet, open `tx` with `{lock: admissionLock(runId)}`, so that an absent row is decided once too.
   */
  async lock(tx: StateQueries, runId: string): Promise<AdmissionRecord | undefined> {
    const row = await tx.get<RecordRow>(`${SELECT_RECORD} FOR UPDATE`, [runId]);
    return row ? fromRow(row) : undefined;
  }

  /**
   * Run `write` in the one transaction that makes a decision about `runId`'s record atomic (design §6.1,
   * the same-key decision of admission): under the run id's lock (`{lock: admissionLock(runId)}`, for a
   * row that may not exist yet) the record is read FOR UPDATE and must still be `seen`, the record the
   * decision was made on (`sameRecord`). When another writer, on any Server instance, changed it in
   * between, nothing is written and the answer is RECORD_CHANGED: decide again on what is there now.
   */
  async decide<T>(
    runId: string,
    seen: AdmissionRecord | undefined,
    write: (tx: StateQueries) => Promise<T>,
    options: { withoutFsync?: boolean } = {},
  ): Promise<T | typeof RECORD_CHANGED> {
    return await this.engine.transaction(
      async (tx) => {
        if (!sameRecord(await this.lock(tx, runId), seen)) return RECORD_CHANGED;
        return await write(tx);
      },
      { lock: admissionLock(runId), durability: options.withoutFsync === true ? "relaxed" : "full" },
    );
  }

  /**
   * Insert a new record; undefined (nothing written) when one with this run id exists. To decide that
   * once across instances, insert inside a transaction opened with `{lock: admissionLock(runId)}`.
   */
  async insert(
    record: Omit<
      AdmissionRecord,
      | "created_at"
      | "updated_at"
      | "cancel_forwarded"
      | "cancel_pending"
      | "effective_config"
      | "usage_used_tokens"
      | "usage_context_size"
      | "usage_cost_amount"
      | "usage_cost_currency"
      | "runner_seq"
      | "runner_updated_at"
    >,
    tx?: StateQueries,
  ): Promise<AdmissionRecord | undefined> {
    const now = new Date().toISOString();
    const full: AdmissionRecord = {
      ...record,
      cancel_forwarded: false,
      cancel_pending: false,
      effective_config: [],
      usage_used_tokens: null,
      usage_context_size: null,
      usage_cost_amount: null,
      usage_cost_currency: null,
      runner_seq: null,
      runner_updated_at: null,
      created_at: now,
      updated_at: now,
    };
    const row: Record<string, SqlParam> = { ...full, cancel_forwarded: 0, cancel_pending: 0, effective_config: "[]" };
    this.#invalidate(record.run_id);
    const { changes } = await (tx ?? this.engine).run(
      INSERT_RECORD,
      RECORD_COLUMNS.map((c) => row[c] ?? null),
    );
    this.#invalidate(record.run_id);
    if (changes === 1) await this.#tell(record.run_id, tx);
    return changes === 1 ? Object.freeze(full) : undefined;
  }

  /**
   * Apply a patch; returns the updated record (undefined when the run does not exist, or when `expect`
   * no longer matches). When the state changes, the `onStateChange` listeners run inside the same
   * transaction (the caller's `tx`, else one of its own).
   */
  async update(runId: string, patch: RecordPatch, options: UpdateOptions = {}): Promise<AdmissionRecord | undefined> {
    const keys = Object.keys(patch).filter((k) => PATCHABLE.has(k));
    if (keys.length === 0 && options.expect === undefined) return this.get(runId, options.tx);
    const params: SqlParam[] = keys.map((k) => {
      const v = (patch as Record<string, unknown>)[k];
      return typeof v === "boolean" ? (v ? 1 : 0) : Array.isArray(v) ? JSON.stringify(v) : ((v ?? null) as SqlParam);
    });
    params.push(new Date().toISOString(), runId);
    let where = "run_id = ?";
    if (options.expect !== undefined) {
      where += " AND admission = ? AND state = ? AND updated_at = ?";
      params.push(options.expect.admission, options.expect.state, options.expect.updated_at);
    }
    const sets = [...keys, "updated_at"].map((k) => `${k} = ?`).join(", ");
    const sql = `UPDATE admission_records SET ${sets} WHERE ${where} RETURNING *`;
    const write = async (q: StateQueries): Promise<AdmissionRecord | undefined> => {
      const before =
        this.#listeners.length > 0
          ? await q.get<{ state: RunState }>("SELECT state FROM admission_records WHERE run_id = ? FOR UPDATE", [runId])
          : undefined;
      const row = await q.get<RecordRow>(sql, params);
      const after = row ? fromRow(row) : undefined;
      if (after) await this.#tell(runId, q === this.engine ? undefined : (q as StateQueries));
      if (after && before !== undefined && after.state !== before.state) {
        for (const listener of this.#listeners) await listener(after, before.state, q);
      }
      return after;
    };
    this.#invalidate(runId);
    try {
      if (options.tx !== undefined) return await write(options.tx);
      // Without listeners the one UPDATE … RETURNING is atomic on its own.
      if (this.#listeners.length === 0) return await write(this.engine);
      return await this.engine.transaction(write);
    } finally {
      this.#invalidate(runId);
    }
  }

  /**
   * Be told of every change of a record's `state`, inside the transaction that writes it (run the
   * listener's own writes on `tx`). Listeners must not throw: a throw rolls the change back. The
   * workflow-session recorder uses this.
   */
  onStateChange(listener: StateChangeListener): void {
    this.#listeners.push(listener);
  }

  /**
   * Run `fn` in one engine transaction (state/engine.ts: commits when it resolves, rolls back when it
   * throws). `durability: "relaxed"` is for the admission intent and the Runner's `admitted` answer only (design
   * §6.1): on SQLite such a commit has no fsync of its own — it survives a crash of this process (WAL)
   * and reaches the disk with the next FULL commit, so nothing outside this process may act on it before
   * one follows (the intent's `sent` commit comes before `run.start` leaves), or its loss to an OS crash
   * must be repaired by a later step (a record left `sent` is re-sent with the same run id). On
   * PostgreSQL every commit is durable.
   */
  transaction<T>(fn: (tx: StateQueries) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    return this.engine.transaction(fn, options);
  }

  /** Records of one runner that are not terminal on the Server side. */
  async listOpenForRunner(runnerId: string): Promise<AdmissionRecord[]> {
    const rows = await this.engine.all<RecordRow>(
      `SELECT * FROM admission_records WHERE runner_id = ? AND state NOT IN ${TERMINAL_LIST}`,
      [runnerId],
    );
    return rows.map(fromRow);
  }

  /** Records of one runner, not terminal, whose cancel was sent with its delivery unknown (`cancel_pending`). */
  async listPendingCancels(runnerId: string): Promise<AdmissionRecord[]> {
    const rows = await this.engine.all<RecordRow>(
      `SELECT * FROM admission_records WHERE runner_id = ? AND cancel_pending = 1 AND cancel_forwarded = 0
       AND state NOT IN ${TERMINAL_LIST}`,
      [runnerId],
    );
    return rows.map(fromRow);
  }

  async listByAdmission(status: AdmissionStatus): Promise<AdmissionRecord[]> {
    const rows = await this.engine.all<RecordRow>("SELECT * FROM admission_records WHERE admission = ?", [status]);
    return rows.map(fromRow);
  }

  /** Per runner: how many of its records are admitted or sent and not terminal (the runs it holds). */
  async countInUseByRunner(): Promise<Map<string, number>> {
    const rows = await this.engine.all<{ runner_id: string; n: number }>(
      `SELECT runner_id, COUNT(*) AS n FROM admission_records
       WHERE state NOT IN ${TERMINAL_LIST} AND admission != 'rejected_pre_admission' GROUP BY runner_id`,
    );
    return new Map(rows.map((r) => [r.runner_id, Number(r.n)]));
  }

  /** The newest `limit` records matching `filter` (newest first). */
  async listRecent(filter: RecordFilter, limit: number): Promise<RecordListing[]> {
    const where: string[] = [];
    const params: SqlParam[] = [];
    if (filter.state === "active") where.push(`state NOT IN ${TERMINAL_LIST}`);
    else if (filter.state !== undefined) {
      where.push("state = ?");
      params.push(filter.state);
    }
    if (filter.project_id !== undefined) {
      where.push("project_id = ?");
      params.push(filter.project_id);
    }
    if (filter.principal_id !== undefined) {
      where.push("principal_id = ?");
      params.push(filter.principal_id);
    }
    params.push(limit);
    return await this.engine.all<RecordListing>(
      `SELECT run_id, principal_id, project_id, provider_id, runner_id, state, execution_state, stop_reason,
         failure_kind, recovery_kind, admission, created_at, updated_at, usage_used_tokens, usage_context_size,
         usage_cost_amount, usage_cost_currency FROM admission_records
       ${where.length > 0 ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY created_at DESC, run_id LIMIT ?`,
      params,
    );
  }

  /**
   * The reported cost per principal, UTC day of creation and currency, newest day first: at most `limit`
   * rows, from the kept records (terminal ones are pruned after `retain_terminal_days`).
   */
  async costTotals(limit: number): Promise<CostTotal[]> {
    const rows = await this.engine.all<{
      day: string;
      principal_id: string;
      currency: string | null;
      amount: number | string;
      runs: number | string;
    }>(
      `SELECT substr(created_at, 1, 10) AS day, principal_id, usage_cost_currency AS currency,
         SUM(usage_cost_amount) AS amount, COUNT(*) AS runs FROM admission_records
       WHERE usage_cost_amount IS NOT NULL
       GROUP BY substr(created_at, 1, 10), principal_id, usage_cost_currency
       ORDER BY day DESC, principal_id, currency LIMIT ?`,
      [limit],
    );
    return rows.map((r) => ({ ...r, amount: Number(r.amount), runs: Number(r.runs) }));
  }

  /**
   * Delete up to `limit` records rejected before admission whose last change is before `cutoffIso`;
   * returns how many. Only `rejected_pre_admission` records: nothing of theirs ever ran on a Runner.
   */
  async deleteRejectedBefore(cutoffIso: string, limit: number): Promise<number> {
    this.#writes += 1;
    const rows = await this.engine.all<{ run_id: string }>(
      `DELETE FROM admission_records WHERE run_id IN (
         SELECT run_id FROM admission_records
         WHERE admission = 'rejected_pre_admission' AND updated_at < ? LIMIT ?
       ) RETURNING run_id`,
      [cutoffIso, limit],
    );
    for (const r of rows) {
      this.#invalidate(r.run_id);
      await this.#tell(r.run_id);
    }
    return rows.length;
  }

  /** Close the SQLite file, or end the PostgreSQL pool this store opened. */
  async close(): Promise<void> {
    this.#cache?.clear();
    this.#unfollow?.();
    this.#unfollow = null;
    this.#following = false;
    this.#recent.clear();
    if (this.db?.open) this.db.close();
    if (this.#ownsEngine) await this.engine.close();
  }

  #remember(record: AdmissionRecord): AdmissionRecord {
    const cache = this.#cache;
    if (cache === null) return record;
    cache.delete(record.run_id);
    cache.set(record.run_id, record);
    if (cache.size > RECORD_CACHE_ENTRIES) {
      const oldest = cache.keys().next().value;
      if (oldest !== undefined) cache.delete(oldest);
    }
    return record;
  }

  /**
   * Before and after every write: the cached record goes, and a read in flight does not put back what
   * it read. A write inside a transaction that rolls back therefore leaves nothing stale behind.
   */
  #invalidate(runId: string): void {
    this.#writes += 1;
    this.#cache?.delete(runId);
    this.#recent.delete(runId);
  }
}

/** The `{lock}` name (state/engine.ts TransactionOptions) under which a run id's admission is decided. */
export function admissionLock(runId: string): string {
  return `admission_records:${runId}`;
}
