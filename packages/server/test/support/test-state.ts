/**
 * A Server's state for a unit test, on the engine of the pass that runs it: the SQLite file in a temp state
 * dir (the main pass), or — when the PostgreSQL pass (scripts/vitest/postgres-pass.ts) set
 * TEST_POSTGRES_ADMIN_URL_ENV — a fresh database of its own in that pass's cluster. Either way opened as the
 * Server opens it (`StateStore`, migrated, with its secret), read through the engine with `?` placeholders.
 * Everything opened is closed, and every temp dir removed, after each test.
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach } from "vitest";
import type { SqlParam, StateDialect, StateEngine } from "../../src/state/engine.js";
import { openSqliteEngine } from "../../src/state/engine-sqlite.js";
import { openPostgresState } from "../../src/state/open.js";
import { STATE_DB_FILE, StateStore } from "../../src/state/store.js";
import { stateText } from "./in-process.js";
import { STATE_URL_ENV, TEST_POSTGRES_ADMIN_URL_ENV } from "./proc-stack.js";

/** The engine this pass keeps the state on. */
export const TEST_STATE_DIALECT: StateDialect = process.env[TEST_POSTGRES_ADMIN_URL_ENV] ? "postgres" : "sqlite";

export interface TestState {
  readonly dialect: StateDialect;
  /** A temp dir of the test's own; on SQLite the state dir that holds the file. */
  readonly dir: string;
  readonly store: StateStore;
  readonly engine: StateEngine;
  /** Every row a query returns, on either engine. */
  rows<T>(sql: string, params?: readonly SqlParam[]): Promise<T[]>;
  /** Everything the state holds, as text to search for what must not be there (in-process.ts `stateText`). */
  text(): Promise<string>;
  /**
   * Another connection to the same database, as another process (the token CLI) or Server instance opens
   * it: a second SQLite connection to the file, or a second pool on the PostgreSQL database. Closed after
   * the test.
   */
  another(): Promise<StateEngine>;
}

/** What a Server config needs to keep its state where this pass keeps it. */
export interface TestServerState {
  /** Keys for `[server]`: none (SQLite in the state dir) or `state = { backend = "postgres", url_env }`. */
  readonly server: Record<string, unknown>;
  /** The environment the Server is started with (holds the database URL on PostgreSQL). */
  readonly env: NodeJS.ProcessEnv;
}

const closers: (() => Promise<void>)[] = [];
const tempDirs: string[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
  for (const dir of tempDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "wc-test-state-"));
  tempDirs.push(dir);
  return dir;
}

/** A fresh database in the PostgreSQL pass's cluster, or undefined in the SQLite pass. */
async function freshDatabase(): Promise<string | undefined> {
  const admin = process.env[TEST_POSTGRES_ADMIN_URL_ENV];
  if (!admin) return undefined;
  const { createDatabaseAt } = await import("../../../../scripts/test-support/postgres.js");
  return await createDatabaseAt(admin);
}

/**
 * A fresh, migrated state of the test's own (closed after the test). `sqlite`: on a SQLite file in either
 * pass, for a case that checks what only SQLite has (its file, its PRAGMAs, its statement cache).
 */
export async function openTestState(options: { sqlite?: boolean } = {}): Promise<TestState> {
  const dir = tempDir();
  const url = options.sqlite === true ? undefined : await freshDatabase();
  const store = url === undefined ? new StateStore(dir) : await openPostgresState(url);
  closers.push(() => store.close());
  const engine = store.engine;
  return {
    dialect: engine.dialect,
    dir,
    store,
    engine,
    rows: (sql, params = []) => engine.all(sql, params),
    text: () => stateText(store, dir),
    async another() {
      let other: StateEngine;
      if (url === undefined) {
        other = openSqliteEngine(join(dir, STATE_DB_FILE));
      } else {
        const { openPostgresEngine } = await import("../../src/state/engine-postgres.js");
        other = await openPostgresEngine({ url });
      }
      closers.push(() => other.close());
      return other;
    },
  };
}

/**
 * Where a Server started with `startServer` keeps its state in this pass: nothing to add on SQLite (the
 * state dir's file); on PostgreSQL a fresh database, named by a variable of the Server's environment.
 */
export async function testServerState(): Promise<TestServerState> {
  const url = await freshDatabase();
  if (url === undefined) return { server: {}, env: {} };
  const env = `${STATE_URL_ENV}_${randomBytes(6).toString("hex").toUpperCase()}`;
  return { server: { state: { backend: "postgres", url_env: env } }, env: { [env]: url } };
}
