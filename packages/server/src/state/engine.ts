/**
 * One asynchronous interface to the Server's state database, with two
 * engines behind it: SQLite (engine-sqlite.ts, the embedded default) and
 * PostgreSQL (engine-postgres.ts, shared by several Server instances).
 *
 * Contract, the same on both engines:
 * - SQL is written once, with `?` placeholders and an array of parameters
 *   (string, number, bigint, Buffer or null; booleans are stored as 0/1).
 *   The PostgreSQL engine rewrites `?` to `$1…$n` (`parseSql` below).
 * - `all`/`get` are for statements that return rows, `run` for those that
 *   do not (it returns how many rows changed); each takes one statement.
 *   `exec` runs a script of statements without parameters (schema steps).
 * - `transaction(fn)` runs `fn` with a handle that has the same methods;
 *   the transaction commits when `fn` resolves and rolls back when it
 *   throws. Inside `fn`, use only that handle: the engine's own methods (and
 *   a nested `transaction`) are refused there, because they would run
 *   outside the transaction (PostgreSQL) or wait for it forever (SQLite).
 *   Transaction control statements (BEGIN, COMMIT, SAVEPOINT…) are refused.
 * - A statement that fails inside a transaction ends it on PostgreSQL (every
 *   later statement fails); do not catch such an error and continue — write
 *   the statement so it cannot fail (e.g. `INSERT … ON CONFLICT DO NOTHING`).
 *   A transaction whose COMMIT the server turned into a rollback throws.
 * - Atomic decisions ("claim one slot") read the deciding row with
 *   `SELECT … FOR UPDATE` inside the transaction. PostgreSQL locks that row
 *   until commit, so a concurrent claimant waits and then reads the updated
 *   row; SQLite runs one transaction at a time (BEGIN IMMEDIATE, and an
 *   in-process queue), so the clause is dropped there and the effect is the
 *   same. When the deciding row may not exist yet, pass `{lock: name}`: the
 *   transaction first takes a PostgreSQL advisory lock on that name, held to
 *   commit or rollback (two names may share a lock; that only serialises
 *   more, never less).
 *
 * Errors: `StateUnavailableError` (`state_unavailable`) when the database
 * cannot be reached — a caller refuses the operation with that code and may
 * retry later; nothing of a failed transaction is kept, except that a lost
 * connection during COMMIT leaves the outcome unknown (`commitOutcomeUnknown`).
 * `StateBusyError` (`state_busy`) when too many operations already wait for
 * a connection. `StateNotDurableError` (`state_not_durable`) when a
 * PostgreSQL server would acknowledge commits it has not flushed.
 * `StateUsageError` (`state_usage`) for SQL or calls this contract refuses.
 */

/** A value a statement may be given for a `?`. */
export type SqlParam = string | number | bigint | Buffer | null;

export type StateDialect = "sqlite" | "postgres";

/** What a transaction's function is given; the engine itself has the same methods. */
export interface StateQueries {
  /** Every row the statement returns. */
  all<T>(sql: string, params?: readonly SqlParam[]): Promise<T[]>;
  /** The first row the statement returns, or undefined. */
  get<T>(sql: string, params?: readonly SqlParam[]): Promise<T | undefined>;
  /** Run a statement that returns no rows; `changes` is how many rows it inserted, updated or deleted. */
  run(sql: string, params?: readonly SqlParam[]): Promise<{ changes: number }>;
  /** Run a script of one or more statements without parameters (schema steps). */
  exec(sql: string): Promise<void>;
}

export interface TransactionOptions {
  /**
   * Serialise with every other transaction that names the same lock (a PostgreSQL advisory lock held
   * to commit or rollback). For decisions about a row that may not exist yet. SQLite serialises every
   * transaction anyway.
   */
  lock?: string;
  /**
   * `relaxed`: this commit need not reach the disk before it returns (rows whose loss in a power cut is
   * acceptable, such as MCP audit rows). SQLite commits it under `synchronous = NORMAL` (in WAL mode it
   * survives a crash of the process and reaches the disk with the next FULL commit or checkpoint) and
   * gives the connection back at its own level; PostgreSQL commits it like any other (durable). Default
   * `full`.
   */
  durability?: "full" | "relaxed";
}

export interface StateEngine extends StateQueries {
  readonly dialect: StateDialect;
  transaction<T>(fn: (tx: StateQueries) => Promise<T>, options?: TransactionOptions): Promise<T>;
  /**
   * Cross-instance notifications (PostgreSQL LISTEN/NOTIFY; design §14): `onNotify(payload)` for every
   * `notify` on `channel` by any instance, and `onNotify(null)` after the listening connection was lost and
   * made again (notifications in between are gone: the listener resynchronises what it follows). No-ops on
   * SQLite, where one Server is the only instance. Resolves once listening; the returned function stops.
   */
  listen(channel: string, onNotify: (payload: string | null) => void): Promise<() => void>;
  /** Tell every instance listening on `channel` (delivered after the surrounding commit, if any). */
  notify(channel: string, payload: string): Promise<void>;
  /**
   * `notify` of each payload, in order, in one statement (at most MAX_NOTIFICATIONS_PER_STATEMENT; a
   * payload holds no line break).
   */
  notifyAll(channel: string, payloads: readonly string[]): Promise<void>;
  /**
   * A number that differs from the one before whenever another connection committed a write in between
   * (SQLite's `PRAGMA data_version`: this engine's own commits never change it), so that a cache of rows
   * only other processes write can be kept exactly; null where the engine cannot tell (PostgreSQL, where
   * other instances write all the time: follow what matters with `listen`).
   */
  writesElsewhere(): Promise<number | null>;
  /** Close the connection(s); later calls fail. */
  close(): Promise<void>;
}

/** A notification channel name: a plain lower-case SQL identifier (LISTEN cannot take it as a parameter). */
export const CHANNEL_NAME = /^[a-z_][a-z0-9_]{0,62}$/;
/** A notification payload's bound in bytes (PostgreSQL's own is 8000). */
export const MAX_NOTIFY_PAYLOAD_BYTES = 1024;

/** Refuse a channel name or payload the engines would not carry. */
/** Payloads `notifyAll` sends in one statement at most. */
export const MAX_NOTIFICATIONS_PER_STATEMENT = 256;

/** `notifyAll`'s payloads checked: each as `checkNotification`'s, none with a line break, not too many. */
export function checkNotifications(channel: string, payloads: readonly string[]): void {
  if (payloads.length > MAX_NOTIFICATIONS_PER_STATEMENT) {
    throw new StateUsageError(
      `notifyAll sends at most MAX_NOTIFICATIONS_PER_STATEMENT = ${MAX_NOTIFICATIONS_PER_STATEMENT} payloads`,
    );
  }
  for (const payload of payloads) {
    checkNotification(channel, payload);
    if (payload.includes("\n")) throw new StateUsageError("a notifyAll payload holds no line break");
  }
  if (payloads.length === 0) checkNotification(channel);
}

export function checkNotification(channel: string, payload?: string): void {
  if (!CHANNEL_NAME.test(channel)) {
    throw new StateUsageError(`notification channel ${JSON.stringify(channel)} must match ${CHANNEL_NAME.source}`);
  }
  if (payload !== undefined && Buffer.byteLength(payload, "utf8") > MAX_NOTIFY_PAYLOAD_BYTES) {
    throw new StateUsageError(
      `a notification payload is at most MAX_NOTIFY_PAYLOAD_BYTES = ${MAX_NOTIFY_PAYLOAD_BYTES} bytes`,
    );
  }
}

export type StateErrorCode = "state_unavailable" | "state_busy" | "state_not_durable" | "state_usage";

export class StateError extends Error {
  override readonly name: string = "StateError";
  readonly code: StateErrorCode;

  constructor(code: StateErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** The state database cannot be reached (refused, reset, timed out, shutting down). */
export class StateUnavailableError extends StateError {
  override readonly name = "StateUnavailableError";
  /**
   * True when the connection was lost while COMMIT was in flight: the transaction may or may not have
   * committed. A caller treats the write as possibly done (absence is never proof, design §6.1).
   */
  readonly commitOutcomeUnknown: boolean;

  constructor(message: string, options: { cause?: unknown; commitOutcomeUnknown?: boolean } = {}) {
    super("state_unavailable", message, { cause: options.cause });
    this.commitOutcomeUnknown = options.commitOutcomeUnknown ?? false;
  }
}

/** Too many operations already wait for the database connection(s). */
export class StateBusyError extends StateError {
  override readonly name = "StateBusyError";

  constructor(message: string) {
    super("state_busy", message);
  }
}

/** The PostgreSQL server would acknowledge a commit before it is on disk (fsync or synchronous_commit off). */
export class StateNotDurableError extends StateError {
  override readonly name = "StateNotDurableError";

  constructor(message: string) {
    super("state_not_durable", message);
  }
}

/** SQL or a call that the engine contract refuses (a programming error, never retried). */
export class StateUsageError extends StateError {
  override readonly name = "StateUsageError";

  constructor(message: string) {
    super("state_usage", message);
  }
}

/** Parsed SQL texts kept per engine (the SQL of a store is a fixed set of strings). */
export const PARSED_SQL_CACHE_ENTRIES = 512;

export interface ParsedSql {
  /** The text with `?` replaced by `$1…$n` (PostgreSQL). */
  readonly postgres: string;
  /** How many `?` placeholders it has. */
  readonly placeholders: number;
}

const TRANSACTION_CONTROL = /^\s*(BEGIN|COMMIT|END|ROLLBACK|SAVEPOINT|RELEASE|START\s+TRANSACTION)\b/i;

/**
 * Find the `?` placeholders of `sql`. Kept deliberately simple: `?` is a
 * placeholder only outside quotes and comments, and SQL that could make this
 * reading ambiguous is refused with a StateUsageError: a `?` inside a
 * '…' string, a "…" identifier or a comment (pass the value as a
 * parameter), a `$` outside a string (no `$n` or dollar quoting: write `?`),
 * `?` followed by a digit (numbered placeholders), an unterminated quote or
 * comment. PostgreSQL's jsonb `?`, `?|` and `?&` operators cannot be written
 * (use `jsonb_exists`…). Block comments do not nest.
 */
export function parseSql(sql: string): ParsedSql {
  let out = "";
  let n = 0;
  let i = 0;
  const refuse = (why: string): never => {
    throw new StateUsageError(`SQL refused at offset ${i}: ${why} (see state/engine.ts parseSql)`);
  };
  while (i < sql.length) {
    const c = sql[i] as string;
    if (c === "'" || c === '"') {
      const end = closingQuote(sql, i, c);
      if (end < 0) refuse(`unterminated ${c === "'" ? "string" : "quoted identifier"}`);
      const quoted = sql.slice(i, end + 1);
      if (quoted.includes("?")) refuse("`?` inside a quoted string or identifier; pass the value as a parameter");
      out += quoted;
      i = end + 1;
    } else if (c === "-" && sql[i + 1] === "-") {
      const newline = sql.indexOf("\n", i);
      const end = newline < 0 ? sql.length : newline;
      if (sql.slice(i, end).includes("?")) refuse("`?` inside a comment");
      out += sql.slice(i, end);
      i = end;
    } else if (c === "/" && sql[i + 1] === "*") {
      const close = sql.indexOf("*/", i + 2);
      if (close < 0) refuse("unterminated block comment");
      if (sql.slice(i, close).includes("?")) refuse("`?` inside a comment");
      out += sql.slice(i, close + 2);
      i = close + 2;
    } else if (c === "$") {
      refuse("`$` outside a string; write parameters as `?` (no `$n`, no dollar quoting)");
    } else if (c === "?") {
      if (/[0-9]/.test(sql[i + 1] ?? "")) refuse("numbered placeholder `?N`; write plain `?`");
      n += 1;
      out += `$${n}`;
      i += 1;
    } else {
      out += c;
      i += 1;
    }
  }
  return { postgres: out, placeholders: n };
}

/** Index of the quote closing the one at `start` ('' and "" are escaped quotes), or -1. */
function closingQuote(sql: string, start: number, quote: string): number {
  let j = start + 1;
  for (;;) {
    const k = sql.indexOf(quote, j);
    if (k < 0) return -1;
    if (sql[k + 1] === quote) {
      j = k + 2;
      continue;
    }
    return k;
  }
}

/** Parse once per distinct SQL text, and check a statement against the contract and its parameters. */
export class SqlTexts {
  readonly #parsed = new Map<string, ParsedSql>();

  /** The parsed statement; throws StateUsageError for refused SQL or a parameter count that does not match. */
  statement(sql: string, params: readonly SqlParam[]): ParsedSql {
    const parsed = this.#parse(sql);
    if (parsed.placeholders !== params.length) {
      throw new StateUsageError(
        `SQL has ${parsed.placeholders} \`?\` placeholder(s) but ${params.length} parameter(s) were given`,
      );
    }
    for (const [index, value] of params.entries()) {
      const ok =
        value === null ||
        typeof value === "string" ||
        typeof value === "number" ||
        typeof value === "bigint" ||
        Buffer.isBuffer(value);
      if (!ok) {
        throw new StateUsageError(
          `parameter ${index + 1} is a ${typeof value}; allowed: string, number, bigint, Buffer or null ` +
            "(store booleans as 0/1, JSON as a string)",
        );
      }
    }
    return parsed;
  }

  /** A schema script: no parameters, no transaction control. */
  script(sql: string): void {
    const parsed = this.#parse(sql);
    if (parsed.placeholders !== 0) throw new StateUsageError("a script (exec) takes no `?` parameters");
  }

  #parse(sql: string): ParsedSql {
    let parsed = this.#parsed.get(sql);
    if (parsed === undefined) {
      if (TRANSACTION_CONTROL.test(sql)) {
        throw new StateUsageError("transaction control statements are refused; use engine.transaction()");
      }
      parsed = parseSql(sql);
      if (this.#parsed.size >= PARSED_SQL_CACHE_ENTRIES) {
        const oldest = this.#parsed.keys().next().value;
        if (oldest !== undefined) this.#parsed.delete(oldest);
      }
      this.#parsed.set(sql, parsed);
    }
    return parsed;
  }
}

/** Whether a transaction's handle may still be used; shared by both engines' handles. */
export interface TransactionScope {
  open: boolean;
}

export function transactionFinished(): StateUsageError {
  return new StateUsageError("this transaction has already committed or rolled back; its handle cannot be used");
}

export function insideTransaction(method: string): StateUsageError {
  return new StateUsageError(
    `engine.${method}() called inside a transaction's function: use the transaction handle it was given`,
  );
}
