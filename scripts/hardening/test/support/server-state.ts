/**
 * A read-only snapshot of the Server's durable run state (its SQLite file), to
 * prove that rejected input changed nothing: every table except the audit logs and link liveness (leases, presence).
 */
import Database from "better-sqlite3";

/**
 * Left out of a snapshot: audit tables record that something was asked (they are expected to grow), and
 * `runner_link_leases` and `runner_presence` are link liveness — refreshed on a timer while a Runner is linked,
 * and taken by an accepted hello; compare a runner's holder with `leaseHolder`.
 */
const AUDIT_TABLES = new Set([
  "mcp_audit",
  "runner_link_audit",
  "oauth_audit",
  "runner_link_leases",
  "runner_presence",
]);

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

/** Names of the tables whose rows differ between two snapshots, each with its first differing row (for messages). */
export function changedTables(a: Record<string, unknown[]>, b: Record<string, unknown[]>): string[] {
  const out: string[] = [];
  for (const table of new Set([...Object.keys(a), ...Object.keys(b)])) {
    const x = JSON.stringify(a[table] ?? null);
    const y = JSON.stringify(b[table] ?? null);
    if (x !== y) {
      const ra = a[table] ?? [];
      const rb = b[table] ?? [];
      const i = ra.findIndex((r, k) => JSON.stringify(r) !== JSON.stringify(rb[k]));
      const at = i === -1 ? ra.length : i;
      out.push(`${table}: ${JSON.stringify(ra[at] ?? null)} → ${JSON.stringify(rb[at] ?? null)}`.slice(0, 600));
    }
  }
  return out;
}

/** The sha256 of the resume secret a runner's written-down link lease was given (who holds it), or null. */
export function leaseHolder(dbFile: string, runnerId: string): string | null {
  const db = new Database(dbFile, { readonly: true, fileMustExist: true });
  try {
    const row = db.prepare("select secret_hash from runner_link_leases where runner_id = ?").get(runnerId) as
      | { secret_hash: string }
      | undefined;
    return row?.secret_hash ?? null;
  } finally {
    db.close();
  }
}

const TERMINAL_RUN_STATES = ["completed", "failed", "cancelled", "lost"];

/**
 * Whether a run's durable effects have settled: its admission record is terminal and, when a workflow session
 * records it, the session's terminal evidence entry is written (both land after the call that started it).
 */
export function runSettled(dbFile: string, runId: string): boolean {
  const db = new Database(dbFile, { readonly: true, fileMustExist: true });
  try {
    const rec = db.prepare("select state from admission_records where run_id = ?").get(runId) as
      | { state: string }
      | undefined;
    if (!rec || !TERMINAL_RUN_STATES.includes(rec.state)) return false;
    const link = db.prepare("select terminal_recorded from workflow_session_runs where run_id = ?").get(runId) as
      | { terminal_recorded: number }
      | undefined;
    return link === undefined || link.terminal_recorded === 1;
  } finally {
    db.close();
  }
}
