/**
 * Schema step 10 (state/schema.ts) takes over the tables that five modules
 * created for themselves on SQLite, so that a PostgreSQL database gets them
 * too. For the modules not yet ported to the engine, both definitions exist:
 * this proves they describe the same tables (columns with their types,
 * nullability, defaults and keys, and the indexes), whichever ran first.
 * (principal_tokens, runner_tokens and runner_presence are ported: step 10
 * alone creates them.)
 */
import Database from "better-sqlite3";
import { describe, expect, it } from "vitest";
import { ConsoleSessions } from "../src/console/sessions.js";
import { OperatorReadClients } from "../src/oauth/operator-read.js";
import { OAuthStore } from "../src/oauth/store.js";
import { MIGRATIONS, migrate } from "../src/state/schema.js";

const SELF_CREATED = ["oauth_operator_clients", "console_sessions"] as const;

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

describe("schema step 10 and the tables that create themselves", () => {
  it("describes exactly the tables those modules create for themselves", () => {
    const selfCreated = new Database(":memory:");
    for (const m of MIGRATIONS.filter((step) => step.version < 10)) selfCreated.exec(m.sql);
    new OperatorReadClients(new OAuthStore(selfCreated));
    new ConsoleSessions(selfCreated);

    const migrated = new Database(":memory:");
    migrate(migrated, ":memory:");

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
