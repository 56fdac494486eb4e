/**
 * Durable audit of MCP tool calls: one row per call with who, which tool,
 * which run, the outcome code, input/output sizes and duration. Never the
 * prompt, events, idempotency key, observation token or bearer token —
 * the row shape has no column that could hold them.
 */
import type BetterSqlite3 from "better-sqlite3";
import type { ApiErrorCode } from "./runs-api.js";

export type AuditOutcome = "ok" | ApiErrorCode;

export interface AuditRecord {
  principal_id: string;
  /** A tool name, or `resource:projects` for reads of the projects resource. */
  tool: string;
  run_id: string | null;
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

const SCHEMA = `
CREATE TABLE IF NOT EXISTS mcp_audit (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  at TEXT NOT NULL,
  principal_id TEXT NOT NULL,
  tool TEXT NOT NULL,
  run_id TEXT,
  outcome TEXT NOT NULL,
  input_bytes INTEGER NOT NULL,
  output_bytes INTEGER NOT NULL,
  duration_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS mcp_audit_principal_at ON mcp_audit (principal_id, at);
`;

export interface SqliteAuditLogOptions {
  /** Called when a row cannot be written; the tool call itself has already happened. */
  onError?: (err: unknown) => void;
  clock?: () => Date;
}

/** Audit rows in the Server's SQLite state database (table `mcp_audit`). */
export class SqliteAuditLog implements AuditLog {
  readonly #insert: BetterSqlite3.Statement;
  readonly #db: BetterSqlite3.Database;
  readonly #onError: (err: unknown) => void;
  readonly #clock: () => Date;

  constructor(db: BetterSqlite3.Database, options: SqliteAuditLogOptions = {}) {
    db.exec(SCHEMA);
    this.#db = db;
    this.#insert = db.prepare(
      `INSERT INTO mcp_audit (at, principal_id, tool, run_id, outcome, input_bytes, output_bytes, duration_ms)
       VALUES (@at, @principal_id, @tool, @run_id, @outcome, @input_bytes, @output_bytes, @duration_ms)`,
    );
    this.#onError = options.onError ?? (() => {});
    this.#clock = options.clock ?? (() => new Date());
  }

  record(entry: AuditRecord): void {
    try {
      this.#insert.run({ ...entry, at: this.#clock().toISOString() });
    } catch (err) {
      this.#onError(err);
    }
  }

  /** Newest last; for tests and operator inspection. */
  list(limit = 1000): AuditRow[] {
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
