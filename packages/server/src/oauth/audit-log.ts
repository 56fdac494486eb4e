/**
 * The OAuth audit rows (oauth/store.ts's table `oauth_audit`): appended in the transaction of the
 * change they record, trimmed to OAUTH_AUDIT_MAX_ROWS on insert. They hold ids, scopes and kinds,
 * never a token, code or access key.
 */
import type { StateEngine, StateQueries } from "../state/engine.js";
import { OAUTH_AUDIT_MAX_ROWS, type OAuthAuditEvent, type OAuthAuditRow } from "./rows.js";

export interface OAuthAuditFields {
  client_id?: string | null;
  principal_id?: string | null;
  grant_id?: string | null;
  scopes?: readonly string[];
  detail?: string;
}

export class OAuthAuditLog {
  readonly #engine: StateEngine;
  readonly #iso: () => string;

  /** `iso` is the store's clock as an ISO timestamp. */
  constructor(engine: StateEngine, iso: () => string) {
    this.#engine = engine;
    this.#iso = iso;
  }

  /** Append an audit row (in `tx` when given, so it commits or rolls back with the change it records). */
  async append(event: OAuthAuditEvent, fields: OAuthAuditFields, tx?: StateQueries): Promise<void> {
    if (tx === undefined) {
      await this.#engine.transaction(async (own) => await this.append(event, fields, own));
      return;
    }
    await tx.run(
      "INSERT INTO oauth_audit (at, event, client_id, principal_id, grant_id, scopes, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
      [
        this.#iso(),
        event,
        fields.client_id ?? null,
        fields.principal_id ?? null,
        fields.grant_id ?? null,
        fields.scopes ? fields.scopes.join(" ") : null,
        fields.detail ?? null,
      ],
    );
    await tx.run("DELETE FROM oauth_audit WHERE id <= (SELECT MAX(id) FROM oauth_audit) - ?", [OAUTH_AUDIT_MAX_ROWS]);
  }

  /** The newest `limit` audit rows, oldest first. */
  async rows(limit: number): Promise<OAuthAuditRow[]> {
    return await this.#engine.all<OAuthAuditRow>(
      "SELECT * FROM (SELECT * FROM oauth_audit ORDER BY id DESC LIMIT ?) AS recent ORDER BY id",
      [limit],
    );
  }

  /** The newest `limit` rows of the given events, newest first (the console's refusals list). */
  async rowsOf(events: readonly OAuthAuditEvent[], limit: number): Promise<OAuthAuditRow[]> {
    if (events.length === 0) return [];
    return await this.#engine.all<OAuthAuditRow>(
      `SELECT * FROM oauth_audit WHERE event IN (${events.map(() => "?").join(", ")}) ORDER BY id DESC LIMIT ?`,
      [...events, limit],
    );
  }
}
