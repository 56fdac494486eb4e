/**
 * The state engine contract (state/engine.ts) on both engines: a real SQLite
 * file and a real PostgreSQL database (a throwaway cluster for this file, a
 * fresh database per test). The same cases run against each: atomic commit
 * and rollback, `?` parameters, the one-slot claim race that admission will
 * rely on, and the schema steps (idempotent, a newer version refused). Then
 * what only PostgreSQL has: two instances migrating at once, a server that
 * would lose acknowledged commits refused at open.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  POSTGRES_START_TIMEOUT_MS,
  type PostgresCluster,
  startPostgresCluster,
} from "../../../../scripts/test-support/postgres.js";
import {
  type SqlParam,
  StateBusyError,
  type StateEngine,
  StateNotDurableError,
  type StateQueries,
  StateUsageError,
} from "../../src/state/engine.js";
import { openPostgresEngine, POSTGRES_MAX_WAITING } from "../../src/state/engine-postgres.js";
import { openSqliteEngine, SQLITE_MAX_WAITING } from "../../src/state/engine-sqlite.js";
import {
  MIGRATIONS,
  migrateState,
  SCHEMA_VERSION,
  SchemaVersionError,
  stateSchemaVersion,
  translateToPostgres,
} from "../../src/state/schema.js";

/** Rounds of the claim race per engine: each round is a fresh slot and CLAIMANTS concurrent claimants. */
const CLAIM_ROUNDS = 40;
/** Concurrent claimants per round (within the PostgreSQL pool size, so all of them hold a connection). */
const CLAIMANTS = 8;

let cluster: PostgresCluster | undefined;
const opened: StateEngine[] = [];
const tempDirs: string[] = [];

beforeAll(async () => {
  cluster = await startPostgresCluster();
}, POSTGRES_START_TIMEOUT_MS);

afterEach(async () => {
  for (const engine of opened.splice(0)) await engine.close();
  for (const dir of tempDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

afterAll(async () => {
  await cluster?.close();
});

interface Database {
  /** Open a connection (SQLite) or a pool (PostgreSQL) to this test's database; closed after the test. */
  open(): Promise<StateEngine>;
}

const ENGINES: readonly { name: string; database(): Promise<Database> }[] = [
  {
    name: "sqlite",
    async database() {
      const dir = mkdtempSync(join(tmpdir(), "wc-state-engine-"));
      tempDirs.push(dir);
      const file = join(dir, "server.sqlite3");
      return {
        async open() {
          const engine = openSqliteEngine(file);
          opened.push(engine);
          return engine;
        },
      };
    },
  },
  {
    name: "postgres",
    async database() {
      if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
      const url = await cluster.createDatabase();
      return {
        async open() {
          const engine = await openPostgresEngine({ url });
          opened.push(engine);
          return engine;
        },
      };
    },
  },
];

/** A test table, written in SQLite's dialect as schema steps are, and translated the same way for PostgreSQL. */
async function createTables(engine: StateEngine, sql: string): Promise<void> {
  await engine.exec(engine.dialect === "postgres" ? translateToPostgres(sql, "test table") : sql);
}

async function count(q: StateQueries, table: string): Promise<number> {
  return (await q.get<{ n: number }>(`SELECT COUNT(*) AS n FROM ${table}`))?.n ?? -1;
}

/**
 * One claimant of the single slot `slot`: read it FOR UPDATE, yield so the others run, then take it
 * when it is free. Returns whether this claimant got it.
 */
async function claim(engine: StateEngine, slot: string, claimant: number): Promise<boolean> {
  return await engine.transaction(async (tx) => {
    const row = await tx.get<{ used: number; cap: number }>("SELECT used, cap FROM slots WHERE id = ? FOR UPDATE", [
      slot,
    ]);
    await new Promise((resolve) => setImmediate(resolve));
    if (row === undefined || row.used >= row.cap) return false;
    await tx.run("UPDATE slots SET used = ? WHERE id = ?", [row.used + 1, slot]);
    await tx.run("INSERT INTO claims (slot, claimant) VALUES (?, ?)", [slot, claimant]);
    return true;
  });
}

async function tablesAndColumns(engine: StateEngine): Promise<Record<string, string[]>> {
  const tables =
    engine.dialect === "sqlite"
      ? await engine.all<{ name: string }>(
          "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' ORDER BY name",
        )
      : await engine.all<{ name: string }>(
          "SELECT table_name AS name FROM information_schema.tables " +
            "WHERE table_schema = current_schema() AND table_name <> 'webcodex_schema' ORDER BY table_name",
        );
  const out: Record<string, string[]> = {};
  for (const { name } of tables) {
    const columns =
      engine.dialect === "sqlite"
        ? await engine.all<{ name: string }>("SELECT name FROM pragma_table_info(?) ORDER BY cid", [name])
        : await engine.all<{ name: string }>(
            "SELECT column_name AS name FROM information_schema.columns " +
              "WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
            [name],
          );
    out[name] = columns.map((c) => c.name);
  }
  return out;
}

const layouts: Record<string, Record<string, string[]>> = {};

describe.each(ENGINES)("state engine on $name", ({ name, database }) => {
  async function withItems(): Promise<{ engine: StateEngine; other: StateEngine }> {
    const db = await database();
    const engine = await db.open();
    await createTables(
      engine,
      "CREATE TABLE items (id TEXT PRIMARY KEY, n INTEGER NOT NULL, note TEXT, data BLOB) STRICT;",
    );
    return { engine, other: await db.open() };
  }

  it("commits every write of a transaction together, visible to another connection", async () => {
    const { engine, other } = await withItems();
    const result = await engine.transaction(async (tx) => {
      await tx.run("INSERT INTO items (id, n) VALUES (?, ?)", ["a", 1]);
      await tx.run("INSERT INTO items (id, n) VALUES (?, ?)", ["b", 2]);
      return await tx.run("UPDATE items SET n = n + 10", []);
    });
    expect(result).toEqual({ changes: 2 });
    expect(await other.all("SELECT id, n FROM items ORDER BY id")).toEqual([
      { id: "a", n: 11 },
      { id: "b", n: 12 },
    ]);
  });

  it("rolls back every write when the function throws, and rethrows that error", async () => {
    const { engine, other } = await withItems();
    await engine.run("INSERT INTO items (id, n) VALUES (?, ?)", ["kept", 1]);
    const thrown = new Error("the caller gave up halfway");
    await expect(
      engine.transaction(async (tx) => {
        await tx.run("INSERT INTO items (id, n) VALUES (?, ?)", ["a", 1]);
        await tx.run("UPDATE items SET n = 99 WHERE id = ?", ["kept"]);
        throw thrown;
      }),
    ).rejects.toBe(thrown);
    expect(await other.all("SELECT id, n FROM items")).toEqual([{ id: "kept", n: 1 }]);
    // The connection is usable afterwards.
    await engine.transaction((tx) => tx.run("INSERT INTO items (id, n) VALUES (?, ?)", ["after", 2]));
    expect(await count(other, "items")).toBe(2);
  });

  it("keeps a transaction's uncommitted writes from every other reader, and drops them on rollback", async () => {
    const { engine, other } = await withItems();
    let inserted!: () => void;
    const insertedOnce = new Promise<void>((resolve) => {
      inserted = resolve;
    });
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => {
      finish = resolve;
    });
    const tx = engine.transaction(async (t) => {
      await t.run("INSERT INTO items (id, n) VALUES (?, ?)", ["uncommitted", 1]);
      inserted();
      await finished;
      throw new Error("roll back");
    });
    await insertedOnce;
    const outsideSameEngine = engine.get<{ n: number }>("SELECT COUNT(*) AS n FROM items");
    const outsideOther = await count(other, "items");
    finish();
    await expect(tx).rejects.toThrow("roll back");
    expect((await outsideSameEngine)?.n).toBe(0);
    expect(outsideOther).toBe(0);
  });

  it("passes `?` parameters as values: quotes, `?` and `$1` inside values, NULL, Buffer, big integers", async () => {
    const { engine } = await withItems();
    const tricky = "it's a ? and a $1 and a '' -- not a comment";
    const bytes = Buffer.from([0, 1, 2, 255]);
    const nowMs = 1_764_000_000_123;
    await engine.run("INSERT INTO items (id, n, note, data) VALUES (?, ?, ?, ?)", [tricky, nowMs, null, bytes]);
    await engine.run("INSERT INTO items (id, n, note) VALUES ('lit''eral', -3, 'x')", []);
    const row = await engine.get<{ id: string; n: number; note: string | null; data: Buffer }>(
      "SELECT id, n, note, data FROM items WHERE id = ? AND n > ?",
      [tricky, 0],
    );
    expect(row).toEqual({ id: tricky, n: nowMs, note: null, data: bytes });
    expect(typeof row?.n).toBe("number");
    expect(await engine.get("SELECT id FROM items WHERE id = ? AND note = 'x'", ["lit'eral"])).toEqual({
      id: "lit'eral",
    });
    expect(await engine.all("SELECT id FROM items WHERE n = ?", [BigInt(nowMs)])).toEqual([{ id: tricky }]);
  });

  it("refuses SQL whose `?` would be ambiguous, and a parameter count that does not match", async () => {
    const { engine } = await withItems();
    const refused: [string, SqlParam[], string][] = [
      ["SELECT id FROM items WHERE note = '?' AND id = ?", ["a"], "inside a quoted string"],
      ['SELECT "a?" FROM items WHERE id = ?', ["a"], "inside a quoted string or identifier"],
      ["SELECT id FROM items WHERE id = ? -- why?", ["a"], "inside a comment"],
      ["SELECT id FROM items WHERE id = $1", ["a"], "`$` outside a string"],
      ["SELECT id FROM items WHERE id = ?1", ["a"], "numbered placeholder"],
      ["SELECT id FROM items WHERE id = 'open", [], "unterminated string"],
      ["SELECT id FROM items WHERE id = ? AND n = ?", ["a"], "2 `?` placeholder(s) but 1 parameter(s)"],
      ["SELECT id FROM items WHERE id = ?", [true as unknown as SqlParam], "parameter 1 is a boolean"],
      ["COMMIT", [], "transaction control statements are refused"],
    ];
    for (const [sql, params, why] of refused) {
      const error = await engine.all(sql, params).catch((err: unknown) => err);
      expect(error, sql).toBeInstanceOf(StateUsageError);
      expect((error as StateUsageError).code).toBe("state_usage");
      expect((error as Error).message, sql).toContain(why);
    }
  });

  it("refuses the engine's own methods inside a transaction, and a handle used after its commit", async () => {
    const { engine } = await withItems();
    let leaked: StateQueries | undefined;
    await engine.transaction(async (tx) => {
      leaked = tx;
      await expect(engine.get("SELECT 1 AS one")).rejects.toThrow(/inside a transaction's function/);
      await expect(engine.transaction(async () => 1)).rejects.toThrow(/engine\.transaction\(\) called inside/);
    });
    await expect(leaked?.get("SELECT 1 AS one")).rejects.toThrow(/already committed or rolled back/);
    expect(await engine.get("SELECT 1 AS one")).toEqual({ one: 1 });
  });

  it(`lets exactly one of ${CLAIMANTS} concurrent transactions claim a single slot, ${CLAIM_ROUNDS} rounds in a row`, async () => {
    const db = await database();
    const engine = await db.open();
    await createTables(
      engine,
      "CREATE TABLE slots (id TEXT PRIMARY KEY, cap INTEGER NOT NULL, used INTEGER NOT NULL);" +
        "CREATE TABLE claims (slot TEXT NOT NULL, claimant INTEGER NOT NULL);",
    );
    for (let round = 0; round < CLAIM_ROUNDS; round++) {
      const slot = `slot-${round}`;
      await engine.run("INSERT INTO slots (id, cap, used) VALUES (?, 1, 0)", [slot]);
      const won = await Promise.all(Array.from({ length: CLAIMANTS }, (_, i) => claim(engine, slot, i)));
      expect(won.filter(Boolean), `round ${round}`).toHaveLength(1);
      expect(await engine.get("SELECT used FROM slots WHERE id = ?", [slot])).toEqual({ used: 1 });
      expect(await engine.get("SELECT COUNT(*) AS n FROM claims WHERE slot = ?", [slot])).toEqual({ n: 1 });
    }
  });

  it("migrates a new database to the current version once; a second run steps through nothing", async () => {
    const db = await database();
    const engine = await db.open();
    expect(await migrateState(engine, "test db")).toEqual(MIGRATIONS.map((m) => m.version));
    expect(await stateSchemaVersion(engine)).toBe(SCHEMA_VERSION);
    expect(await migrateState(await db.open(), "test db")).toEqual([]);
    layouts[name] = await tablesAndColumns(engine);
    expect(Object.keys(layouts[name] ?? {})).toContain("admission_records");
  });

  it("refuses a database whose schema is newer than this build, and leaves it as it is", async () => {
    const db = await database();
    const engine = await db.open();
    await migrateState(engine, "test db");
    const newer = SCHEMA_VERSION + 1;
    if (engine.dialect === "sqlite") await engine.exec(`PRAGMA user_version = ${newer}`);
    else await engine.run("UPDATE webcodex_schema SET version = ?", [newer]);
    const error = await migrateState(await db.open(), "test db").catch((err: unknown) => err);
    expect(error).toBeInstanceOf(SchemaVersionError);
    expect((error as Error).message).toContain(`test db: schema version ${newer} is newer`);
    expect(await stateSchemaVersion(engine)).toBe(newer);
  });
});

describe("both engines", () => {
  it("end their migrations with the same tables and the same columns in the same order", () => {
    expect(layouts.sqlite).toBeDefined();
    expect(layouts.postgres).toEqual(layouts.sqlite);
  });
});

describe("SQLite engine only", () => {
  it(`queues at most ${SQLITE_MAX_WAITING} operations behind an open transaction and refuses the next one`, async () => {
    const dir = mkdtempSync(join(tmpdir(), "wc-state-engine-"));
    tempDirs.push(dir);
    const engine = openSqliteEngine(join(dir, "server.sqlite3"));
    opened.push(engine);
    let release!: () => void;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const holder = engine.transaction(async () => await held);
    await new Promise((resolve) => setImmediate(resolve));
    const queued = Array.from({ length: SQLITE_MAX_WAITING }, () => engine.get<{ one: number }>("SELECT 1 AS one"));
    const refused = await engine.get("SELECT 1 AS one").catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(StateBusyError);
    expect((refused as StateBusyError).code).toBe("state_busy");
    expect((refused as Error).message).toContain(`SQLITE_MAX_WAITING = ${SQLITE_MAX_WAITING}`);
    release();
    await holder;
    expect((await Promise.all(queued)).every((row) => row?.one === 1)).toBe(true);
  });
});

describe("PostgreSQL engine only", () => {
  it("two instances migrating one new database at once step through each version exactly once between them", async () => {
    if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
    for (let round = 0; round < 3; round++) {
      const url = await cluster.createDatabase();
      const a = await openPostgresEngine({ url });
      const b = await openPostgresEngine({ url });
      opened.push(a, b);
      const [fromA, fromB] = await Promise.all([migrateState(a, "a"), migrateState(b, "b")]);
      expect(
        [...fromA, ...fromB].sort((x, y) => x - y),
        `round ${round}`,
      ).toEqual(MIGRATIONS.map((m) => m.version));
      expect(await stateSchemaVersion(a)).toBe(SCHEMA_VERSION);
      expect(await a.get("SELECT COUNT(*) AS n FROM webcodex_schema")).toEqual({ n: 1 });
    }
  });

  it(`queues at most ${POSTGRES_MAX_WAITING} operations for a pooled connection and refuses the next one`, async () => {
    if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
    const engine = await openPostgresEngine({ url: await cluster.createDatabase(), poolSize: 1 });
    opened.push(engine);
    let release!: () => void;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    let holding!: () => void;
    const holds = new Promise<void>((resolve) => {
      holding = resolve;
    });
    const holder = engine.transaction(async () => {
      holding();
      await held;
    });
    await holds;
    const queued = Array.from({ length: POSTGRES_MAX_WAITING }, () => engine.get<{ one: number }>("SELECT 1 AS one"));
    const refused = await engine.get("SELECT 1 AS one").catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(StateBusyError);
    expect((refused as StateBusyError).code).toBe("state_busy");
    expect((refused as Error).message).toContain(`POSTGRES_MAX_WAITING = ${POSTGRES_MAX_WAITING}`);
    release();
    await holder;
    expect((await Promise.all(queued)).every((row) => row?.one === 1)).toBe(true);
  });

  it("ends a transaction whose failed statement the caller caught, instead of committing the rest", async () => {
    if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
    const engine = await openPostgresEngine({ url: await cluster.createDatabase() });
    opened.push(engine);
    await engine.exec("CREATE TABLE items (id TEXT PRIMARY KEY)");
    const error = await engine
      .transaction(async (tx) => {
        await tx.run("INSERT INTO items (id) VALUES (?)", ["a"]);
        await tx.run("INSERT INTO items (id) VALUES (?)", ["a"]).catch(() => undefined);
      })
      .catch((err: unknown) => err);
    expect(error).toBeInstanceOf(StateUsageError);
    expect((error as Error).message).toContain("a statement inside it failed");
    expect(await count(engine, "items")).toBe(0);
  });

  it("refuses to open on a database that acknowledges commits before they are flushed (synchronous_commit = off)", async () => {
    if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
    const url = await cluster.createDatabase();
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    try {
      const database = new URL(url).pathname.slice(1);
      await admin.query(`ALTER DATABASE ${admin.escapeIdentifier(database)} SET synchronous_commit = off`);
    } finally {
      await admin.end();
    }
    const error = await openPostgresEngine({ url }).catch((err: unknown) => err);
    expect(error).toBeInstanceOf(StateNotDurableError);
    expect((error as StateNotDurableError).code).toBe("state_not_durable");
    expect((error as Error).message).toContain("synchronous_commit = off");
  });
});
