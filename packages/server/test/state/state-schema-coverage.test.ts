/**
 * Schema step 10 (state/schema.ts) took over five tables that modules used to
 * create for themselves on SQLite, so that a PostgreSQL database gets them too.
 * A database made before step 10 still holds those self-created tables; step 10
 * (CREATE … IF NOT EXISTS) leaves them as they are. This proves the two
 * definitions describe the same tables (columns with their types, nullability,
 * defaults and keys, and the indexes), so both kinds of database are alike.
 */
import Database from "better-sqlite3";
import { describe, expect, it } from "vitest";
import { MIGRATIONS } from "../../src/state/schema.js";

/** What the modules created for themselves before step 10 (principals/tokens.ts, link/runner-tokens.ts, link/presence.ts, oauth/operator-read.ts, console/sessions.ts). */
const BEFORE_STEP_10 = `
CREATE TABLE IF NOT EXISTS principal_tokens (
  token_hash TEXT PRIMARY KEY,
  token_id TEXT NOT NULL UNIQUE,
  principal_id TEXT NOT NULL,
  scopes TEXT NOT NULL,
  projects TEXT NOT NULL,
  created_at TEXT NOT NULL,
  revoked_at TEXT
);
CREATE TABLE IF NOT EXISTS runner_tokens (
  runner_id TEXT PRIMARY KEY,
  token_hash TEXT NOT NULL,
  rotated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS runner_presence (
  runner_id TEXT PRIMARY KEY,
  online INTEGER NOT NULL,
  since TEXT NOT NULL,
  protocol_version INTEGER,
  agent_instance_id TEXT,
  projects TEXT NOT NULL DEFAULT '[]',
  providers TEXT NOT NULL DEFAULT '[]',
  max_concurrent_runs INTEGER,
  agents_share_runner_user INTEGER,
  seen_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS oauth_operator_clients (
  client_id TEXT PRIMARY KEY,
  provisioned_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS console_sessions (
  session_hash TEXT PRIMARY KEY,
  principal_id TEXT NOT NULL,
  key_id TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  expires_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS console_sessions_principal ON console_sessions (principal_id, created_ms);
`;

const SELF_CREATED = [
  "principal_tokens",
  "runner_tokens",
  "runner_presence",
  "oauth_operator_clients",
  "console_sessions",
] as const;

/** The shape of each table: its columns and its indexes with their columns. */
function shapes(db: Database.Database): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const table of SELF_CREATED) {
    const indexes = db
      .prepare<[string], { name: string; unique: number; origin: string }>(
        'SELECT name, "unique", origin FROM pragma_index_list(?) ORDER BY name',
      )
      .all(table)
      .map((index) => ({
        ...index,
        columns: db
          .prepare<[string], { name: string }>("SELECT name FROM pragma_index_info(?) ORDER BY seqno")
          .all(index.name)
          .map((c) => c.name),
      }));
    out[table] = {
      columns: db
        .prepare('SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info(?) ORDER BY cid')
        .all(table),
      indexes,
    };
  }
  return out;
}

describe("schema step 10 and the tables that created themselves", () => {
  it("describes exactly the tables those modules created for themselves before it", () => {
    const selfCreated = new Database(":memory:");
    for (const m of MIGRATIONS.filter((step) => step.version < 10)) selfCreated.exec(m.sql);
    selfCreated.exec(BEFORE_STEP_10);
    // The steps after 10 change both kinds of database alike (steps 13 and 14 add columns to runner_presence).
    for (const m of MIGRATIONS.filter((step) => step.version > 10)) selfCreated.exec(m.sql);

    const migrated = new Database(":memory:");
    for (const m of MIGRATIONS) migrated.exec(m.sql);

    const expected = shapes(selfCreated);
    expect(Object.keys(expected)).toEqual([...SELF_CREATED]);
    for (const table of SELF_CREATED) {
      expect((expected[table] as { columns: unknown[] }).columns.length, table).toBeGreaterThan(0);
    }
    expect(shapes(migrated)).toEqual(expected);
    selfCreated.close();
    migrated.close();
  });
});
