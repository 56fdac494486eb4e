/**
 * Which OAuth clients the operator provisioned for `operator:read` (table `oauth_operator_clients`, schema
 * step 10). Like `coding_agent:run`, consent offers `operator:read` only to such a client, and a token carries
 * it only while its client still is one (provider.ts): unprovisioning takes it away from the next request.
 * Registration and metadata documents never provision a client; only
 * `webcodex-server oauth clients allow-operator-read` does. Read from the state engine on every call (no
 * cache): another Server instance may change it.
 */
import type { OAuthStore } from "./store.js";

export const OPERATOR_READ = "operator:read";

export class OperatorReadClients {
  readonly #store: OAuthStore;

  constructor(store: OAuthStore) {
    this.#store = store;
  }

  async has(clientId: string): Promise<boolean> {
    const row = await this.#store.engine.get<{ one: number }>(
      "SELECT 1 AS one FROM oauth_operator_clients WHERE client_id = ?",
      [clientId],
    );
    return row !== undefined;
  }

  async all(): Promise<Set<string>> {
    const rows = await this.#store.engine.all<{ client_id: string }>("SELECT client_id FROM oauth_operator_clients");
    return new Set(rows.map((r) => r.client_id));
  }

  /**
   * Provision or unprovision; audited as client_provisioned / client_unprovisioned in the same transaction.
   * Returns whether it changed.
   */
  async set(clientId: string, allow: boolean): Promise<boolean> {
    return await this.#store.engine.transaction(async (tx) => {
      const { changes } = allow
        ? await tx.run(
            "INSERT INTO oauth_operator_clients (client_id, provisioned_at) VALUES (?, ?) ON CONFLICT (client_id) DO NOTHING",
            [clientId, new Date().toISOString()],
          )
        : await tx.run("DELETE FROM oauth_operator_clients WHERE client_id = ?", [clientId]);
      if (changes > 0) {
        await this.#store.audit(
          allow ? "client_provisioned" : "client_unprovisioned",
          { client_id: clientId, scopes: [OPERATOR_READ] },
          tx,
        );
      }
      return changes > 0;
    });
  }
}
