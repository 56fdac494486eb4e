/**
 * Both state engines for a test file (state/engine.ts): a throwaway PostgreSQL cluster for the file and, per
 * call, a fresh migrated database opened as `count` Server instances would open it — `count` pools on
 * PostgreSQL; on SQLite one file and its one connection shared by all of them (one Server per SQLite file,
 * state/lock.ts; a second connection in one process would wait for the first's write lock on the event loop).
 * Everything opened is closed after each test.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll } from "vitest";
import {
  POSTGRES_START_TIMEOUT_MS,
  type PostgresCluster,
  startPostgresCluster,
} from "../../../../scripts/test-support/postgres.js";
import type { StateEngine } from "../../src/state/engine.js";
import { openPostgresEngine } from "../../src/state/engine-postgres.js";
import { openSqliteEngine } from "../../src/state/engine-sqlite.js";
import { migrateState } from "../../src/state/schema.js";

export type EngineName = "sqlite" | "postgres";
export const ENGINE_NAMES: readonly { name: EngineName }[] = [{ name: "sqlite" }, { name: "postgres" }];

export interface EngineFixture {
  /** `count` engines on one fresh, migrated database (the same engine `count` times on SQLite). */
  instances(name: EngineName, count: number): Promise<StateEngine[]>;
}

/** Registers the file's hooks (start the cluster, close what each test opened, stop the cluster). */
export function engineFixture(): EngineFixture {
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
  return {
    async instances(name, count) {
      if (name === "sqlite") {
        const dir = mkdtempSync(join(tmpdir(), "wc-engines-"));
        tempDirs.push(dir);
        const file = join(dir, "server.sqlite3");
        const engine = openSqliteEngine(file);
        opened.push(engine);
        await migrateState(engine, file);
        return Array.from({ length: count }, () => engine);
      }
      if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
      const url = await cluster.createDatabase();
      const engines: StateEngine[] = [];
      for (let i = 0; i < count; i++) {
        const engine = await openPostgresEngine({ url });
        opened.push(engine);
        if (i === 0) await migrateState(engine, "the test database");
        engines.push(engine);
      }
      return engines;
    },
  };
}
