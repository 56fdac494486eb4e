/**
 * A read-only snapshot of the Server's durable run state (its SQLite file), to
 * prove that rejected input changed nothing: every table except the audit logs.
 */
import Database from "better-sqlite3";

/** Audit tables record that something was asked; they are allowed (expected) to grow. */
const AUDIT_TABLES = new Set(["mcp_audit", "runner_link_audit", "oauth_audit"]);

export function stateSnapshot(dbFile: string): Record<string, unknown[]> {
  const db = new Database(dbFile, { readonly: true, fileMustExist: true });
  try {
    const tables = db
      .prepare("select name from sqlite_master where type = 'table' and name not like 'sqlite_%' order by name")
      .all() as Array<{ name: string }>;
    const out: Record<string, unknown[]> = {};
    for (const { name } of tables) {
      if (AUDIT_TABLES.has(name)) continue;
      out[name] = db.prepare(`select * from "${name}" order by rowid`).all();
    }
    return out;
  } finally {
    db.close();
  }
}

export function auditRows(dbFile: string, table: string, where = "1 = 1"): Array<Record<string, unknown>> {
  const db = new Database(dbFile, { readonly: true, fileMustExist: true });
  try {
    return db.prepare(`select * from "${table}" where ${where} order by id`).all() as Array<Record<string, unknown>>;
  } finally {
    db.close();
  }
}
