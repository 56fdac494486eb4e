/**
 * Durable audit of MCP tool calls: one row per call with who, which tool,
 * which run (and task, attempt, workflow session — ids only), the outcome code, input/output sizes and duration. Never the
 * prompt, events, idempotency key, observation token or bearer token —
 * the row shape has no column that could hold them.
 */
import type { ApiErrorCode } from "../runs/api.js";
import type { StateEngine } from "../state/engine.js";

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

export interface StateAuditLogOptions {
  /** Called when a row cannot be written; the tool call itself has already happened. */
  onError?: (err: unknown) => void;
  clock?: () => Date;
  /** Rows kept (default AUDIT_MAX_ROWS). */
  maxRows?: number;
}

type BufferedRow = AuditRecord & { at: string };

/**
 * Audit rows in the Server's state database (table `mcp_audit`, created by the schema migrations in
 * state/schema.ts: the database must be migrated), on either engine. Rows are buffered and written in
 * one transaction every AUDIT_FLUSH_INTERVAL_MS or AUDIT_FLUSH_MAX_ROWS, and on flush()/close(), one
 * flush after the other (so ids follow the order of the calls). The transaction is `relaxed`
 * (state/engine.ts): on SQLite it commits without an fsync of its own — a row per call would otherwise
 * cost an fsync per tool call on the event loop — so a power loss can take the last interval's rows, as
 * can a crash of the process before a flush; PostgreSQL commits it durably like everything else.
 */
export class StateAuditLog implements AuditLog {
  readonly #db: StateEngine;
  readonly #onError: (err: unknown) => void;
  readonly #clock: () => Date;
  readonly #maxRows: number;
  #sinceTrim = Number.POSITIVE_INFINITY;
  #buffer: BufferedRow[] = [];
  #timer: NodeJS.Timeout | null = null;
  #closed = false;
  /** The flushes started so far, in order; each waits for the one before. */
  #flushed: Promise<void> = Promise.resolve();

  constructor(db: StateEngine, options: StateAuditLogOptions = {}) {
    this.#db = db;
    this.#maxRows = options.maxRows ?? AUDIT_MAX_ROWS;
    if (!Number.isInteger(this.#maxRows) || this.#maxRows < 1) throw new RangeError("audit maxRows must be >= 1");
    this.#onError = options.onError ?? (() => {});
    this.#clock = options.clock ?? (() => new Date());
  }

  record(entry: AuditRecord): void {
    this.#buffer.push({ ...entry, at: this.#clock().toISOString() });
    if (this.#closed || this.#buffer.length >= AUDIT_FLUSH_MAX_ROWS) void this.flush();
    else if (this.#timer === null) {
      this.#timer = setTimeout(() => void this.flush(), AUDIT_FLUSH_INTERVAL_MS);
      this.#timer.unref();
    }
  }

  /** Write every buffered row now, in one transaction, after the flushes before it; never rejects (see onError). */
  flush(): Promise<void> {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    const rows = this.#buffer;
    if (rows.length > 0) {
      this.#buffer = [];
      this.#flushed = this.#flushed.then(() => this.#write(rows)).catch((err: unknown) => this.#onError(err));
    }
    return this.#flushed;
  }

  async #write(rows: readonly BufferedRow[]): Promise<void> {
    const written = this.#sinceTrim + rows.length;
    // The first flush after start trims too: the table may have grown under an older bound.
    const trim = written >= Math.min(AUDIT_TRIM_EVERY_ROWS, this.#maxRows);
    await this.#db.transaction(
      async (tx) => {
        // A few multi-row statements, keeping the transaction short: chunks of power-of-two sizes up to
        // AUDIT_FLUSH_MAX_ROWS, so the engines see at most log2(AUDIT_FLUSH_MAX_ROWS) + 1 distinct statement texts.
        for (let i = 0; i < rows.length; ) {
          let size = 1;
          while (size * 2 <= Math.min(rows.length - i, AUDIT_FLUSH_MAX_ROWS)) size *= 2;
          const chunk = rows.slice(i, i + size);
          i += size;
          await tx.run(
            `INSERT INTO mcp_audit (at, principal_id, tool, run_id, task_id, attempt_id, session_id, outcome, input_bytes,
               output_bytes, duration_ms)
             VALUES ${chunk.map(() => "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)").join(", ")}`,
            chunk.flatMap((row) => [
              row.at,
              row.principal_id,
              row.tool,
              row.run_id,
              row.task_id ?? null,
              row.attempt_id ?? null,
              row.session_id ?? null,
              row.outcome,
              row.input_bytes,
              row.output_bytes,
              row.duration_ms,
            ]),
          );
        }
        if (trim) {
          await tx.run("DELETE FROM mcp_audit WHERE id <= (SELECT MAX(id) FROM mcp_audit) - ?", [this.#maxRows]);
        }
      },
      { durability: "relaxed" },
    );
    this.#sinceTrim = trim ? 0 : written;
  }

  /** Flush and write later rows immediately (call before closing the database). */
  async close(): Promise<void> {
    this.#closed = true;
    await this.flush();
  }

  /** Newest last (buffered rows are flushed first); for tests and operator inspection. */
  async list(limit = 1000): Promise<AuditRow[]> {
    await this.flush();
    return await this.#db.all<AuditRow>(
      "SELECT * FROM (SELECT * FROM mcp_audit ORDER BY id DESC LIMIT ?) AS newest ORDER BY id ASC",
      [limit],
    );
  }
}

/** An audit sink that keeps rows in memory (unit tests). */
export class MemoryAuditLog implements AuditLog {
  readonly rows: AuditRecord[] = [];
  record(entry: AuditRecord): void {
    this.rows.push(entry);
  }
}
