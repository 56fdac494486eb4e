/**
 * The schema of the Server's state database, as forward-only steps that run
 * on both engines (state/engine.ts). Each step runs once, in its own
 * transaction together with the version bump, so a crash leaves the
 * database at the old version or the new one, never between. A database
 * from a newer build (a version this build does not know) is refused rather
 * than guessed at.
 *
 * SQLite (`server.sqlite3`) keeps the version in `PRAGMA user_version`.
 * Version 0 is a database made before versioning (or a new, empty one): its
 * tables, if any, are exactly version 1's, which is why step 1 creates them
 * only when they do not exist. A change to an existing table's shape is a new
 * step here, never an edit of an old one.
 *
 * PostgreSQL keeps the version in the one-row table `webcodex_schema`, and
 * every step (and the first read) runs under the advisory lock SCHEMA_LOCK,
 * so several Server instances starting at once step through each version
 * exactly once between them. A step's SQL is written for SQLite and
 * translated by `postgresSql` (see there); a step whose SQL that translation
 * cannot carry states its PostgreSQL text in `postgres`.
 */
import type Database from "better-sqlite3";
import type { StateEngine, StateQueries } from "./engine.js";

interface Migration {
  /** The version the database has after this step. */
  version: number;
  /** What it changes and why, for the log. */
  summary: string;
  /** The step in SQLite's dialect (translated for PostgreSQL by `postgresSql` unless `postgres` is given). */
  sql: string;
  /** The step for PostgreSQL, only where the translation does not fit. */
  postgres?: string;
}

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    summary: "admission records (the schema before versioning)",
    sql: `
      CREATE TABLE IF NOT EXISTS admission_records (
        run_id TEXT PRIMARY KEY,
        principal_id TEXT NOT NULL,
        project_id TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        runner_id TEXT NOT NULL,
        intent_fingerprint TEXT NOT NULL,
        agent_instance_id TEXT,
        provider_instance_id TEXT,
        store_id TEXT,
        admission TEXT NOT NULL,
        state TEXT NOT NULL,
        execution_state TEXT NOT NULL,
        stop_reason TEXT,
        failure_kind TEXT,
        recovery_kind TEXT NOT NULL,
        message TEXT,
        cancel_forwarded INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      CREATE INDEX IF NOT EXISTS admission_records_runner ON admission_records (runner_id, state);
    `,
  },
  {
    version: 2,
    summary: "index rejected-before-admission records by age, for their expiry",
    sql: `CREATE INDEX admission_records_admission_age ON admission_records (admission, updated_at);`,
  },
  {
    version: 3,
    summary: "agent tasks, attempts and the Attempt→Run binding (the managed path, tasks/store.ts)",
    sql: `
      CREATE TABLE agent_tasks (
        task_id TEXT PRIMARY KEY,
        principal_id TEXT NOT NULL,
        project_id TEXT NOT NULL,
        title TEXT NOT NULL,
        instruction TEXT NOT NULL,
        instruction_bytes INTEGER NOT NULL,
        request_fingerprint TEXT NOT NULL,
        state TEXT NOT NULL,
        outcome TEXT,
        current_attempt_id TEXT,
        last_fence INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        closed_at TEXT
      ) STRICT;
      CREATE INDEX agent_tasks_principal_state ON agent_tasks (principal_id, state);
      CREATE INDEX agent_tasks_closed ON agent_tasks (state, closed_at);
      CREATE TABLE agent_task_attempts (
        attempt_id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL,
        assignee TEXT NOT NULL,
        fence INTEGER NOT NULL,
        controller_generation INTEGER NOT NULL,
        lease_expires_ms INTEGER NOT NULL,
        state TEXT NOT NULL,
        superseded_run_id TEXT,
        run_state TEXT,
        run_execution_state TEXT,
        run_stop_reason TEXT,
        run_failure_kind TEXT,
        run_reconciled_at TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (task_id, fence)
      ) STRICT;
      CREATE TABLE agent_task_run_bindings (
        attempt_id TEXT PRIMARY KEY,
        task_id TEXT NOT NULL,
        run_id TEXT NOT NULL UNIQUE,
        provider_id TEXT NOT NULL,
        runner_id TEXT NOT NULL,
        provider_instance_id TEXT NOT NULL,
        agent_instance_id TEXT NOT NULL,
        authority_fingerprint TEXT NOT NULL,
        intent_fingerprint TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      CREATE INDEX agent_task_run_bindings_task ON agent_task_run_bindings (task_id);
    `,
  },
  {
    version: 4,
    summary: "OAuth clients, grants, codes, token hashes and audit (oauth/store.ts); new tables, nothing granted",
    sql: `
      CREATE TABLE IF NOT EXISTS oauth_clients (
        client_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('dynamic', 'cimd', 'operator')),
        client_name TEXT,
        redirect_uris TEXT NOT NULL,
        allow_coding_agent_run INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        fetched_at TEXT,
        revoked_at TEXT
      ) STRICT;
      CREATE TABLE IF NOT EXISTS oauth_grants (
        grant_id TEXT PRIMARY KEY,
        client_id TEXT NOT NULL,
        principal_id TEXT NOT NULL,
        key_id TEXT,
        scopes TEXT NOT NULL,
        projects TEXT NOT NULL,
        resource TEXT NOT NULL,
        created_at TEXT NOT NULL,
        revoked_at TEXT,
        revoked_reason TEXT
      ) STRICT;
      CREATE INDEX IF NOT EXISTS oauth_grants_client ON oauth_grants (client_id);
      CREATE INDEX IF NOT EXISTS oauth_grants_principal ON oauth_grants (principal_id);
      CREATE TABLE IF NOT EXISTS oauth_codes (
        code_hash TEXT PRIMARY KEY,
        grant_id TEXT NOT NULL,
        client_id TEXT NOT NULL,
        redirect_uri TEXT NOT NULL,
        code_challenge TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        used_at INTEGER
      ) STRICT;
      CREATE TABLE IF NOT EXISTS oauth_tokens (
        token_hash TEXT PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('access', 'refresh')),
        grant_id TEXT NOT NULL,
        client_id TEXT NOT NULL,
        scopes TEXT NOT NULL,
        resource TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        used_at INTEGER
      ) STRICT;
      CREATE INDEX IF NOT EXISTS oauth_tokens_grant ON oauth_tokens (grant_id);
      CREATE TABLE IF NOT EXISTS oauth_audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        event TEXT NOT NULL,
        client_id TEXT,
        principal_id TEXT,
        grant_id TEXT,
        scopes TEXT,
        detail TEXT
      ) STRICT;
    `,
  },
  {
    version: 5,
    summary: "workflow sessions, their lifecycle evidence and the runs they record (sessions/store.ts)",
    sql: `
      CREATE TABLE workflow_sessions (
        session_id TEXT PRIMARY KEY,
        principal_id TEXT NOT NULL,
        project_id TEXT NOT NULL,
        title TEXT NOT NULL,
        handoff TEXT NOT NULL,
        handoff_version INTEGER NOT NULL,
        goal TEXT NOT NULL,
        goal_version INTEGER NOT NULL,
        version INTEGER NOT NULL,
        evidence_last_seq INTEGER NOT NULL DEFAULT 0,
        evidence_dropped INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      ) STRICT;
      CREATE INDEX workflow_sessions_principal ON workflow_sessions (principal_id);
      CREATE TABLE workflow_session_evidence (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        at TEXT NOT NULL,
        kind TEXT NOT NULL,
        run_id TEXT NOT NULL,
        provider_id TEXT NOT NULL,
        state TEXT NOT NULL,
        execution_state TEXT NOT NULL,
        stop_reason TEXT,
        failure_kind TEXT,
        PRIMARY KEY (session_id, seq)
      ) STRICT;
      CREATE TABLE workflow_session_runs (
        run_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        terminal_recorded INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL
      ) STRICT;
    `,
  },
  {
    version: 6,
    summary: "the effective-config snapshot a Runner reports for a run (observe's effective_config)",
    sql: `
      ALTER TABLE admission_records ADD COLUMN effective_config TEXT NOT NULL DEFAULT '[]';
    `,
  },
  {
    version: 7,
    summary:
      "runner link leases survive a Server restart (link/lease-store.ts); refused hellos are counted per " +
      "runner and window in one link-audit row",
    sql: `
      CREATE TABLE runner_link_leases (
        runner_id TEXT PRIMARY KEY,
        secret_hash TEXT NOT NULL,
        expires_ms INTEGER NOT NULL
      ) STRICT;
      CREATE TABLE IF NOT EXISTS runner_link_audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        runner_id TEXT NOT NULL,
        event TEXT NOT NULL,
        remote TEXT,
        conn INTEGER,
        agent_instance_id TEXT
      );
      ALTER TABLE runner_link_audit ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
      ALTER TABLE runner_link_audit ADD COLUMN last_at TEXT;
    `,
  },
  {
    version: 8,
    summary:
      "MCP audit rows name the task, attempt and workflow session a call was about (ids only, mcp/audit-subjects.ts); " +
      "the audit table is created here from now on",
    sql: `
      CREATE TABLE IF NOT EXISTS mcp_audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        principal_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        run_id TEXT,
        outcome TEXT NOT NULL,
        input_bytes INTEGER NOT NULL,
        output_bytes INTEGER NOT NULL,
        duration_ms INTEGER NOT NULL
      );
      CREATE INDEX IF NOT EXISTS mcp_audit_principal_at ON mcp_audit (principal_id, at);
      ALTER TABLE mcp_audit ADD COLUMN task_id TEXT;
      ALTER TABLE mcp_audit ADD COLUMN attempt_id TEXT;
      ALTER TABLE mcp_audit ADD COLUMN session_id TEXT;
    `,
  },
  {
    version: 9,
    summary:
      "OAuth clients remember the issuer that registered them (SEP-2352); a rotated refresh token keeps its " +
      "successor pair encrypted under a key only the rotated token derives, for the reuse grace window (oauth/store.ts)",
    sql: `
      ALTER TABLE oauth_clients ADD COLUMN issuer TEXT;
      ALTER TABLE oauth_tokens ADD COLUMN successor BLOB;
    `,
  },
  {
    version: 10,
    summary:
      "the tables that created themselves (principal tokens, Runner tokens, Runner presence, operator-read OAuth " +
      "clients, console sessions) become a schema step, so a PostgreSQL database gets them too; on SQLite the " +
      "definitions are the ones those modules create, so an existing table is left as it is",
    sql: `
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
    `,
  },
  {
    version: 11,
    summary:
      "a runner link lease names the connection that holds it (instance and connection), so several Server " +
      "instances decide hellos on the one row and only the holder extends or ends it (link/lease-store.ts)",
    sql: `
      ALTER TABLE runner_link_leases ADD COLUMN holder TEXT NOT NULL DEFAULT '';
    `,
  },
  {
    version: 12,
    summary:
      "the server secret in the database, for a state several instances share (PostgreSQL: they must derive the " +
      "same run ids and tokens); on SQLite it stays in the state dir's file and this table stays empty",
    sql: `
      CREATE TABLE server_secret (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        secret TEXT NOT NULL
      ) STRICT;
    `,
  },
  {
    version: 13,
    summary:
      "routing between instances (design §14): the directory of live Server instances and the URL peers reach " +
      "each on, and in a Runner's presence row what a start needs from its hello on another instance (its " +
      "store id and its providers with their instance ids)",
    sql: `
      CREATE TABLE server_instances (
        instance_id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        heartbeat_at INTEGER NOT NULL
      ) STRICT;
      ALTER TABLE runner_presence ADD COLUMN store_id TEXT;
      ALTER TABLE runner_presence ADD COLUMN provider_adverts TEXT NOT NULL DEFAULT '[]';
    `,
  },
  {
    version: 14,
    summary: "a Runner's software version from its hello, for the operator console (link/presence.ts)",
    sql: `
      ALTER TABLE runner_presence ADD COLUMN runner_version TEXT;
    `,
  },
  {
    version: 15,
    summary:
      "a cancel whose delivery to the Runner is unknown is kept in its record (cancel_pending), so that " +
      "whichever instance next accepts that Runner's hello — or this one after a restart — sends it again",
    sql: `
      ALTER TABLE admission_records ADD COLUMN cancel_pending INTEGER NOT NULL DEFAULT 0;
    `,
  },
  {
    version: 16,
    summary:
      "a run's latest usage as its Runner reported it (context tokens used and window size, cost amount and " +
      "currency; numbers only), for observe, task results and the console's per-principal cost per day",
    sql: `
      ALTER TABLE admission_records ADD COLUMN usage_used_tokens INTEGER;
      ALTER TABLE admission_records ADD COLUMN usage_context_size INTEGER;
      ALTER TABLE admission_records ADD COLUMN usage_cost_amount REAL;
      ALTER TABLE admission_records ADD COLUMN usage_cost_currency TEXT;
    `,
    postgres: `
      ALTER TABLE admission_records ADD COLUMN usage_used_tokens BIGINT;
      ALTER TABLE admission_records ADD COLUMN usage_context_size BIGINT;
      ALTER TABLE admission_records ADD COLUMN usage_cost_amount DOUBLE PRECISION;
      ALTER TABLE admission_records ADD COLUMN usage_cost_currency TEXT;
    `,
  },
  {
    version: 17,
    summary:
      "signed webhooks (design §18, webhooks/subscriptions.ts and outbox.ts): a principal's subscriptions (URL, event types, signing " +
      "secret) and the outbox of their events, written in the transaction of the record change that causes them",
    sql: `
      CREATE TABLE webhook_subscriptions (
        subscription_id TEXT PRIMARY KEY,
        principal_id TEXT NOT NULL,
        url TEXT NOT NULL,
        event_types TEXT NOT NULL,
        secret TEXT NOT NULL,
        status TEXT NOT NULL,
        consecutive_failures INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        last_attempt_ms INTEGER,
        created_at TEXT NOT NULL
      ) STRICT;
      CREATE INDEX webhook_subscriptions_principal ON webhook_subscriptions (principal_id, status);
      CREATE TABLE webhook_outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id TEXT NOT NULL UNIQUE,
        subscription_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        event_type TEXT NOT NULL,
        body TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        created_ms INTEGER NOT NULL,
        retry_from_ms INTEGER NOT NULL,
        next_attempt_ms INTEGER NOT NULL,
        lease_until_ms INTEGER,
        delivered_ms INTEGER,
        last_status INTEGER,
        last_error TEXT
      ) STRICT;
      CREATE INDEX webhook_outbox_due ON webhook_outbox (status, next_attempt_ms);
      CREATE INDEX webhook_outbox_order ON webhook_outbox (subscription_id, run_id, seq);
    `,
  },
  {
    version: 18,
    summary:
      "continuation links (design §17): which run continues which, one child per parent (the primary key), " +
      "written in the child's admission transaction, so observe names parent_run_id and continued_by",
    sql: `
      CREATE TABLE run_continuations (
        parent_run_id TEXT PRIMARY KEY,
        child_run_id TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL
      ) STRICT;
    `,
  },
  {
    version: 19,
    summary:
      "webhooks, second slice (design §18): which lease expiry of an attempt was announced (task.attempt_expired, " +
      "once per generation), a subscription's previous secret during a rotation's overlap, when it began failing " +
      "and when it was disabled, and the audit rows of subscription changes",
    sql: `
      ALTER TABLE agent_task_attempts ADD COLUMN expiry_announced_generation INTEGER NOT NULL DEFAULT 0;
      CREATE INDEX agent_task_attempts_lease ON agent_task_attempts (state, lease_expires_ms);
      ALTER TABLE webhook_subscriptions ADD COLUMN previous_secret TEXT;
      ALTER TABLE webhook_subscriptions ADD COLUMN previous_secret_until_ms INTEGER;
      ALTER TABLE webhook_subscriptions ADD COLUMN failing_since_ms INTEGER;
      ALTER TABLE webhook_subscriptions ADD COLUMN disabled_at TEXT;
      CREATE TABLE webhook_audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        event TEXT NOT NULL,
        subscription_id TEXT NOT NULL,
        principal_id TEXT NOT NULL,
        actor TEXT NOT NULL,
        detail TEXT
      ) STRICT;
    `,
  },
  {
    version: 20,
    summary:
      "the place in the Runner's own order of the summary a record last took (its last_seq and updated_at), so " +
      "a summary that left the Runner before that one — a cancel's or a catch-up's answer overtaken by the run's " +
      "next event — never moves a live run's state back (runs/context.ts noRegress)",
    sql: `
      ALTER TABLE admission_records ADD COLUMN runner_seq INTEGER;
      ALTER TABLE admission_records ADD COLUMN runner_updated_at TEXT;
    `,
    postgres: `
      ALTER TABLE admission_records ADD COLUMN runner_seq BIGINT;
      ALTER TABLE admission_records ADD COLUMN runner_updated_at TEXT;
    `,
  },
];

export const SCHEMA_VERSION = MIGRATIONS[MIGRATIONS.length - 1]?.version ?? 0;

export class SchemaVersionError extends Error {
  override readonly name = "SchemaVersionError";
}

/**
 * Bring the SQLite `db` to SCHEMA_VERSION, synchronously: the path of the stores that still use
 * better-sqlite3 directly (`migrateState` below is the same loop on either engine, for the ported
 * ones). Returns the versions it stepped through (empty when it was current).
 * Throws SchemaVersionError for a database newer than this build.
 */
export function migrate(db: Database.Database, file: string): number[] {
  const current = db.pragma("user_version", { simple: true }) as number;
  if (current > SCHEMA_VERSION) {
    throw new SchemaVersionError(
      `${file}: schema version ${current} is newer than this webcodex-server supports (${SCHEMA_VERSION}); ` +
        "run the newer webcodex-server, or restore a backup made by this version",
    );
  }
  const applied: number[] = [];
  for (const m of MIGRATIONS) {
    if (m.version <= current) continue;
    // Re-read under the write lock: another process (a CLI next to the Server) may have just stepped.
    const stepped = db
      .transaction(() => {
        if ((db.pragma("user_version", { simple: true }) as number) >= m.version) return false;
        db.exec(m.sql);
        db.pragma(`user_version = ${m.version}`);
        return true;
      })
      .immediate();
    if (stepped) applied.push(m.version);
  }
  return applied;
}

/**
 * A step's SQL for PostgreSQL: `m.postgres` when the step gives one, else its SQLite text translated
 * word by word, which is all the steps need:
 * - `INTEGER PRIMARY KEY AUTOINCREMENT` → `BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY`;
 * - `INTEGER` → `BIGINT` (SQLite's INTEGER is 64-bit: ms timestamps, counters); booleans stay 0/1
 *   integers on both engines, so the stores write the same values;
 * - `BLOB` → `BYTEA`;
 * - the `STRICT` table option is dropped (PostgreSQL columns are always strictly typed).
 * Anything SQLite-only that this does not translate (PRAGMA, WITHOUT ROWID, INSERT OR …, SQLite date
 * functions, AUTOINCREMENT elsewhere) is refused, so a new step gets a `postgres` text instead of a
 * silent mistranslation.
 */
export function postgresSql(m: Migration): string {
  return m.postgres ?? translateToPostgres(m.sql, `schema step ${m.version}`);
}

/** The translation `postgresSql` describes, of any SQLite DDL script; `where` names it in the refusal. */
export function translateToPostgres(sql: string, where: string): string {
  const translated = sql
    .replace(/\bINTEGER\s+PRIMARY\s+KEY\s+AUTOINCREMENT\b/gi, "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
    .replace(/\bINTEGER\b/gi, "BIGINT")
    .replace(/\bBLOB\b/gi, "BYTEA")
    .replace(/\)\s*STRICT\s*;/gi, ");");
  const untranslatable =
    /\b(AUTOINCREMENT|PRAGMA|WITHOUT\s+ROWID|STRICT|INSERT\s+OR|datetime|strftime|julianday)\b/i.exec(translated);
  if (untranslatable) {
    throw new Error(
      `${where}: \`${untranslatable[0]}\` has no PostgreSQL translation; give the step a \`postgres\` text`,
    );
  }
  return translated;
}

/** The advisory lock every PostgreSQL schema step (and the first version read) runs under. */
export const SCHEMA_LOCK = "webcodex.state.schema";

/** Where each engine keeps the schema version. */
const VERSION_STORES = {
  sqlite: {
    async read(tx: StateQueries): Promise<number> {
      return (await tx.get<{ user_version: number }>("PRAGMA user_version"))?.user_version ?? 0;
    },
    async write(tx: StateQueries, version: number): Promise<void> {
      await tx.exec(`PRAGMA user_version = ${Math.trunc(version)}`);
    },
  },
  postgres: {
    async read(tx: StateQueries): Promise<number> {
      const exists = await tx.get<{ t: string | null }>("SELECT to_regclass('webcodex_schema')::text AS t");
      if (exists?.t == null) {
        await tx.exec(
          "CREATE TABLE webcodex_schema (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);" +
            "INSERT INTO webcodex_schema (id, version) VALUES (1, 0);",
        );
      }
      return (await tx.get<{ version: number }>("SELECT version FROM webcodex_schema WHERE id = 1"))?.version ?? 0;
    },
    async write(tx: StateQueries, version: number): Promise<void> {
      await tx.run("UPDATE webcodex_schema SET version = ? WHERE id = 1", [version]);
    },
  },
} as const;

function refuseNewer(current: number, where: string): void {
  if (current > SCHEMA_VERSION) {
    throw new SchemaVersionError(
      `${where}: schema version ${current} is newer than this webcodex-server supports (${SCHEMA_VERSION}); ` +
        "run the newer webcodex-server, or restore a backup made by this version",
    );
  }
}

/** The schema version of the engine's database (0 for a new one); on PostgreSQL, creates the version table. */
export async function stateSchemaVersion(engine: StateEngine): Promise<number> {
  const versions = VERSION_STORES[engine.dialect];
  return await engine.transaction((tx) => versions.read(tx), { lock: SCHEMA_LOCK });
}

/**
 * `migrate` for either engine: bring its database to SCHEMA_VERSION and return the versions this call
 * stepped through (empty when it was current, or when another instance stepped at the same time).
 * Throws SchemaVersionError for a database newer than this build; `where` names the database in that
 * error (a file, or "the PostgreSQL state database" — never a URL).
 */
export async function migrateState(engine: StateEngine, where: string): Promise<number[]> {
  const versions = VERSION_STORES[engine.dialect];
  const initial = await stateSchemaVersion(engine);
  refuseNewer(initial, where);
  const applied: number[] = [];
  for (const m of MIGRATIONS) {
    if (m.version <= initial) continue;
    const sql = engine.dialect === "postgres" ? postgresSql(m) : m.sql;
    // Re-read under the lock: another process or instance may have just stepped (or be newer).
    const stepped = await engine.transaction(
      async (tx) => {
        const current = await versions.read(tx);
        refuseNewer(current, where);
        if (current >= m.version) return false;
        await tx.exec(sql);
        await versions.write(tx, m.version);
        return true;
      },
      { lock: SCHEMA_LOCK },
    );
    if (stepped) applied.push(m.version);
  }
  return applied;
}
