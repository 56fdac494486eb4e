/**
 * The schema of the Server's state DB (`server.sqlite3`), versioned with
 * `PRAGMA user_version`. Migrations only go forward: each step runs once, in
 * its own transaction together with the version bump, so a crash leaves the
 * database at the old version or the new one, never between. A database
 * from a newer build (a version this build does not know) is refused rather
 * than guessed at.
 *
 * Version 0 is a database made before versioning (or a new, empty one): its
 * tables, if any, are exactly version 1's, which is why step 1 creates them
 * only when they do not exist. A change to an existing table's shape is a new
 * step here, never an edit of an old one. The token and audit tables
 * (`tokens.ts`, `audit.ts`) are additive and create themselves.
 */
import type Database from "better-sqlite3";

interface Migration {
  /** The version the database has after this step. */
  version: number;
  /** What it changes and why, for the log. */
  summary: string;
  sql: string;
}

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    summary: "admission records (the schema before versioning)",
    sql: `
      CREATE TABLE IF NOT EXISTS admission_records (
        run_id TEXT PRIMARY KEY,
        principal_id TEXT NOT NULL,
        project_id TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        runner_id TEXT NOT NULL,
        intent_fingerprint TEXT NOT NULL,
        agent_instance_id TEXT,
        provider_instance_id TEXT,
        store_id TEXT,
        admission TEXT NOT NULL,
        state TEXT NOT NULL,
        execution_state TEXT NOT NULL,
        stop_reason TEXT,
        failure_kind TEXT,
        recovery_kind TEXT NOT NULL,
        message TEXT,
        cancel_forwarded INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      CREATE INDEX IF NOT EXISTS admission_records_runner ON admission_records (runner_id, state);
    `,
  },
  {
    version: 2,
    summary: "index rejected-before-admission records by age, for their expiry",
    sql: `CREATE INDEX admission_records_admission_age ON admission_records (admission, updated_at);`,
  },
];

export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]?.version ?? 0;

export class SchemaVersionError extends Error {
  override readonly name = "SchemaVersionError";
}

/**
 * Bring `db` to SCHEMA_VERSION. Returns the versions it stepped through (empty when it was current).
 * Throws SchemaVersionError for a database newer than this build.
 */
export function migrate(db: Database.Database, file: string): number[] {
  const current = db.pragma("user_version", { simple: true }) as number;
  if (current > SCHEMA_VERSION) {
    throw new SchemaVersionError(
      `${file}: schema version ${current} is newer than this webcodex-server supports (${SCHEMA_VERSION}); ` +
        "run the newer webcodex-server, or restore a backup made by this version",
    );
  }
  const applied: number[] = [];
  for (const m of MIGRATIONS) {
    if (m.version <= current) continue;
    // Re-read under the write lock: another process (a CLI next to the Server) may have just stepped.
    const stepped = db
      .transaction(() => {
        if ((db.pragma("user_version", { simple: true }) as number) >= m.version) return false;
        db.exec(m.sql);
        db.pragma(`user_version = ${m.version}`);
        return true;
      })
      .immediate();
    if (stepped) applied.push(m.version);
  }
  return applied;
}
