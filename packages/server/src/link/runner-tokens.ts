/**
 * Runner tokens replaced with `webcodex-server runner-token rotate` (design §5), and the audit trail of
 * the Runner link. Both live in the Server's state database (state/engine.ts: SQLite or PostgreSQL):
 *
 * - `runner_tokens`: one row per rotated runner id with the sha256 of its current token. A row overrides
 *   the `[[runners]]` block's `token_sha256`/`token_env` for that id: the config's token stops working
 *   as soon as the row exists. Nothing of it is kept in memory: every upgrade reads the table (one query;
 *   a row per rotated runner), and every RUNNER_TOKEN_POLL_MS the Server reads it again to close the live
 *   links that used a token rotated by the CLI or by another Server instance on the same database.
 * - `runner_link_audit`: who held, resumed or was refused a runner's link, and rotations — runner id,
 *   event, remote address, connection number, agent_instance_id. Never a token or a secret. Bounded to
 *   LINK_AUDIT_MAX_ROWS. Refused hellos (`link_refused_in_use`) are aggregated: one row per runner id per
 *   LINK_REFUSAL_AUDIT_WINDOW_MS, carrying the window's first refusal (remote, conn, agent_instance_id),
 *   `count` and `last_at`, so a flood of refused hellos adds one row per minute, not one per hello, and
 *   cannot push older evidence (who held the link before) out of the ring. `count`/`last_at`: step 7.
 *   The window is this instance's: with several Server instances, each aggregates the refusals it saw.
 *   Audit rows are written in the order they were recorded (one at a time, at most LINK_AUDIT_MAX_PENDING
 *   waiting; beyond that a row is dropped and reported).
 */
import { randomBytes } from "node:crypto";
import { hashToken } from "../principals/tokens.js";
import type { StateEngine } from "../state/engine.js";

/** How often the running Server looks for a rotation made by another process or instance. */
export const RUNNER_TOKEN_POLL_MS = 1000;
/** Rows kept in `runner_link_audit` (older rows are deleted as new ones arrive). */
export const LINK_AUDIT_MAX_ROWS = 100_000;
/** Trimming to LINK_AUDIT_MAX_ROWS runs once per this many written rows. */
const LINK_AUDIT_TRIM_EVERY_ROWS = 1024;
/** Refused hellos of one runner id within this window share one audit row (with a count). */
export const LINK_REFUSAL_AUDIT_WINDOW_MS = 60_000;
/** Audit rows waiting to be written (a slow database); beyond this a row is dropped and reported. */
export const LINK_AUDIT_MAX_PENDING = 1024;

export const RUNNER_TOKEN_PREFIX = "wcr_";

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

export class LinkAuditOverflowError extends Error {
  override readonly name = "LinkAuditOverflowError";
}

export class RunnerTokenStore {
  readonly #db: StateEngine;
  /** The open refusal window of each runner id (bounded by the configured runner ids: only they authenticate). */
  readonly #refusalWindows = new Map<string, { rowId: number; startMs: number }>();
  #auditSinceTrim = Number.POSITIVE_INFINITY;
  /** The audit rows recorded but not yet written, in order. */
  #auditQueue: Promise<void> = Promise.resolve();
  #auditPending = 0;

  /** `db` must be migrated (state/schema.ts: runner_tokens is step 10, runner_link_audit step 7). */
  constructor(db: StateEngine) {
    this.#db = db;
  }

  /** The rotated token hash (32 bytes) of every runner id that has one; a runner not in it uses its config token. */
  async overrides(): Promise<Map<string, Buffer>> {
    const rows = await this.#db.all<{ runner_id: string; token_hash: string }>(
      "SELECT runner_id, token_hash FROM runner_tokens",
    );
    return new Map(rows.map((r) => [r.runner_id, Buffer.from(r.token_hash, "hex")]));
  }

  /** Replace a runner's token; returns the new token (shown once, never stored). */
  async rotate(runnerId: string, clock: () => Date = () => new Date()): Promise<string> {
    const token = newRunnerToken();
    await this.#db.run(
      `INSERT INTO runner_tokens (runner_id, token_hash, rotated_at) VALUES (?, ?, ?)
       ON CONFLICT (runner_id) DO UPDATE SET token_hash = excluded.token_hash, rotated_at = excluded.rotated_at`,
      [runnerId, hashToken(token), clock().toISOString()],
    );
    return token;
  }

  /**
   * Write one audit row after the ones recorded before it. Rejects with LinkAuditOverflowError when
   * LINK_AUDIT_MAX_PENDING rows already wait, or with the database's error; either way the link's
   * decision stands.
   */
  audit(entry: LinkAuditRecord, clock: () => Date = () => new Date()): Promise<void> {
    if (this.#auditPending >= LINK_AUDIT_MAX_PENDING) {
      return Promise.reject(
        new LinkAuditOverflowError(
          `${this.#auditPending} link audit rows already wait to be written (LINK_AUDIT_MAX_PENDING); ` +
            `the ${entry.event} row of runner ${entry.runner_id} is dropped`,
        ),
      );
    }
    const now = clock();
    this.#auditPending += 1;
    const written = this.#auditQueue.then(() => this.#writeAudit(entry, now));
    this.#auditQueue = written.then(
      () => {
        this.#auditPending -= 1;
      },
      () => {
        this.#auditPending -= 1;
      },
    );
    return written;
  }

  async #writeAudit(entry: LinkAuditRecord, now: Date): Promise<void> {
    if (entry.event === "link_refused_in_use") {
      const window = this.#refusalWindows.get(entry.runner_id);
      if (window && now.getTime() - window.startMs < LINK_REFUSAL_AUDIT_WINDOW_MS) {
        const counted = await this.#db.run("UPDATE runner_link_audit SET count = count + 1, last_at = ? WHERE id = ?", [
          now.toISOString(),
          window.rowId,
        ]);
        if (counted.changes === 1) return;
      }
    }
    const inserted = await this.#db.get<{ id: number }>(
      `INSERT INTO runner_link_audit (at, runner_id, event, remote, conn, agent_instance_id)
       VALUES (?, ?, ?, ?, ?, ?) RETURNING id`,
      [now.toISOString(), entry.runner_id, entry.event, entry.remote, entry.conn, entry.agent_instance_id],
    );
    if (entry.event === "link_refused_in_use" && inserted !== undefined) {
      this.#refusalWindows.set(entry.runner_id, { rowId: Number(inserted.id), startMs: now.getTime() });
    }
    if (++this.#auditSinceTrim >= LINK_AUDIT_TRIM_EVERY_ROWS) {
      this.#auditSinceTrim = 0;
      await this.#db.run("DELETE FROM runner_link_audit WHERE id <= (SELECT MAX(id) FROM runner_link_audit) - ?", [
        LINK_AUDIT_MAX_ROWS,
      ]);
    }
  }

  /** Newest last. */
  async auditRows(limit = 1000): Promise<LinkAuditRow[]> {
    return await this.#db.all<LinkAuditRow>(
      "SELECT * FROM (SELECT * FROM runner_link_audit ORDER BY id DESC LIMIT ?) AS newest ORDER BY id ASC",
      [limit],
    );
  }
}
