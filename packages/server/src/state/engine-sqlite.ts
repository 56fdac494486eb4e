/**
 * The SQLite engine (state/engine.ts's contract) over one better-sqlite3
 * connection. better-sqlite3 is synchronous, so a single statement never
 * interleaves with anything; a transaction, whose function awaits, holds the
 * connection from BEGIN IMMEDIATE to COMMIT, and every other use of the
 * connection — another transaction or a plain statement — waits its turn in
 * a FIFO queue of at most SQLITE_MAX_WAITING operations (beyond that:
 * StateBusyError). BEGIN IMMEDIATE takes the database's write lock at once,
 * so another process on the same file (a CLI command next to the Server)
 * waits up to SQLITE_BUSY_TIMEOUT_MS instead of failing halfway through.
 *
 * Transactions therefore run one at a time: a decision read and written in
 * one transaction is atomic without row locks, so a trailing `FOR UPDATE`
 * (which SQLite does not parse) is dropped, and `{lock}` has nothing to add.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import Database from "better-sqlite3";
import {
  checkNotification,
  checkNotifications,
  insideTransaction,
  type SqlParam,
  SqlTexts,
  StateBusyError,
  type StateEngine,
  type StateQueries,
  StateUsageError,
  type TransactionOptions,
  type TransactionScope,
  transactionFinished,
} from "./engine.js";

/** Operations (transactions or statements) that may wait for the connection while a transaction holds it. */
export const SQLITE_MAX_WAITING = 1_000;
/** How long a write waits for another process's write lock on the same file (PRAGMA busy_timeout). */
export const SQLITE_BUSY_TIMEOUT_MS = 5_000;
/** Prepared statements kept per connection (a store's SQL is a fixed set of strings). */
export const SQLITE_STATEMENT_CACHE_ENTRIES = 256;

/** SQLite `synchronous = NORMAL`: a `relaxed` transaction's commit level (TransactionOptions.durability). */
const SYNCHRONOUS_NORMAL = 1;
/** SQLite `synchronous = FULL`: every commit is fsynced before it returns (design §6.1). */
const SYNCHRONOUS_FULL = 2;

const TRAILING_FOR_UPDATE = /\s+FOR\s+UPDATE\s*;?\s*$/i;

/** Open `file` (created if missing) in WAL mode with FULL commits, as the Server's state DB is opened. */
export function openSqliteEngine(file: string): SqliteEngine {
  const db = new Database(file);
  try {
    db.pragma("journal_mode = WAL");
    db.pragma(`synchronous = ${SYNCHRONOUS_FULL}`);
    db.pragma(`busy_timeout = ${SQLITE_BUSY_TIMEOUT_MS}`);
  } catch (err) {
    db.close();
    throw err;
  }
  return new SqliteEngine(db);
}

export class SqliteEngine implements StateEngine {
  readonly dialect = "sqlite";
  readonly #db: Database.Database;
  readonly #texts = new SqlTexts();
  readonly #statements = new Map<string, Database.Statement>();
  readonly #scope = new AsyncLocalStorage<TransactionScope>();
  /** Whether a transaction holds the connection; waiters are resumed in order, each handed the connection. */
  #held = false;
  readonly #waiters: (() => void)[] = [];
  readonly #dataVersion: Database.Statement;

  /** Wrap an open connection (its pragmas are the caller's; see openSqliteEngine). */
  constructor(db: Database.Database) {
    this.#db = db;
    this.#dataVersion = db.prepare("PRAGMA data_version").pluck();
  }

  /** Operations waiting for the connection right now. */
  get waiting(): number {
    return this.#waiters.length;
  }

  async all<T>(sql: string, params: readonly SqlParam[] = []): Promise<T[]> {
    return await this.#outside("all", () => this.#all<T>(sql, params));
  }

  async get<T>(sql: string, params: readonly SqlParam[] = []): Promise<T | undefined> {
    return await this.#outside("get", () => this.#get<T>(sql, params));
  }

  async run(sql: string, params: readonly SqlParam[] = []): Promise<{ changes: number }> {
    return await this.#outside("run", () => this.#run(sql, params));
  }

  async exec(sql: string): Promise<void> {
    await this.#outside("exec", () => this.#exec(sql));
  }

  async transaction<T>(fn: (tx: StateQueries) => Promise<T>, options: TransactionOptions = {}): Promise<T> {
    this.#refuseInside("transaction");
    await this.#acquire();
    const scope: TransactionScope = { open: true };
    const use = <R>(work: () => R): Promise<R> => {
      if (!scope.open) return Promise.reject(transactionFinished());
      try {
        return Promise.resolve(work());
      } catch (err) {
        return Promise.reject(err);
      }
    };
    const tx: StateQueries = {
      all: <R>(sql: string, params: readonly SqlParam[] = []) => use(() => this.#all<R>(sql, params)),
      get: <R>(sql: string, params: readonly SqlParam[] = []) => use(() => this.#get<R>(sql, params)),
      run: (sql, params = []) => use(() => this.#run(sql, params)),
      exec: (sql) => use(() => this.#exec(sql)),
    };
    // SQLite refuses to change the level inside a transaction: set it around BEGIN…COMMIT, while this
    // transaction holds the connection, so no other operation of this engine commits under it.
    let level: number | null = null;
    try {
      if (options.durability === "relaxed") level = this.#relax();
      this.#db.exec("BEGIN IMMEDIATE");
      let result: T;
      try {
        result = await this.#scope.run(scope, () => fn(tx));
        scope.open = false;
        this.#db.exec("COMMIT");
      } catch (err) {
        scope.open = false;
        if (this.#db.inTransaction) this.#db.exec("ROLLBACK");
        throw err;
      }
      return result;
    } finally {
      scope.open = false;
      try {
        if (level !== null) this.#db.pragma(`synchronous = ${level}`);
      } finally {
        this.#release();
      }
    }
  }

  /** Lower the connection to synchronous = NORMAL; returns the level to restore, or null when it was not higher. */
  #relax(): number | null {
    const level = this.#db.pragma("synchronous", { simple: true }) as number;
    if (level <= SYNCHRONOUS_NORMAL) return null;
    this.#db.pragma(`synchronous = ${SYNCHRONOUS_NORMAL}`);
    return level;
  }

  /** One Server per SQLite state: nobody else to hear from (state/engine.ts). */
  async listen(channel: string, _onNotify: (payload: string | null) => void): Promise<() => void> {
    checkNotification(channel);
    return () => undefined;
  }

  async notify(channel: string, payload: string): Promise<void> {
    checkNotification(channel, payload);
  }

  async notifyAll(channel: string, payloads: readonly string[]): Promise<void> {
    checkNotifications(channel, payloads);
  }

  async writesElsewhere(): Promise<number | null> {
    return await this.#outside("writesElsewhere", () => this.#dataVersion.get() as number);
  }

  async close(): Promise<void> {
    this.#statements.clear();
    if (this.#db.open) this.#db.close();
  }

  /** Run a single statement outside any transaction: at once when the connection is free, else in turn. */
  async #outside<R>(method: string, work: () => R): Promise<R> {
    this.#refuseInside(method);
    if (!this.#held) return work();
    await this.#acquire();
    try {
      return work();
    } finally {
      this.#release();
    }
  }

  #refuseInside(method: string): void {
    if (this.#scope.getStore()?.open === true) throw insideTransaction(method);
  }

  async #acquire(): Promise<void> {
    if (!this.#held) {
      this.#held = true;
      return;
    }
    if (this.#waiters.length >= SQLITE_MAX_WAITING) {
      throw new StateBusyError(
        `${this.#waiters.length} operations already wait for the SQLite state connection ` +
          `(at most SQLITE_MAX_WAITING = ${SQLITE_MAX_WAITING}); refused, retry later`,
      );
    }
    await new Promise<void>((resolve) => this.#waiters.push(resolve));
  }

  #release(): void {
    const next = this.#waiters.shift();
    if (next === undefined) this.#held = false;
    else next();
  }

  #statement(sql: string, params: readonly SqlParam[]): Database.Statement {
    this.#texts.statement(sql, params);
    let statement = this.#statements.get(sql);
    if (statement === undefined) {
      statement = this.#db.prepare(sql.replace(TRAILING_FOR_UPDATE, ""));
      if (this.#statements.size >= SQLITE_STATEMENT_CACHE_ENTRIES) {
        const oldest = this.#statements.keys().next().value;
        if (oldest !== undefined) this.#statements.delete(oldest);
      }
      this.#statements.set(sql, statement);
    }
    return statement;
  }

  #all<T>(sql: string, params: readonly SqlParam[]): T[] {
    const statement = this.#statement(sql, params);
    if (!statement.reader) throw new StateUsageError("all() needs a statement that returns rows; use run()");
    return statement.all(...params) as T[];
  }

  #get<T>(sql: string, params: readonly SqlParam[]): T | undefined {
    const statement = this.#statement(sql, params);
    if (!statement.reader) throw new StateUsageError("get() needs a statement that returns rows; use run()");
    return statement.get(...params) as T | undefined;
  }

  #run(sql: string, params: readonly SqlParam[]): { changes: number } {
    return { changes: this.#statement(sql, params).run(...params).changes };
  }

  #exec(sql: string): void {
    this.#texts.script(sql);
    this.#db.exec(sql);
  }
}
