/**
 * Runner tokens replaced with `webcodex-server runner-token rotate` (design §5), and the audit trail of
 * the Runner link. Both live in the Server's SQLite state database:
 *
 * - `runner_tokens`: one row per rotated runner id with the sha256 of its current token. A row overrides
 *   the `[[runners]]` block's `token_sha256`/`token_env` for that id: the config's token stops working
 *   as soon as the row exists. The running Server notices a rotation made by the CLI (another process)
 *   through `PRAGMA data_version`, checked on every upgrade and every RUNNER_TOKEN_POLL_MS.
 * - `runner_link_audit`: who held, resumed or was refused a runner's link, and rotations — runner id,
 *   event, remote address, connection number, agent_instance_id. Never a token or a secret. Bounded to
 *   LINK_AUDIT_MAX_ROWS. Refused hellos (`link_refused_in_use`) are aggregated: one row per runner id per
 *   LINK_REFUSAL_AUDIT_WINDOW_MS, carrying the window's first refusal (remote, conn, agent_instance_id),
 *   `count` and `last_at`, so a flood of refused hellos adds one row per minute, not one per hello, and
 *   cannot push older evidence (who held the link before) out of the ring. `count`/`last_at`: step 7.
 */
import { randomBytes } from "node:crypto";
import type BetterSqlite3 from "better-sqlite3";
import { hashToken } from "../principals/tokens.js";

/** How often the running Server looks for a rotation made by another process. */
export const RUNNER_TOKEN_POLL_MS = 1000;
/** Rows kept in `runner_link_audit` (older rows are deleted as new ones arrive). */
export const LINK_AUDIT_MAX_ROWS = 100_000;
/** Refused hellos of one runner id within this window share one audit row (with a count). */
export const LINK_REFUSAL_AUDIT_WINDOW_MS = 60_000;

export const RUNNER_TOKEN_PREFIX = "wcr_";

/** runner_link_audit, which this store also writes, is a schema step of the state database (state/schema.ts v7). */
const SCHEMA = `
CREATE TABLE IF NOT EXISTS runner_tokens (
  runner_id TEXT PRIMARY KEY,
  token_hash TEXT NOT NULL,
  rotated_at TEXT NOT NULL
);
`;

/** What happened on a runner's link. */
export type LinkAuditEvent =
  /** A hello took a link nobody held (or whose holder was declared dead). */
  | "link_granted"
  /** The holder's own process reconnected with its resume secret. */
  | "link_resumed"
  /** A hello without the live holder's secret: a possible impersonation. */
  | "link_refused_in_use"
  /** A live connection authenticated with a token that was just rotated away, closed. */
  | "closed_token_rotated";

export interface LinkAuditRecord {
  runner_id: string;
  event: LinkAuditEvent;
  remote: string | null;
  conn: number | null;
  agent_instance_id: string | null;
}

export interface LinkAuditRow extends LinkAuditRecord {
  id: number;
  at: string;
  /** How many events this row stands for (refusals aggregated within a window; 1 otherwise). */
  count: number;
  /** When the last of them happened (aggregated rows; null otherwise). */
  last_at: string | null;
}

/** A new runner token: `wcr_` + 32 random bytes, base64url. */
export function newRunnerToken(): string {
  return RUNNER_TOKEN_PREFIX + randomBytes(32).toString("base64url");
}

export class RunnerTokenStore {
  readonly #db: BetterSqlite3.Database;
  readonly #dataVersion: BetterSqlite3.Statement<[], number>;
  readonly #insertAudit: BetterSqlite3.Statement;
  readonly #trimAudit: BetterSqlite3.Statement<[number]>;
  readonly #countRefusal: BetterSqlite3.Statement<[string, number]>;
  /** The open refusal window of each runner id (bounded by the configured runner ids: only they authenticate). */
  readonly #refusalWindows = new Map<string, { rowId: number; startMs: number }>();
  #seenVersion = -1;
  #overrides = new Map<string, Buffer>();
  #auditSinceTrim = Number.POSITIVE_INFINITY;

  constructor(db: BetterSqlite3.Database) {
    db.exec(SCHEMA);
    this.#db = db;
    this.#dataVersion = db.prepare<[], number>("PRAGMA data_version").pluck();
    this.#insertAudit = db.prepare(
      `INSERT INTO runner_link_audit (at, runner_id, event, remote, conn, agent_instance_id)
       VALUES (@at, @runner_id, @event, @remote, @conn, @agent_instance_id)`,
    );
    this.#trimAudit = db.prepare<[number]>(
      "DELETE FROM runner_link_audit WHERE id <= (SELECT MAX(id) FROM runner_link_audit) - ?",
    );
    this.#countRefusal = db.prepare<[string, number]>(
      "UPDATE runner_link_audit SET count = count + 1, last_at = ? WHERE id = ?",
    );
    this.#load();
  }

  #load(): void {
    const rows = this.#db.prepare("SELECT runner_id, token_hash FROM runner_tokens").all() as {
      runner_id: string;
      token_hash: string;
    }[];
    this.#overrides = new Map(rows.map((r) => [r.runner_id, Buffer.from(r.token_hash, "hex")]));
  }

  /** Re-read the rotated tokens when the database changed; true when it did. */
  refresh(): boolean {
    const version = this.#dataVersion.get() ?? -1;
    if (version === this.#seenVersion) return false;
    this.#seenVersion = version;
    const before = this.#overrides;
    this.#load();
    if (before.size !== this.#overrides.size) return true;
    for (const [id, hash] of this.#overrides) if (!before.get(id)?.equals(hash)) return true;
    return false;
  }

  /** The rotated token hash of a runner id (32 bytes), or undefined when its config token applies. */
  override(runnerId: string): Buffer | undefined {
    return this.#overrides.get(runnerId);
  }

  /** Replace a runner's token; returns the new token (shown once, never stored). */
  rotate(runnerId: string, clock: () => Date = () => new Date()): string {
    const token = newRunnerToken();
    this.#db
      .prepare(
        `INSERT INTO runner_tokens (runner_id, token_hash, rotated_at) VALUES (?, ?, ?)
         ON CONFLICT (runner_id) DO UPDATE SET token_hash = excluded.token_hash, rotated_at = excluded.rotated_at`,
      )
      .run(runnerId, hashToken(token), clock().toISOString());
    this.#load();
    return token;
  }

  audit(entry: LinkAuditRecord, clock: () => Date = () => new Date()): void {
    const now = clock();
    if (entry.event === "link_refused_in_use") {
      const window = this.#refusalWindows.get(entry.runner_id);
      if (window && now.getTime() - window.startMs < LINK_REFUSAL_AUDIT_WINDOW_MS) {
        if (this.#countRefusal.run(now.toISOString(), window.rowId).changes === 1) return;
      }
    }
    const { lastInsertRowid } = this.#insertAudit.run({ ...entry, at: now.toISOString() });
    if (entry.event === "link_refused_in_use") {
      this.#refusalWindows.set(entry.runner_id, { rowId: Number(lastInsertRowid), startMs: now.getTime() });
    }
    if (++this.#auditSinceTrim >= 1024) {
      this.#trimAudit.run(LINK_AUDIT_MAX_ROWS);
      this.#auditSinceTrim = 0;
    }
  }

  /** Newest last. */
  auditRows(limit = 1000): LinkAuditRow[] {
    return this.#db
      .prepare("SELECT * FROM (SELECT * FROM runner_link_audit ORDER BY id DESC LIMIT ?) ORDER BY id ASC")
      .all(limit) as LinkAuditRow[];
  }
}
