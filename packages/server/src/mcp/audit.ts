/**
 * Durable audit of MCP tool calls: one row per call with who, which tool,
 * which run (and task, attempt, workflow session — ids only), the outcome code, input/output sizes and duration. Never the
 * prompt, events, idempotency key, observation token or bearer token —
 * the row shape has no column that could hold them.
 */
import type BetterSqlite3 from "better-sqlite3";
import type { ApiErrorCode } from "../runs/api.js";

export type AuditOutcome = "ok" | ApiErrorCode;

export interface AuditRecord {
  principal_id: string;
  /** A tool name, or `resource:projects` for reads of the projects resource. */
  tool: string;
  run_id: string | null;
  /** The task, attempt and workflow session the call was about (ids only; mcp/audit-subjects.ts). */
  task_id?: string | null;
  attempt_id?: string | null;
  session_id?: string | null;
  outcome: AuditOutcome;
  input_bytes: number;
  output_bytes: number;
  duration_ms: number;
}

export interface AuditRow extends AuditRecord {
  id: number;
  at: string;
}

export interface AuditLog {
  record(entry: AuditRecord): void;
}

/** SQLite's `synchronous = NORMAL` (1): what an audit transaction commits with. */
const AUDIT_SYNCHRONOUS_NORMAL = 1;
/** Buffered audit rows are written in one transaction at least this often... */
export const AUDIT_FLUSH_INTERVAL_MS = 100;
/** ...or as soon as this many are buffered (bounds both memory and the size of one transaction). */
export const AUDIT_FLUSH_MAX_ROWS = 256;
/**
 * Rows kept in `mcp_audit`: older rows are deleted as new ones arrive, so the
 * table stays bounded even under a steady stream of observe calls (at the
 * bench's 2,000 calls/s this is the last ~2.5 minutes; at human pace, months).
 */
export const AUDIT_MAX_ROWS = 250_000;
/** Trimming to AUDIT_MAX_ROWS runs once per this many written rows, not per flush. */
const AUDIT_TRIM_EVERY_ROWS = 4096;

export interface SqliteAuditLogOptions {
  /** Called when a row cannot be written; the tool call itself has already happened. */
  onError?: (err: unknown) => void;
  clock?: () => Date;
  /** Rows kept (default AUDIT_MAX_ROWS). */
  maxRows?: number;
}

/**
 * Audit rows in the Server's SQLite state database (table `mcp_audit`, created by the schema migrations in
 * state/schema.ts: `db` must be migrated). The database runs with
 * synchronous=FULL for admission records, so a row per call would cost one fsync per tool call on
 * the event loop; rows are buffered and written in one transaction every AUDIT_FLUSH_INTERVAL_MS or
 * AUDIT_FLUSH_MAX_ROWS, and on flush()/close(), committed without an fsync of their own (see
 * #writeWithoutFsync). A crash can lose the last interval's rows.
 */
export class SqliteAuditLog implements AuditLog {
  readonly #insert: BetterSqlite3.Statement;
  readonly #insertMany: (rows: readonly (AuditRecord & { at: string })[]) => void;
  readonly #db: BetterSqlite3.Database;
  readonly #onError: (err: unknown) => void;
  readonly #clock: () => Date;
  readonly #maxRows: number;
  readonly #trim: BetterSqlite3.Statement<[number]>;
  #sinceTrim = Number.POSITIVE_INFINITY;
  #buffer: (AuditRecord & { at: string })[] = [];
  #timer: NodeJS.Timeout | null = null;
  #closed = false;

  constructor(db: BetterSqlite3.Database, options: SqliteAuditLogOptions = {}) {
    this.#db = db;
    this.#insert = db.prepare(
      `INSERT INTO mcp_audit (at, principal_id, tool, run_id, task_id, attempt_id, session_id, outcome, input_bytes,
         output_bytes, duration_ms)
       VALUES (@at, @principal_id, @tool, @run_id, @task_id, @attempt_id, @session_id, @outcome, @input_bytes,
         @output_bytes, @duration_ms)`,
    );
    this.#maxRows = options.maxRows ?? AUDIT_MAX_ROWS;
    if (!Number.isInteger(this.#maxRows) || this.#maxRows < 1) throw new RangeError("audit maxRows must be >= 1");
    this.#trim = db.prepare<[number]>("DELETE FROM mcp_audit WHERE id <= (SELECT MAX(id) FROM mcp_audit) - ?");
    this.#insertMany = db.transaction((rows: readonly (AuditRecord & { at: string })[]) => {
      for (const row of rows) {
        this.#insert.run({ task_id: null, attempt_id: null, session_id: null, ...row });
      }
      // The first flush after start trims too: the table may have grown under an older bound.
      this.#sinceTrim += rows.length;
      if (this.#sinceTrim >= Math.min(AUDIT_TRIM_EVERY_ROWS, this.#maxRows)) {
        this.#trim.run(this.#maxRows);
        this.#sinceTrim = 0;
      }
    });
    this.#onError = options.onError ?? (() => {});
    this.#clock = options.clock ?? (() => new Date());
  }

  record(entry: AuditRecord): void {
    this.#buffer.push({ ...entry, at: this.#clock().toISOString() });
    if (this.#closed || this.#buffer.length >= AUDIT_FLUSH_MAX_ROWS) this.flush();
    else if (this.#timer === null) {
      this.#timer = setTimeout(() => this.flush(), AUDIT_FLUSH_INTERVAL_MS);
      this.#timer.unref();
    }
  }

  /** Write every buffered row now, in one transaction. */
  flush(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    const rows = this.#buffer;
    if (rows.length === 0) return;
    this.#buffer = [];
    try {
      if (this.#db.open) this.#writeWithoutFsync(rows);
      else this.#onError(new Error(`database closed; ${rows.length} audit rows not written`));
    } catch (err) {
      this.#onError(err);
    }
  }

  /**
   * One transaction under `synchronous = NORMAL`, then the connection's own level again. In WAL mode
   * a NORMAL commit survives a crash of the process and reaches the disk with the next FULL commit
   * (an admission record) or checkpoint; only a power loss can take it, which the class contract
   * already allows for the last interval's rows. Without this every flush was an fsync on the event
   * loop, in front of run updates and observe answers.
   */
  #writeWithoutFsync(rows: readonly (AuditRecord & { at: string })[]): void {
    const level = this.#db.pragma("synchronous", { simple: true }) as number;
    if (level <= AUDIT_SYNCHRONOUS_NORMAL) {
      this.#insertMany(rows);
      return;
    }
    this.#db.pragma(`synchronous = ${AUDIT_SYNCHRONOUS_NORMAL}`);
    try {
      this.#insertMany(rows);
    } finally {
      this.#db.pragma(`synchronous = ${level}`);
    }
  }

  /** Flush and write later rows immediately (call before closing the database). */
  close(): void {
    this.#closed = true;
    this.flush();
  }

  /** Newest last (buffered rows are flushed first); for tests and operator inspection. */
  list(limit = 1000): AuditRow[] {
    this.flush();
    return this.#db
      .prepare(`SELECT * FROM (SELECT * FROM mcp_audit ORDER BY id DESC LIMIT ?) ORDER BY id ASC`)
      .all(limit) as AuditRow[];
  }
}

/** An audit sink that keeps rows in memory (unit tests). */
export class MemoryAuditLog implements AuditLog {
  readonly rows: AuditRecord[] = [];
  record(entry: AuditRecord): void {
    this.rows.push(entry);
  }
}
