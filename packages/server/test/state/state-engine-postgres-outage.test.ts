/**
 * The PostgreSQL state engine when its database goes away and comes back
 * (a real cluster of this file's own, stopped and started again): opening
 * is refused with `state_unavailable`, an open engine fails every operation
 * with the same code and keeps nothing of a transaction the stop cut off,
 * and works again after the restart without being reopened. Also: a server
 * with fsync off is refused at open.
 */
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { IN_PROCESS_WAIT_MS, poll } from "../../../../scripts/test-support/index.js";
import {
  POSTGRES_START_TIMEOUT_MS,
  type PostgresCluster,
  startPostgresCluster,
} from "../../../../scripts/test-support/postgres.js";
import { StateNotDurableError, StateUnavailableError } from "../../src/state/engine.js";
import { openPostgresEngine, type PostgresEngine } from "../../src/state/engine-postgres.js";

let cluster: PostgresCluster | undefined;
const opened: PostgresEngine[] = [];

beforeAll(async () => {
  cluster = await startPostgresCluster();
}, POSTGRES_START_TIMEOUT_MS);

afterEach(async () => {
  for (const engine of opened.splice(0)) await engine.close();
});

afterAll(async () => {
  await cluster?.close();
});

function running(): PostgresCluster {
  if (cluster === undefined) throw new Error("the PostgreSQL cluster did not start");
  return cluster;
}

async function open(url: string): Promise<PostgresEngine> {
  const engine = await openPostgresEngine({ url });
  opened.push(engine);
  return engine;
}

function expectUnavailable(error: unknown, password: string): void {
  expect(error).toBeInstanceOf(StateUnavailableError);
  expect((error as StateUnavailableError).code).toBe("state_unavailable");
  expect((error as StateUnavailableError).commitOutcomeUnknown).toBe(false);
  // The connection URL's password (random, 36 hex characters) never reaches an error message.
  expect((error as Error).message).not.toContain(password);
}

describe("PostgreSQL state engine when the database is unreachable", () => {
  it(
    "refuses to open with state_unavailable while the database is down, and opens once it is back",
    async () => {
      const c = running();
      const url = await c.createDatabase();
      const password = new URL(url).password;
      await c.stop();
      try {
        expectUnavailable(await openPostgresEngine({ url }).catch((err: unknown) => err), password);
      } finally {
        await c.start();
      }
      const engine = await open(url);
      expect(await engine.get("SELECT 1 AS one")).toEqual({ one: 1 });
    },
    POSTGRES_START_TIMEOUT_MS,
  );

  it(
    "fails with state_unavailable while down, keeps nothing of a transaction the stop cut off, and works again after restart",
    async () => {
      const c = running();
      const url = await c.createDatabase();
      const password = new URL(url).password;
      const engine = await open(url);
      await engine.exec("CREATE TABLE items (id TEXT PRIMARY KEY)");
      await engine.run("INSERT INTO items (id) VALUES (?)", ["before"]);

      let inserted!: () => void;
      const insertedOnce = new Promise<void>((resolve) => {
        inserted = resolve;
      });
      let proceed!: () => void;
      const stopped = new Promise<void>((resolve) => {
        proceed = resolve;
      });
      const cutOff = engine
        .transaction(async (tx) => {
          await tx.run("INSERT INTO items (id) VALUES (?)", ["half-1"]);
          inserted();
          await stopped;
          await tx.run("INSERT INTO items (id) VALUES (?)", ["half-2"]);
        })
        .catch((err: unknown) => err);
      await insertedOnce;
      await c.stop();
      try {
        proceed();
        expectUnavailable(await cutOff, password);
        expectUnavailable(await engine.get("SELECT 1 AS one").catch((err: unknown) => err), password);
        expectUnavailable(
          await engine.run("INSERT INTO items (id) VALUES (?)", ["while-down"]).catch((err: unknown) => err),
          password,
        );
        expectUnavailable(
          await engine
            .transaction((tx) => tx.run("INSERT INTO items (id) VALUES (?)", ["while-down"]))
            .catch((err: unknown) => err),
          password,
        );
      } finally {
        await c.start();
      }

      // The same engine, not reopened: nothing half-written, and writes work again.
      expect(await engine.all("SELECT id FROM items ORDER BY id")).toEqual([{ id: "before" }]);
      await engine.transaction((tx) => tx.run("INSERT INTO items (id) VALUES (?)", ["after"]));
      expect(await engine.all("SELECT id FROM items ORDER BY id")).toEqual([{ id: "after" }, { id: "before" }]);
    },
    2 * POSTGRES_START_TIMEOUT_MS,
  );

  it("refuses to open on a server with fsync = off", async () => {
    const c = running();
    const url = await c.createDatabase();
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    const fsyncIn = async (): Promise<string> => {
      const probe = new pg.Client({ connectionString: url });
      await probe.connect();
      try {
        return String((await probe.query("SHOW fsync")).rows[0]?.fsync);
      } finally {
        await probe.end();
      }
    };
    try {
      await admin.query("ALTER SYSTEM SET fsync = off");
      await admin.query("SELECT pg_reload_conf()");
      await poll(async () => (await fsyncIn()) === "off", { timeoutMs: IN_PROCESS_WAIT_MS, what: "fsync = off" });
      const error = await openPostgresEngine({ url }).catch((err: unknown) => err);
      expect(error).toBeInstanceOf(StateNotDurableError);
      expect((error as Error).message).toContain("fsync = off");
    } finally {
      await admin.query("ALTER SYSTEM RESET fsync");
      await admin.query("SELECT pg_reload_conf()");
      await admin.end();
    }
    await poll(async () => (await fsyncIn()) === "on", { timeoutMs: IN_PROCESS_WAIT_MS, what: "fsync = on again" });
    expect(await (await open(url)).get("SELECT 1 AS one")).toEqual({ one: 1 });
  });
});
