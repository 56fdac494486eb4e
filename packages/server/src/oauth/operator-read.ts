/**
 * Which OAuth clients the operator provisioned for `operator:read` (table `oauth_operator_clients`, additive:
 * it creates itself). Like `coding_agent:run`, consent offers `operator:read` only to such a client, and a
 * token carries it only while its client still is one (provider.ts): unprovisioning takes it away from the
 * next request. Registration and metadata documents never provision a client; only
 * `webcodex-server oauth clients allow-operator-read` does.
 */
import type BetterSqlite3 from "better-sqlite3";
import type { OAuthStore } from "./store.js";

export const OPERATOR_READ = "operator:read";

const SCHEMA = `
CREATE TABLE IF NOT EXISTS oauth_operator_clients (
  client_id TEXT PRIMARY KEY,
  provisioned_at TEXT NOT NULL
);
`;

export class OperatorReadClients {
  readonly #db: BetterSqlite3.Database;
  readonly #store: OAuthStore;

  constructor(store: OAuthStore) {
    store.db.exec(SCHEMA);
    this.#db = store.db;
    this.#store = store;
  }

  has(clientId: string): boolean {
    return this.#db.prepare("SELECT 1 FROM oauth_operator_clients WHERE client_id = ?").get(clientId) !== undefined;
  }

  all(): Set<string> {
    return new Set(this.#db.prepare<[], string>("SELECT client_id FROM oauth_operator_clients").pluck().all());
  }

  /** Provision or unprovision; audited as client_provisioned / client_unprovisioned. Returns whether it changed. */
  set(clientId: string, allow: boolean): boolean {
    const changed = allow
      ? this.#db
          .prepare("INSERT OR IGNORE INTO oauth_operator_clients (client_id, provisioned_at) VALUES (?, ?)")
          .run(clientId, new Date().toISOString()).changes
      : this.#db.prepare("DELETE FROM oauth_operator_clients WHERE client_id = ?").run(clientId).changes;
    if (changed > 0) {
      this.#store.audit(allow ? "client_provisioned" : "client_unprovisioned", {
        client_id: clientId,
        scopes: [OPERATOR_READ],
      });
    }
    return changed > 0;
  }
}
