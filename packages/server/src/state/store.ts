/**
 * The Server's durable state (better-sqlite3, WAL, synchronous=FULL) and its
 * persisted secret. Admission records hold identity, routing, fences and
 * lifecycle only — NEVER the prompt, config bodies, events or the
 * idempotency key.
 */
import { randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type {
  EffectiveConfigEntry,
  ExecutionState,
  FailureKind,
  RecoveryKind,
  RunState,
  StopReason,
} from "@webcodex/protocol";
import Database from "better-sqlite3";
import { SqliteEngine } from "./engine-sqlite.js";
import { migrate } from "./schema.js";

export type AdmissionStatus = "intent_recorded" | "sent" | "admitted" | "rejected_pre_admission";

export interface AdmissionRecord {
  run_id: string;
  principal_id: string;
  project_id: string;
  provider_id: string;
  runner_id: string;
  intent_fingerprint: string;
  /** Fences captured at resolve time (null when the runner was offline). */
  agent_instance_id: string | null;
  provider_instance_id: string | null;
  /** The Runner store the run was sent to. */
  store_id: string | null;
  admission: AdmissionStatus;
  state: RunState;
  execution_state: ExecutionState;
  stop_reason: StopReason | null;
  failure_kind: FailureKind | null;
  recovery_kind: RecoveryKind;
  message: string | null;
  cancel_forwarded: boolean;
  /** Every config option the agent advertised, with its value, as the Runner last reported (bounded). */
  effective_config: readonly EffectiveConfigEntry[];
  created_at: string;
  updated_at: string;
}

export type RecordPatch = Partial<Omit<AdmissionRecord, "run_id" | "principal_id" | "created_at" | "updated_at">>;

const COLUMNS = [
  "run_id",
  "principal_id",
  "project_id",
  "provider_id",
  "runner_id",
  "intent_fingerprint",
  "agent_instance_id",
  "provider_instance_id",
  "store_id",
  "admission",
  "state",
  "execution_state",
  "stop_reason",
  "failure_kind",
  "recovery_kind",
  "message",
  "cancel_forwarded",
  "effective_config",
  "created_at",
  "updated_at",
] as const;

const PATCHABLE = new Set<string>(COLUMNS.filter((c) => c !== "run_id" && c !== "principal_id" && c !== "created_at"));

type Row = Omit<AdmissionRecord, "cancel_forwarded" | "effective_config"> & {
  cancel_forwarded: number;
  effective_config: string;
};

function fromRow(row: Row): AdmissionRecord {
  let effective: EffectiveConfigEntry[] = [];
  try {
    const parsed: unknown = JSON.parse(row.effective_config);
    if (Array.isArray(parsed)) effective = parsed as EffectiveConfigEntry[];
  } catch {
    effective = [];
  }
  return Object.freeze({ ...row, cancel_forwarded: row.cancel_forwarded === 1, effective_config: effective });
}

/**
 * Admission records kept in memory after a read or write, most recently used
 * last. This process is the only writer of admission_records, so the cache is
 * write-through and never stale; it exists because every observe call reads
 * its run's record several times (ownership, admission, the view).
 */
export const RECORD_CACHE_ENTRIES = 4096;

/**
 * Prepared `UPDATE admission_records` statements kept per set of patched columns (a handful of
 * shapes in practice: sent, admitted, mirrored state, rejection…). Preparing one costs more than
 * running it; beyond this many shapes the oldest is dropped.
 */
export const UPDATE_STATEMENT_CACHE_ENTRIES = 64;

/** SQLite `synchronous` levels this store commits with (PRAGMA synchronous values). */
const SYNCHRONOUS_NORMAL = 1;
const SYNCHRONOUS_FULL = 2;

const SECRET_FILE = "server_secret";
export const STATE_DB_FILE = "server.sqlite3";

/** Read the server secret, creating it (0600) the first time. */
export function loadOrCreateServerSecret(stateDir: string): Buffer {
  const file = join(stateDir, SECRET_FILE);
  try {
    const hex = readFileSync(file, "utf8").trim();
    if (!/^[0-9a-f]{64}$/.test(hex)) throw new Error(`${file}: server secret is corrupt; refusing to replace it`);
    return Buffer.from(hex, "hex");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  const secret = randomBytes(32);
  writeFileSync(file, `${secret.toString("hex")}\n`, { mode: 0o600, flag: "wx" });
  chmodSync(file, 0o600);
  return secret;
}

export class StateStore {
  /** Exposed for additive tables owned by other Server modules (audit, tokens). */
  readonly db: Database.Database;
  /**
   * The same connection behind the async engine interface (state/engine.ts): stores move onto it one by one,
   * after which `db` goes away and a PostgreSQL engine can stand in its place.
   */
  readonly engine: SqliteEngine;
  readonly serverSecret: Buffer;
  /** Schema versions this open stepped through (empty when the file was current); see state/schema.ts. */
  readonly migrated: readonly number[];
  readonly #get: Database.Statement<[string], Row>;
  readonly #insert: Database.Statement<Row>;
  readonly #cache = new Map<string, AdmissionRecord>();
  readonly #listeners: ((record: AdmissionRecord, previous: RunState) => void)[] = [];
  readonly #deleteRejected: Database.Statement<[string, number], { run_id: string }>;
  readonly #updates = new Map<string, Database.Statement>();

  constructor(stateDir: string) {
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    this.serverSecret = loadOrCreateServerSecret(stateDir);
    const file = join(stateDir, STATE_DB_FILE);
    this.db = new Database(file);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma(`synchronous = ${SYNCHRONOUS_FULL}`);
    this.db.pragma("busy_timeout = 5000");
    this.migrated = migrate(this.db, file);
    this.engine = new SqliteEngine(this.db);
    this.#get = this.db.prepare<[string], Row>("SELECT * FROM admission_records WHERE run_id = ?");
    this.#deleteRejected = this.db.prepare<[string, number], { run_id: string }>(
      `DELETE FROM admission_records WHERE run_id IN (
         SELECT run_id FROM admission_records
         WHERE admission = 'rejected_pre_admission' AND updated_at < ? LIMIT ?
       ) RETURNING run_id`,
    );
    this.#insert = this.db.prepare<Row>(
      `INSERT INTO admission_records (${COLUMNS.join(", ")}) VALUES (${COLUMNS.map((c) => `@${c}`).join(", ")})`,
    );
  }

  /** The record (frozen: change it with `update`), or undefined when the run does not exist. */
  get(runId: string): AdmissionRecord | undefined {
    const cached = this.#cache.get(runId);
    if (cached !== undefined) {
      this.#remember(cached);
      return cached;
    }
    const row = this.#get.get(runId);
    return row ? this.#remember(fromRow(row)) : undefined;
  }

  insert(
    record: Omit<AdmissionRecord, "created_at" | "updated_at" | "cancel_forwarded" | "effective_config">,
  ): AdmissionRecord {
    const now = new Date().toISOString();
    const full: AdmissionRecord = {
      ...record,
      cancel_forwarded: false,
      effective_config: [],
      created_at: now,
      updated_at: now,
    };
    this.#insert.run({ ...full, cancel_forwarded: 0, effective_config: "[]" });
    return this.#remember(Object.freeze(full));
  }

  #remember(record: AdmissionRecord): AdmissionRecord {
    this.#cache.delete(record.run_id);
    this.#cache.set(record.run_id, record);
    if (this.#cache.size > RECORD_CACHE_ENTRIES) {
      const oldest = this.#cache.keys().next().value;
      if (oldest !== undefined) this.#cache.delete(oldest);
    }
    return record;
  }

  /** Apply a patch; returns the updated record (or undefined when the run does not exist). */
  update(runId: string, patch: RecordPatch): AdmissionRecord | undefined {
    const keys = Object.keys(patch).filter((k) => PATCHABLE.has(k));
    if (keys.length === 0) return this.get(runId);
    const values: Record<string, unknown> = { run_id: runId, updated_at: new Date().toISOString() };
    for (const k of keys) {
      const v = (patch as Record<string, unknown>)[k];
      values[k] = typeof v === "boolean" ? (v ? 1 : 0) : Array.isArray(v) ? JSON.stringify(v) : (v ?? null);
    }
    const before = this.#listeners.length > 0 ? this.get(runId)?.state : undefined;
    const statement = this.#updateStatement(keys);
    // Re-read after writing, whatever happens: the cache must never hold a value the file does not.
    this.#cache.delete(runId);
    statement.run(values);
    const after = this.get(runId);
    if (after && before !== undefined && after.state !== before) {
      for (const listener of this.#listeners) listener(after, before);
    }
    return after;
  }

  #updateStatement(keys: readonly string[]): Database.Statement {
    const shape = keys.join(",");
    let statement = this.#updates.get(shape);
    if (statement === undefined) {
      const sets = [...keys, "updated_at"].map((k) => `${k} = @${k}`).join(", ");
      statement = this.db.prepare(`UPDATE admission_records SET ${sets} WHERE run_id = @run_id`);
      if (this.#updates.size >= UPDATE_STATEMENT_CACHE_ENTRIES) {
        const oldest = this.#updates.keys().next().value;
        if (oldest !== undefined) this.#updates.delete(oldest);
      }
      this.#updates.set(shape, statement);
    }
    return statement;
  }

  /**
   * Be told of every change of a record's `state` (after it is written, inside the writer's
   * transaction if there is one). Listeners must not throw; the workflow-session recorder uses this.
   */
  onStateChange(listener: (record: AdmissionRecord, previous: RunState) => void): void {
    this.#listeners.push(listener);
  }

  /**
   * Run `fn` in one SQLite transaction (rolled back when it throws). The record cache is dropped
   * when it throws, so it never keeps a value the rollback undid.
   */
  atomically<T>(fn: () => T): T {
    try {
      return this.db.transaction(fn)();
    } catch (err) {
      this.#cache.clear();
      throw err;
    }
  }

  /**
   * `atomically`, committed under `synchronous = NORMAL`: no fsync of its own. In WAL mode such a
   * commit survives a crash of this process (kill -9) and reaches the disk with the next FULL commit,
   * which fsyncs the WAL up to its own end. Only for writes that nothing outside this process may act
   * on before a FULL commit follows them — the admission intent, whose `sent` commit comes before
   * `run.start` leaves — or whose loss to an OS crash a later step repairs: the Runner's `admitted`
   * answer, whose record is left `sent` and re-sent with the same run_id (runs/admission.ts). Inside an
   * open transaction the outer commit decides.
   */
  atomicallyWithoutFsync<T>(fn: () => T): T {
    if (this.db.inTransaction) return this.atomically(fn);
    this.db.pragma(`synchronous = ${SYNCHRONOUS_NORMAL}`);
    try {
      return this.atomically(fn);
    } finally {
      this.db.pragma(`synchronous = ${SYNCHRONOUS_FULL}`);
    }
  }

  /** Records of one runner that are not terminal on the Server side. */
  listOpenForRunner(runnerId: string): AdmissionRecord[] {
    return this.db
      .prepare<[string], Row>(
        "SELECT * FROM admission_records WHERE runner_id = ? AND state NOT IN ('completed','failed','cancelled','lost')",
      )
      .all(runnerId)
      .map(fromRow);
  }

  listByAdmission(status: AdmissionStatus): AdmissionRecord[] {
    return this.db
      .prepare<[string], Row>("SELECT * FROM admission_records WHERE admission = ?")
      .all(status)
      .map(fromRow);
  }

  /**
   * Delete up to `limit` records rejected before admission whose last change is before `cutoffIso`;
   * returns how many. Only `rejected_pre_admission` records: nothing of theirs ever ran on a Runner.
   */
  deleteRejectedBefore(cutoffIso: string, limit: number): number {
    const rows = this.#deleteRejected.all(cutoffIso, limit);
    for (const r of rows) this.#cache.delete(r.run_id);
    return rows.length;
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
}
