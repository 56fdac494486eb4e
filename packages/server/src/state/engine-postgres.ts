/**
 * The PostgreSQL engine (state/engine.ts's contract) over node-postgres's
 * Pool. A plain statement borrows any pooled connection; a transaction holds
 * one from BEGIN to COMMIT/ROLLBACK, at PostgreSQL's default READ COMMITTED
 * isolation: a row read `FOR UPDATE` stays locked until the end of the
 * transaction, and a second transaction reading it `FOR UPDATE` waits, then
 * sees the first one's committed change. `{lock}` takes
 * `pg_advisory_xact_lock` on the name first.
 *
 * Opening checks that the server flushes every commit before acknowledging
 * it (`SHOW fsync`, `SHOW synchronous_commit`): with either off, a commit the
 * Server acted on (design §6.1: the admission intent before `run.start`
 * leaves) could vanish in a database crash, so the engine refuses to start
 * (StateNotDurableError). Any error meaning "the database cannot be reached"
 * becomes StateUnavailableError (`toStateError`).
 *
 * Column types: BIGINT (what INTEGER becomes, state/schema.ts) is read as a
 * JavaScript number like SQLite's INTEGER, and refused beyond 2^53 instead of
 * rounded; BYTEA reads as a Buffer like SQLite's BLOB.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import pg from "pg";
import {
  checkNotification,
  checkNotifications,
  insideTransaction,
  type SqlParam,
  SqlTexts,
  StateBusyError,
  type StateEngine,
  StateNotDurableError,
  type StateQueries,
  StateUnavailableError,
  StateUsageError,
  type TransactionOptions,
  type TransactionScope,
  transactionFinished,
} from "./engine.js";

/** Connections the pool opens at most, unless the caller says otherwise (`poolSize`). */
export const POSTGRES_POOL_SIZE = 10;
/** Bound on opening a connection, and on waiting for a free pooled one. */
export const POSTGRES_CONNECT_TIMEOUT_MS = 5_000;
/** Bound the server puts on one statement, including its wait for a row lock (statement_timeout). */
export const POSTGRES_STATEMENT_TIMEOUT_MS = 15_000;
/** A transaction left idle this long by a stuck caller is ended by the server, freeing its locks. */
export const POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT_MS = 30_000;
/** An idle pooled connection is closed after this long. */
export const POSTGRES_IDLE_CONNECTION_MS = 30_000;
/** Operations that may wait for a pooled connection when all are in use (beyond that: StateBusyError). */
export const POSTGRES_MAX_WAITING = 1_000;

/** The LISTEN connection, lost, is made again after this long at first, doubling per failed try… */
export const POSTGRES_LISTEN_RETRY_MIN_MS = 100;
/** …up to this long between tries. */
export const POSTGRES_LISTEN_RETRY_MAX_MS = 5_000;

/** PostgreSQL's type oid for int8 (BIGINT), as node-postgres names it. */
const INT8_OID = 20;

/** Node socket errors that mean the server is not there. */
const UNREACHABLE_ERRNO = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EPIPE",
]);
/** SQLSTATEs outside class 08 (connection exception) that mean the same: shut down, starting, full. */
const UNREACHABLE_SQLSTATE = new Set(["57P01", "57P02", "57P03", "53300"]);
/** node-postgres reports a lost or never-made connection by message only. */
const UNREACHABLE_MESSAGE =
  /Connection terminated|timeout exceeded when trying to connect|encountered a connection error|Connection ended/i;

/** Whether `err` (from node-postgres or the socket under it) means the database cannot be reached. */
export function isUnreachable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: unknown }).code;
  if (typeof code === "string") {
    if (UNREACHABLE_ERRNO.has(code) || UNREACHABLE_SQLSTATE.has(code) || code.startsWith("08")) return true;
  }
  if (err instanceof AggregateError && err.errors.some(isUnreachable)) return true;
  return UNREACHABLE_MESSAGE.test(err.message);
}

/**
 * The one mapping from a node-postgres failure to this module's errors: unreachable → StateUnavailableError
 * (naming the cause's code, never the connection URL); anything else is returned as it is.
 */
export function toStateError(err: unknown, options: { duringCommit?: boolean } = {}): unknown {
  if (err instanceof StateUnavailableError || !isUnreachable(err)) return err;
  const code = (err as { code?: unknown }).code;
  const what = typeof code === "string" ? code : (err as Error).message;
  return new StateUnavailableError(
    `the PostgreSQL state database is unreachable (${what})` +
      (options.duringCommit === true ? "; the connection was lost during COMMIT, so its outcome is unknown" : ""),
    { cause: err, commitOutcomeUnknown: options.duringCommit === true },
  );
}

export interface PostgresEngineOptions {
  /** A libpq connection URL (postgres://user:password@host:port/database?…). Never logged. */
  url: string;
  /** Connections the pool opens at most (default POSTGRES_POOL_SIZE). */
  poolSize?: number;
}

/** Read BIGINT as a number, refusing (not rounding) a value beyond Number.MAX_SAFE_INTEGER. */
function parseInt8(text: string): number {
  const value = Number(text);
  if (!Number.isSafeInteger(value)) {
    throw new StateUsageError(`a BIGINT value (${text}) is beyond what a JavaScript number holds exactly`);
  }
  return value;
}

const TYPES: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: "text" | "binary") =>
    oid === INT8_OID && format !== "binary"
      ? parseInt8
      : pg.types.getTypeParser(oid, format ?? "text")) as pg.CustomTypesConfig["getTypeParser"],
};

/**
 * Connect to the database at `options.url`, check that it is durable, and return the engine.
 * Throws StateUnavailableError when it cannot be reached, StateNotDurableError when fsync or
 * synchronous_commit is off, StateUsageError for a URL that does not parse.
 */
export async function openPostgresEngine(options: PostgresEngineOptions): Promise<PostgresEngine> {
  // Parse here so that an error never carries the URL (and its password) as node's URL errors do.
  if (!URL.canParse(options.url) || !/^postgres(ql)?:$/.test(new URL(options.url).protocol)) {
    throw new StateUsageError("the PostgreSQL state URL does not parse as postgres://user@host:port/database");
  }
  const poolSize = options.poolSize ?? POSTGRES_POOL_SIZE;
  if (!Number.isInteger(poolSize) || poolSize < 1) {
    throw new StateUsageError(`poolSize must be a positive integer (got ${String(poolSize)})`);
  }
  const pool = new pg.Pool({
    connectionString: options.url,
    max: poolSize,
    connectionTimeoutMillis: POSTGRES_CONNECT_TIMEOUT_MS,
    idleTimeoutMillis: POSTGRES_IDLE_CONNECTION_MS,
    statement_timeout: POSTGRES_STATEMENT_TIMEOUT_MS,
    idle_in_transaction_session_timeout: POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    application_name: "webcodex-server",
    keepAlive: true,
    types: TYPES,
  });
  // An idle pooled connection that the server closes (restart, failover) is dropped by the pool; the
  // next operation opens a new one or fails with StateUnavailableError. Without a listener this
  // event would crash the process.
  pool.on("error", () => undefined);
  const engine = new PostgresEngine(pool, options.url);
  try {
    await engine.checkDurable();
  } catch (err) {
    await pool.end().catch(() => undefined);
    throw err;
  }
  return engine;
}

function asError(err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err));
}

type PgQueryConfig = pg.QueryConfig<SqlParam[]> & { queryMode: "extended" };

/** Rows a `run` reports as changed: only what a write command touched (a SELECT's rowCount is its rows). */
const WRITE_COMMANDS = new Set(["INSERT", "UPDATE", "DELETE", "MERGE"]);

export class PostgresEngine implements StateEngine {
  readonly dialect = "postgres";
  readonly #pool: pg.Pool;
  readonly #texts = new SqlTexts();
  readonly #scope = new AsyncLocalStorage<TransactionScope>();
  /** The database URL, for the LISTEN connection (outside the pool: it holds its session). */
  readonly #url: string | undefined;
  readonly #listeners = new Map<string, Set<(payload: string | null) => void>>();
  /** The LISTEN connection while it is up; `#listening` while it is being made. */
  #listenClient: pg.Client | null = null;
  #listening: Promise<void> | null = null;
  #listenRetryMs = POSTGRES_LISTEN_RETRY_MIN_MS;
  #listenTimer: NodeJS.Timeout | null = null;
  #closed = false;

  constructor(pool: pg.Pool, url?: string) {
    this.#pool = pool;
    this.#url = url;
  }

  /**
   * LISTEN on one dedicated connection (not pooled: LISTEN belongs to its session). A lost connection is
   * made again with a doubling delay (POSTGRES_LISTEN_RETRY_MIN_MS … _MAX_MS), every channel listened to
   * again, and every listener told `null` (what was notified meanwhile is gone). The first LISTEN of a
   * channel throws StateUnavailableError when the database cannot be reached.
   */
  async listen(channel: string, onNotify: (payload: string | null) => void): Promise<() => void> {
    checkNotification(channel);
    if (this.#url === undefined)
      throw new StateUsageError("this PostgreSQL engine was opened without its URL; it cannot LISTEN");
    let set = this.#listeners.get(channel);
    const fresh = set === undefined;
    if (set === undefined) {
      set = new Set();
      this.#listeners.set(channel, set);
    }
    set.add(onNotify);
    try {
      await this.#connectListener();
      if (fresh && this.#listenClient !== null) await this.#listenClient.query(`LISTEN ${channel}`);
    } catch (err) {
      set.delete(onNotify);
      if (set.size === 0) this.#listeners.delete(channel);
      throw toStateError(err);
    }
    const listeners = set;
    return () => {
      listeners.delete(onNotify);
    };
  }

  async notify(channel: string, payload: string): Promise<void> {
    checkNotification(channel, payload);
    await this.#run(this.#pool, "SELECT pg_notify(?, ?)", [channel, payload]);
  }

  async notifyAll(channel: string, payloads: readonly string[]): Promise<void> {
    checkNotifications(channel, payloads);
    if (payloads.length === 0) return;
    if (payloads.length === 1) {
      await this.notify(channel, payloads[0] as string);
      return;
    }
    // One statement: the payloads as one text, split back into rows in their order.
    await this.#run(
      this.#pool,
      "SELECT pg_notify(?, p) FROM unnest(string_to_array(?, chr(10))) WITH ORDINALITY AS t(p, n) ORDER BY n",
      [channel, payloads.join("\n")],
    );
  }

  /** Make the LISTEN connection (once at a time) and LISTEN on every channel that has listeners. */
  #connectListener(): Promise<void> {
    if (this.#listenClient !== null) return Promise.resolve();
    this.#listening ??= (async () => {
      const client = new pg.Client({
        connectionString: this.#url,
        connectionTimeoutMillis: POSTGRES_CONNECT_TIMEOUT_MS,
        application_name: "webcodex-server-listen",
        keepAlive: true,
      });
      client.on("error", () => undefined); // the "end" below takes it
      try {
        await client.connect();
        for (const channel of this.#listeners.keys()) await client.query(`LISTEN ${channel}`);
      } catch (err) {
        await client.end().catch(() => undefined);
        throw err;
      }
      client.on("notification", (msg) => {
        for (const cb of [...(this.#listeners.get(msg.channel) ?? [])]) cb(msg.payload ?? "");
      });
      client.on("end", () => {
        if (this.#listenClient !== client) return;
        this.#listenClient = null;
        this.#retryListener();
      });
      this.#listenClient = client;
      this.#listenRetryMs = POSTGRES_LISTEN_RETRY_MIN_MS;
    })().finally(() => {
      this.#listening = null;
    });
    return this.#listening;
  }

  #retryListener(): void {
    if (this.#closed || this.#listenTimer !== null || this.#listeners.size === 0) return;
    const delay = this.#listenRetryMs;
    this.#listenRetryMs = Math.min(delay * 2, POSTGRES_LISTEN_RETRY_MAX_MS);
    this.#listenTimer = setTimeout(() => {
      this.#listenTimer = null;
      this.#connectListener().then(
        () => {
          for (const set of this.#listeners.values()) for (const cb of [...set]) cb(null);
        },
        () => this.#retryListener(),
      );
    }, delay);
    this.#listenTimer.unref();
  }

  /** Refuse a server that acknowledges commits before flushing them (see the header). */
  async checkDurable(): Promise<void> {
    for (const setting of ["fsync", "synchronous_commit"] as const) {
      const row = await this.get<Record<string, string>>(`SHOW ${setting}`);
      const value = row?.[setting];
      if (value === "off") {
        throw new StateNotDurableError(
          `the PostgreSQL state database has ${setting} = off, so a commit could be lost after it was ` +
            `acknowledged; set ${setting} = on (the default) for this server, database or role`,
        );
      }
    }
  }

  async all<T>(sql: string, params: readonly SqlParam[] = []): Promise<T[]> {
    this.#refuseInside("all");
    return await this.#rows<T>(this.#pool, sql, params, "all");
  }

  async get<T>(sql: string, params: readonly SqlParam[] = []): Promise<T | undefined> {
    this.#refuseInside("get");
    return (await this.#rows<T>(this.#pool, sql, params, "get"))[0];
  }

  async run(sql: string, params: readonly SqlParam[] = []): Promise<{ changes: number }> {
    this.#refuseInside("run");
    return await this.#run(this.#pool, sql, params);
  }

  async exec(sql: string): Promise<void> {
    this.#refuseInside("exec");
    await this.#exec(this.#pool, sql);
  }

  async transaction<T>(fn: (tx: StateQueries) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    this.#refuseInside("transaction");
    this.#refuseWhenQueueFull();
    let client: pg.PoolClient;
    try {
      client = await this.#pool.connect();
    } catch (err) {
      throw toStateError(err);
    }
    // A checked-out connection that the server closes emits "error" with no pool listener to take it
    // (that would crash the process); the next statement on it fails and is mapped below.
    const onConnectionError = (): void => undefined;
    client.on("error", onConnectionError);
    const scope: TransactionScope = { open: true };
    const use = async <R>(work: () => Promise<R>): Promise<R> => {
      if (!scope.open) throw transactionFinished();
      return await work();
    };
    const tx: StateQueries = {
      all: <R>(sql: string, params: readonly SqlParam[] = []) => use(() => this.#rows<R>(client, sql, params, "all")),
      get: <R>(sql: string, params: readonly SqlParam[] = []) =>
        use(async () => (await this.#rows<R>(client, sql, params, "get"))[0]),
      run: (sql, params = []) => use(() => this.#run(client, sql, params)),
      exec: (sql) => use(() => this.#exec(client, sql)),
    };
    /** Set when the connection must not go back to the pool (lost, or in an unknown state). */
    let broken: Error | undefined;
    let committing = false;
    try {
      await client.query("BEGIN");
      if (options.lock !== undefined) {
        await this.#rows(client, "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", [options.lock], "all");
      }
      const result = await this.#scope.run(scope, () => fn(tx));
      scope.open = false;
      committing = true;
      const committed = await client.query("COMMIT");
      // PostgreSQL answers COMMIT of a transaction that a failed statement aborted with ROLLBACK.
      if (committed.command !== "COMMIT") {
        throw new StateUsageError(
          "the transaction was rolled back: a statement inside it failed and its error was caught; " +
            "on PostgreSQL a failed statement ends the transaction",
        );
      }
      return result;
    } catch (err) {
      scope.open = false;
      if (committing) {
        // COMMIT either ended the transaction or lost the connection while in flight.
        if (isUnreachable(err)) broken = asError(err);
        throw toStateError(err, { duringCommit: isUnreachable(err) });
      }
      try {
        await client.query("ROLLBACK");
      } catch (rollbackError) {
        broken = asError(rollbackError);
      }
      throw toStateError(err);
    } finally {
      scope.open = false;
      client.off("error", onConnectionError);
      client.release(broken);
    }
  }

  /** Other instances write all the time: nothing to tell (state/engine.ts). */
  async writesElsewhere(): Promise<number | null> {
    return null;
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#listenTimer !== null) clearTimeout(this.#listenTimer);
    const listener = this.#listenClient;
    this.#listenClient = null;
    await listener?.end().catch(() => undefined);
    await this.#pool.end();
  }

  #refuseInside(method: string): void {
    if (this.#scope.getStore()?.open === true) throw insideTransaction(method);
  }

  #refuseWhenQueueFull(): void {
    if (this.#pool.waitingCount >= POSTGRES_MAX_WAITING) {
      throw new StateBusyError(
        `${this.#pool.waitingCount} operations already wait for a PostgreSQL state connection ` +
          `(at most POSTGRES_MAX_WAITING = ${POSTGRES_MAX_WAITING}); refused, retry later`,
      );
    }
  }

  async #query(on: pg.Pool | pg.PoolClient, sql: string, params: readonly SqlParam[]): Promise<pg.QueryResult> {
    const parsed = this.#texts.statement(sql, params);
    if (on === this.#pool) this.#refuseWhenQueueFull();
    // Extended protocol for every statement: one statement per call, as on SQLite.
    const config: PgQueryConfig = { text: parsed.postgres, values: [...params], queryMode: "extended" };
    try {
      return await on.query(config);
    } catch (err) {
      throw toStateError(err);
    }
  }

  async #rows<T>(on: pg.Pool | pg.PoolClient, sql: string, params: readonly SqlParam[], method: string): Promise<T[]> {
    const result = await this.#query(on, sql, params);
    if (result.fields.length === 0) {
      throw new StateUsageError(`${method}() needs a statement that returns rows; use run()`);
    }
    return result.rows as T[];
  }

  async #run(on: pg.Pool | pg.PoolClient, sql: string, params: readonly SqlParam[]): Promise<{ changes: number }> {
    const result = await this.#query(on, sql, params);
    return { changes: WRITE_COMMANDS.has(result.command) ? (result.rowCount ?? 0) : 0 };
  }

  async #exec(on: pg.Pool | pg.PoolClient, sql: string): Promise<void> {
    this.#texts.script(sql);
    if (on === this.#pool) this.#refuseWhenQueueFull();
    try {
      // No parameters: node-postgres sends it as one simple query, which may hold several statements.
      await on.query(sql);
    } catch (err) {
      throw toStateError(err);
    }
  }
}
