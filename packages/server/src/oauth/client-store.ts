/**
 * The OAuth client rows (oauth/store.ts's table `oauth_clients`): registration data, the
 * `max_dynamic_clients` bound, the `coding_agent:run` provisioning flag and revocation. The lock
 * order of oauth/store.ts's header holds here: a client row before any grant row.
 */
import type { StateEngine, StateQueries } from "../state/engine.js";
import type { OAuthAuditLog } from "./audit-log.js";
import type { ClientRow, NewClient } from "./rows.js";

/** Serialises admitting a dynamic or metadata-document client against `max_dynamic_clients` (a PostgreSQL advisory lock). */
const REGISTRATION_LOCK = "oauth_clients:registration";

export interface OAuthClientStoreDeps {
  engine: StateEngine;
  /** The store's clock as an ISO timestamp. */
  iso: () => string;
  audit: OAuthAuditLog;
  /** Revoke one grant inside `tx` (oauth/store.ts), which already holds the client row's lock. */
  revokeGrant: (tx: StateQueries, grantId: string, reason: string) => Promise<boolean>;
}

export class OAuthClientStore {
  readonly #d: OAuthClientStoreDeps;

  constructor(deps: OAuthClientStoreDeps) {
    this.#d = deps;
  }

  async client(clientId: string): Promise<ClientRow | undefined> {
    return await this.#d.engine.get<ClientRow>("SELECT * FROM oauth_clients WHERE client_id = ?", [clientId]);
  }

  async clients(): Promise<ClientRow[]> {
    return await this.#d.engine.all<ClientRow>("SELECT * FROM oauth_clients ORDER BY created_at, client_id");
  }

  /**
   * Insert or refresh a client's registration data. Never touches `allow_coding_agent_run` or
   * `revoked_at` of an existing row: registration data cannot widen or revive a client.
   */
  async upsert(q: StateQueries, row: NewClient): Promise<void> {
    const now = this.#d.iso();
    await q.run(
      `INSERT INTO oauth_clients (client_id, kind, client_name, redirect_uris, allow_coding_agent_run, created_at, fetched_at, issuer)
       VALUES (?, ?, ?, ?, 0, ?, ?, ?)
       ON CONFLICT (client_id) DO UPDATE SET client_name = excluded.client_name, redirect_uris = excluded.redirect_uris,
         fetched_at = excluded.fetched_at`,
      [
        row.client_id,
        row.kind,
        row.client_name,
        JSON.stringify(row.redirect_uris),
        now,
        row.kind === "cimd" ? now : null,
        row.issuer ?? null,
      ],
    );
  }

  /**
   * Insert or refresh a dynamic or metadata-document client while holding at most `max` of them: a
   * new one first evicts the oldest unprovisioned one without a live grant. Returns false, writing
   * nothing, when none can make room. A dynamic client's registration is audited with it. Atomic in
   * one transaction under REGISTRATION_LOCK, so registrations arriving at several Server instances
   * at once cannot pass the bound.
   */
  async upsertRegistered(row: NewClient & { kind: "dynamic" | "cimd" }, max: number): Promise<boolean> {
    return await this.#d.engine.transaction(
      async (tx) => {
        const known = await tx.get<{ one: number }>("SELECT 1 AS one FROM oauth_clients WHERE client_id = ?", [
          row.client_id,
        ]);
        if (known === undefined) {
          for (;;) {
            const held = await tx.get<{ n: number }>(
              "SELECT COUNT(*) AS n FROM oauth_clients WHERE kind IN ('dynamic', 'cimd')",
            );
            if ((held?.n ?? 0) < max) break;
            const evicted = await tx.run(
              `DELETE FROM oauth_clients WHERE client_id = (
                 SELECT client_id FROM oauth_clients c WHERE kind IN ('dynamic', 'cimd') AND allow_coding_agent_run = 0
                   AND NOT EXISTS (SELECT 1 FROM oauth_grants g WHERE g.client_id = c.client_id AND g.revoked_at IS NULL)
                 ORDER BY created_at, client_id LIMIT 1)`,
            );
            if (evicted.changes === 0) return false;
          }
        }
        await this.upsert(tx, row);
        if (row.kind === "dynamic") {
          await this.#d.audit.append("client_registered", { client_id: row.client_id, detail: "dynamic" }, tx);
        }
        return true;
      },
      { lock: REGISTRATION_LOCK },
    );
  }

  /** Mark a metadata-document client's cached document stale, so the next use fetches it again. */
  async markStale(clientId: string): Promise<void> {
    await this.#d.engine.run("UPDATE oauth_clients SET fetched_at = NULL WHERE client_id = ?", [clientId]);
  }

  /** Provision (or unprovision) a client for `coding_agent:run`. Returns whether the flag changed. */
  async setCodingAgentRun(clientId: string, allow: boolean): Promise<boolean> {
    return await this.#d.engine.transaction(async (tx) => {
      const { changes } = await tx.run(
        "UPDATE oauth_clients SET allow_coding_agent_run = ? WHERE client_id = ? AND allow_coding_agent_run != ?",
        [allow ? 1 : 0, clientId, allow ? 1 : 0],
      );
      if (changes > 0) {
        await this.#d.audit.append(
          allow ? "client_provisioned" : "client_unprovisioned",
          { client_id: clientId, scopes: ["coding_agent:run"] },
          tx,
        );
      }
      return changes > 0;
    });
  }

  /**
   * Revoke a client and every grant it holds, in one transaction: the client row is locked first, so
   * a grant being created for it (createGrantWithCode locks the same row) either committed before
   * and is revoked here, or waits and then sees the client revoked.
   */
  async revoke(clientId: string): Promise<boolean> {
    return await this.#d.engine.transaction(async (tx) => {
      const { changes } = await tx.run(
        "UPDATE oauth_clients SET revoked_at = ? WHERE client_id = ? AND revoked_at IS NULL",
        [this.#d.iso(), clientId],
      );
      if (changes === 0) return false;
      await this.#d.audit.append("client_revoked", { client_id: clientId }, tx);
      const live = await tx.all<{ grant_id: string }>(
        "SELECT grant_id FROM oauth_grants WHERE client_id = ? AND revoked_at IS NULL ORDER BY grant_id FOR UPDATE",
        [clientId],
      );
      for (const g of live) await this.#d.revokeGrant(tx, g.grant_id, "client_revoked");
      return true;
    });
  }
}
