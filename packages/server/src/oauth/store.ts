/**
 * The OAuth state on the Server's state engine (state/engine.ts: SQLite, or
 * PostgreSQL shared by several Server instances): clients, grants, codes,
 * access and refresh tokens, and the OAuth audit rows (tables made by
 * migration steps 4 and 9 in state/schema.ts).
 *
 * Invariants:
 * - Codes and tokens are stored only as sha256 hashes; the values exist only
 *   in the response that hands them out. Audit rows hold ids, scopes and
 *   kinds, never a token, code or access key.
 * - A grant's scopes are fixed at consent. Nothing here ever adds a scope to
 *   an existing grant or token; provisioning a client for `coding_agent:run`
 *   changes what a *future* consent may offer.
 * - A refresh token is single-use; presenting a used one revokes its whole
 *   family (the grant and every token issued under it) — except within the
 *   reuse grace window (`[oauth] refresh_reuse_grace_secs`) after its
 *   rotation, when it gets the very pair its rotation issued (a retried or
 *   concurrent refresh), as long as that pair's refresh token is still
 *   unspent. To hand that pair out again without storing a token, the spent
 *   row keeps it in `successor`, AES-256-GCM encrypted under a key derived
 *   (HKDF) from the spent refresh token itself — which the store only holds
 *   as a sha256, so the row cannot be decrypted without the token in hand.
 *   `successor` is erased once the window has passed.
 * - A code is single-use; presenting a used one revokes the grant it produced.
 * - A dynamic client remembers the issuer that registered it (SEP-2352):
 *   under another `public_url` it is not accepted (clients.ts).
 *
 * Concurrency. Every decision is one `engine.transaction` that reads its
 * deciding row `FOR UPDATE` (redeemCode, rotateRefresh, revokeToken,
 * revokeClient, createGrantWithCode) or holds an advisory lock
 * (upsertRegistered), so two Server instances deciding at once serialise:
 * a code is redeemed, and a refresh token rotated, at most once. Lock order,
 * so no two transactions wait for each other: a client row, then grant rows
 * (several only in grant_id order), then that grant's code and token rows —
 * a transaction about a code or token locks its grant first (#lockGrantOf),
 * and the clean-up across grants (#sweep) locks every grant it touches first.
 * Nothing here is cached in memory: another instance may change any row.
 *
 * Files: this one holds grants, codes and tokens (the token family); the
 * client rows are oauth/client-store.ts, the audit rows oauth/audit-log.ts,
 * the row shapes and hashing oauth/rows.ts, the sealed successor pair
 * oauth/successor.ts. OAuthStore is the one object the rest of the Server
 * uses for all of them.
 */
import { randomUUID } from "node:crypto";
import type { StateEngine, StateQueries } from "../state/engine.js";
import { type OAuthAuditFields, OAuthAuditLog } from "./audit-log.js";
import { OAuthClientStore } from "./client-store.js";
import {
  ACCESS_TOKEN_PREFIX,
  type ClientRow,
  CODE_PREFIX,
  CODE_TTL_MS,
  type CodeOutcome,
  type CodeRow,
  type GrantRow,
  type IssuedPair,
  type NewClient,
  type NewGrant,
  type OAuthAuditEvent,
  type OAuthAuditRow,
  parseJsonList,
  REFRESH_TOKEN_PREFIX,
  type RefreshOutcome,
  secret,
  sha256,
  type TokenRow,
  type TokenTtls,
} from "./rows.js";
import { openSuccessor, sealSuccessor } from "./successor.js";

export {
  ACCESS_TOKEN_PREFIX,
  type ClientKind,
  type ClientRow,
  CODE_TTL_MS,
  type CodeOutcome,
  type CodeRow,
  type GrantRow,
  type IssuedPair,
  type NewClient,
  type NewGrant,
  OAUTH_AUDIT_MAX_ROWS,
  type OAuthAuditEvent,
  type OAuthAuditRow,
  parseJsonList,
  REFRESH_TOKEN_PREFIX,
  type RefreshOutcome,
  sha256,
  type TokenRow,
  type TokenTtls,
} from "./rows.js";

/** `used_at` of no spent token is below this: a sweep with it erases no successor. */
const NO_SUCCESSOR_CUTOFF = -1;

export class OAuthStore {
  readonly engine: StateEngine;
  readonly #clock: () => number;
  readonly #audit: OAuthAuditLog;
  readonly #clients: OAuthClientStore;

  /** `engine` is the Server's state, migrated by state/schema.ts (steps 4, 9 and 10 made these tables). */
  constructor(engine: StateEngine, clock: () => number = Date.now) {
    this.engine = engine;
    this.#clock = clock;
    const iso = () => this.#iso();
    this.#audit = new OAuthAuditLog(engine, iso);
    this.#clients = new OAuthClientStore({
      engine,
      iso,
      audit: this.#audit,
      revokeGrant: async (tx, grantId, reason) => await this.#revokeGrant(tx, grantId, reason),
    });
  }

  #iso(): string {
    return new Date(this.#clock()).toISOString();
  }

  // ---- clients (oauth/client-store.ts) -------------------------------------------

  async client(clientId: string): Promise<ClientRow | undefined> {
    return await this.#clients.client(clientId);
  }

  async clients(): Promise<ClientRow[]> {
    return await this.#clients.clients();
  }

  /**
   * Insert or refresh a client's registration data. Never touches `allow_coding_agent_run` or
   * `revoked_at` of an existing row: registration data cannot widen or revive a client.
   */
  async upsertClient(row: NewClient): Promise<void> {
    await this.#clients.upsert(this.engine, row);
  }

  /** Admit a dynamic or metadata-document client under `max` of them (OAuthClientStore.upsertRegistered). */
  async upsertRegistered(row: NewClient & { kind: "dynamic" | "cimd" }, max: number): Promise<boolean> {
    return await this.#clients.upsertRegistered(row, max);
  }

  /** Mark a metadata-document client's cached document stale, so the next use fetches it again. */
  async markStale(clientId: string): Promise<void> {
    await this.#clients.markStale(clientId);
  }

  /** Provision (or unprovision) a client for `coding_agent:run`. Returns whether the flag changed. */
  async setCodingAgentRun(clientId: string, allow: boolean): Promise<boolean> {
    return await this.#clients.setCodingAgentRun(clientId, allow);
  }

  /** Revoke a client and every grant it holds, in one transaction (OAuthClientStore.revoke). */
  async revokeClient(clientId: string): Promise<boolean> {
    return await this.#clients.revoke(clientId);
  }

  // ---- grants --------------------------------------------------------------------

  async grant(grantId: string): Promise<GrantRow | undefined> {
    return await this.engine.get<GrantRow>("SELECT * FROM oauth_grants WHERE grant_id = ?", [grantId]);
  }

  async grants(filter: { principal_id?: string; client_id?: string } = {}): Promise<GrantRow[]> {
    const where: string[] = [];
    const params: string[] = [];
    if (filter.principal_id !== undefined) {
      where.push("principal_id = ?");
      params.push(filter.principal_id);
    }
    if (filter.client_id !== undefined) {
      where.push("client_id = ?");
      params.push(filter.client_id);
    }
    const sql = `SELECT * FROM oauth_grants ${where.length ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY created_at, grant_id`;
    return await this.engine.all<GrantRow>(sql, params);
  }

  /** Whether a person ever allowed this client (any grant, live or revoked): its redirect URI was confirmed. */
  async hasGrant(clientId: string): Promise<boolean> {
    const row = await this.engine.get<{ one: number }>(
      "SELECT 1 AS one FROM oauth_grants WHERE client_id = ? LIMIT 1",
      [clientId],
    );
    return row?.one === 1;
  }

  /**
   * Record a consented grant and its single-use code. Returns the code (shown once), or null when
   * the client was revoked meanwhile (its row is read FOR UPDATE: see revokeClient).
   */
  async createGrantWithCode(
    grant: NewGrant,
    code: { redirect_uri: string; code_challenge: string },
  ): Promise<{ grant_id: string; code: string } | null> {
    const grantId = `grt_${randomUUID().replaceAll("-", "").slice(0, 20)}`;
    const value = secret(CODE_PREFIX);
    // Keep the tables bounded: spent codes past their life and expired tokens go as new grants arrive.
    await this.#sweep(this.#clock(), NO_SUCCESSOR_CUTOFF);
    return await this.engine.transaction(async (tx) => {
      const client = await tx.get<{ revoked_at: string | null }>(
        "SELECT revoked_at FROM oauth_clients WHERE client_id = ? FOR UPDATE",
        [grant.client_id],
      );
      if (client !== undefined && client.revoked_at !== null) return null;
      const now = this.#clock();
      await tx.run(
        `INSERT INTO oauth_grants (grant_id, client_id, principal_id, key_id, scopes, projects, resource, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
        [
          grantId,
          grant.client_id,
          grant.principal_id,
          grant.key_id,
          JSON.stringify(grant.scopes),
          JSON.stringify(grant.projects),
          grant.resource,
          new Date(now).toISOString(),
        ],
      );
      await tx.run(
        `INSERT INTO oauth_codes (code_hash, grant_id, client_id, redirect_uri, code_challenge, expires_at)
         VALUES (?, ?, ?, ?, ?, ?)`,
        [sha256(value), grantId, grant.client_id, code.redirect_uri, code.code_challenge, now + CODE_TTL_MS],
      );
      await this.audit(
        "grant",
        { client_id: grant.client_id, principal_id: grant.principal_id, grant_id: grantId, scopes: grant.scopes },
        tx,
      );
      return { grant_id: grantId, code: value };
    });
  }

  /** Revoke a grant (a token family): every access and refresh token under it stops working. */
  async revokeGrant(grantId: string, reason: string): Promise<boolean> {
    return await this.engine.transaction(async (tx) => await this.#revokeGrant(tx, grantId, reason));
  }

  async #revokeGrant(tx: StateQueries, grantId: string, reason: string): Promise<boolean> {
    const { changes } = await tx.run(
      "UPDATE oauth_grants SET revoked_at = ?, revoked_reason = ? WHERE grant_id = ? AND revoked_at IS NULL",
      [this.#iso(), reason, grantId],
    );
    if (changes === 0) return false;
    await tx.run("DELETE FROM oauth_tokens WHERE grant_id = ?", [grantId]);
    const g = await tx.get<GrantRow>("SELECT * FROM oauth_grants WHERE grant_id = ?", [grantId]);
    await this.audit(
      "grant_revoked",
      { grant_id: grantId, client_id: g?.client_id ?? null, principal_id: g?.principal_id ?? null, detail: reason },
      tx,
    );
    return true;
  }

  /**
   * Lock the grant a code or token belongs to, first (the lock order in the header), and return it.
   * undefined when no such code or token exists.
   */
  async #lockGrantOf(
    tx: StateQueries,
    table: "oauth_codes" | "oauth_tokens",
    hash: string,
  ): Promise<GrantRow | undefined> {
    const column = table === "oauth_codes" ? "code_hash" : "token_hash";
    return await tx.get<GrantRow>(
      `SELECT * FROM oauth_grants WHERE grant_id = (SELECT grant_id FROM ${table} WHERE ${column} = ?) FOR UPDATE`,
      [hash],
    );
  }

  /**
   * Delete codes past their life and expired tokens, and erase successors of tokens spent before
   * `successorsSpentBefore`, across all grants. Its own transaction, before the caller's decision:
   * it locks every grant it touches first, in grant_id order (the lock order in the header), so it
   * never waits for a family that waits for it.
   */
  async #sweep(now: number, successorsSpentBefore: number): Promise<void> {
    const codesBefore = now - CODE_TTL_MS;
    await this.engine.transaction(async (tx) => {
      const locked = await tx.all<{ grant_id: string }>(
        `SELECT grant_id FROM oauth_grants WHERE grant_id IN (
           SELECT grant_id FROM oauth_codes WHERE expires_at < ?
           UNION SELECT grant_id FROM oauth_tokens
             WHERE expires_at <= ? OR (successor IS NOT NULL AND used_at < ?))
         ORDER BY grant_id FOR UPDATE`,
        [codesBefore, now, successorsSpentBefore],
      );
      if (locked.length === 0) return;
      await tx.run("DELETE FROM oauth_codes WHERE expires_at < ?", [codesBefore]);
      await tx.run("DELETE FROM oauth_tokens WHERE expires_at <= ?", [now]);
      await tx.run("UPDATE oauth_tokens SET successor = NULL WHERE successor IS NOT NULL AND used_at < ?", [
        successorsSpentBefore,
      ]);
    });
  }

  // ---- codes ---------------------------------------------------------------------

  /** The PKCE challenge a code was issued with (the SDK's token handler verifies the verifier). */
  async codeChallenge(code: string, clientId: string): Promise<string | undefined> {
    const row = await this.engine.get<CodeRow>("SELECT * FROM oauth_codes WHERE code_hash = ?", [sha256(code)]);
    return row && row.client_id === clientId ? row.code_challenge : undefined;
  }

  /**
   * Redeem a code once; a second redemption revokes the grant it produced (RFC 6749 §4.1.2). At
   * most once because this one transaction reads the code's row FOR UPDATE (after its grant's): a
   * concurrent redemption waits, then finds it used.
   */
  async redeemCode(
    code: string,
    clientId: string,
    redirectUri: string | undefined,
    ttl: TokenTtls,
  ): Promise<CodeOutcome> {
    const hash = sha256(code);
    return await this.engine.transaction(async (tx): Promise<CodeOutcome> => {
      const grant = await this.#lockGrantOf(tx, "oauth_codes", hash);
      const row = await tx.get<CodeRow>("SELECT * FROM oauth_codes WHERE code_hash = ? FOR UPDATE", [hash]);
      if (!row) return { ok: false, reason: "unknown" };
      if (row.client_id !== clientId) return { ok: false, reason: "other_client" };
      const now = this.#clock();
      if (row.used_at !== null) {
        await this.audit("code_reused", { client_id: clientId, grant_id: row.grant_id }, tx);
        await this.#revokeGrant(tx, row.grant_id, "code_reused");
        return { ok: false, reason: "reused" };
      }
      await tx.run("UPDATE oauth_codes SET used_at = ? WHERE code_hash = ?", [now, row.code_hash]);
      if (row.expires_at <= now) return { ok: false, reason: "expired" };
      if (redirectUri !== undefined && redirectUri !== row.redirect_uri)
        return { ok: false, reason: "redirect_mismatch" };
      if (!grant || grant.revoked_at !== null) return { ok: false, reason: "revoked" };
      return { ok: true, grant, pair: await this.#issuePair(tx, grant, parseJsonList(grant.scopes), ttl) };
    });
  }

  // ---- tokens --------------------------------------------------------------------

  /** A new access + refresh pair of `grant` (inside the caller's transaction, which holds the grant's lock). */
  async #issuePair(tx: StateQueries, grant: GrantRow, accessScopes: string[], ttl: TokenTtls): Promise<IssuedPair> {
    const now = this.#clock();
    const access = secret(ACCESS_TOKEN_PREFIX);
    const refresh = secret(REFRESH_TOKEN_PREFIX);
    const insert = `INSERT INTO oauth_tokens (token_hash, kind, grant_id, client_id, scopes, resource, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)`;
    const accessExpires = now + ttl.accessMs;
    await tx.run(insert, [
      sha256(access),
      "access",
      grant.grant_id,
      grant.client_id,
      JSON.stringify(accessScopes),
      grant.resource,
      accessExpires,
    ]);
    await tx.run(insert, [
      sha256(refresh),
      "refresh",
      grant.grant_id,
      grant.client_id,
      grant.scopes,
      grant.resource,
      now + ttl.refreshMs,
    ]);
    // Expired rows of this grant are dead weight: drop them as the family moves on.
    await tx.run("DELETE FROM oauth_tokens WHERE grant_id = ? AND expires_at <= ?", [grant.grant_id, now]);
    return { access_token: access, refresh_token: refresh, access_expires_at: accessExpires };
  }

  /**
   * Rotate a refresh token: the presented one is spent and a new pair is issued. A spent one
   * presented again within `ttl.reuseGraceMs` of its rotation gets the same pair again (while that
   * pair's refresh token is unspent and the grant live); otherwise it revokes the family.
   * `scopes` may narrow the new access token, never widen it. At most once because this one
   * transaction reads the token's row FOR UPDATE (after its grant's): a concurrent rotation waits,
   * then finds it spent.
   */
  async rotateRefresh(
    refresh: string,
    clientId: string,
    scopes: string[] | undefined,
    ttl: TokenTtls,
  ): Promise<RefreshOutcome> {
    const hash = sha256(refresh);
    // Successors past their window are erased as rotations go by.
    const started = this.#clock();
    await this.#sweep(started, started - ttl.reuseGraceMs);
    return await this.engine.transaction(async (tx): Promise<RefreshOutcome> => {
      const grant = await this.#lockGrantOf(tx, "oauth_tokens", hash);
      const row = await tx.get<TokenRow>(
        "SELECT * FROM oauth_tokens WHERE token_hash = ? AND kind = 'refresh' FOR UPDATE",
        [hash],
      );
      if (!row) return { ok: false, reason: "unknown" };
      if (row.client_id !== clientId) return { ok: false, reason: "other_client" };
      const now = this.#clock();
      if (row.used_at !== null) {
        const replay = now - row.used_at <= ttl.reuseGraceMs ? await this.#replay(tx, row, grant, refresh) : null;
        if (replay) {
          await this.audit(
            "refresh_replayed",
            { client_id: clientId, grant_id: row.grant_id, detail: "within grace" },
            tx,
          );
          return replay;
        }
        await this.audit("refresh_reused", { client_id: clientId, grant_id: row.grant_id }, tx);
        await this.#revokeGrant(tx, row.grant_id, "refresh_reused");
        return { ok: false, reason: "reused" };
      }
      if (row.expires_at <= now) return { ok: false, reason: "expired" };
      if (!grant || grant.revoked_at !== null) return { ok: false, reason: "revoked" };
      const allowed = parseJsonList(row.scopes);
      const wanted = scopes ?? allowed;
      if (wanted.some((s) => !allowed.includes(s))) return { ok: false, reason: "scope_widened" };
      const pair = await this.#issuePair(tx, grant, wanted, ttl);
      const successor =
        ttl.reuseGraceMs > 0 ? sealSuccessor(refresh, row.token_hash, { ...pair, scopes: wanted }) : null;
      await tx.run("UPDATE oauth_tokens SET used_at = ?, successor = ? WHERE token_hash = ?", [
        now,
        successor,
        row.token_hash,
      ]);
      return { ok: true, grant, pair, scopes: wanted, replayed: false };
    });
  }

  /** The pair a spent refresh token's rotation issued, if it still stands (inside rotateRefresh's transaction). */
  async #replay(
    tx: StateQueries,
    row: TokenRow,
    grant: GrantRow | undefined,
    refresh: string,
  ): Promise<RefreshOutcome | null> {
    if (row.successor === null) return null;
    const sealed = openSuccessor(refresh, row.token_hash, row.successor);
    if (!sealed) return null;
    const next = await tx.get<TokenRow>("SELECT * FROM oauth_tokens WHERE token_hash = ? AND kind = 'refresh'", [
      sha256(sealed.refresh_token),
    ]);
    if (!next || next.used_at !== null || next.grant_id !== row.grant_id) return null;
    if (!grant || grant.revoked_at !== null) return null;
    const { scopes, ...pair } = sealed;
    return { ok: true, grant, pair, scopes, replayed: true };
  }

  /** A live, unexpired access token's row, or undefined. */
  async accessToken(token: string): Promise<TokenRow | undefined> {
    const row = await this.engine.get<TokenRow>("SELECT * FROM oauth_tokens WHERE token_hash = ? AND kind = 'access'", [
      sha256(token),
    ]);
    if (!row || row.expires_at <= this.#clock()) return undefined;
    return row;
  }

  /** RFC 7009: revoke one token of this client. A refresh token takes its whole family with it. */
  async revokeToken(token: string, clientId: string): Promise<void> {
    const hash = sha256(token);
    await this.engine.transaction(async (tx) => {
      await this.#lockGrantOf(tx, "oauth_tokens", hash);
      const row = await tx.get<TokenRow>("SELECT * FROM oauth_tokens WHERE token_hash = ? FOR UPDATE", [hash]);
      if (!row || row.client_id !== clientId) return;
      if (row.kind === "refresh") {
        await this.#revokeGrant(tx, row.grant_id, "refresh_token_revoked");
        return;
      }
      await tx.run("DELETE FROM oauth_tokens WHERE token_hash = ?", [row.token_hash]);
      await this.audit("token_revoked", { client_id: clientId, grant_id: row.grant_id, detail: "access" }, tx);
    });
  }

  // ---- audit (oauth/audit-log.ts) ------------------------------------------------

  /** Append an audit row (in `tx` when given, so it commits or rolls back with the change it records). */
  async audit(event: OAuthAuditEvent, fields: OAuthAuditFields, tx?: StateQueries): Promise<void> {
    await this.#audit.append(event, fields, tx);
  }

  /** The newest `limit` audit rows, oldest first. */
  async auditRows(limit = 1000): Promise<OAuthAuditRow[]> {
    return await this.#audit.rows(limit);
  }

  /** The newest `limit` rows of the given events, newest first (the console's refusals list). */
  async auditRowsOf(events: readonly OAuthAuditEvent[], limit: number): Promise<OAuthAuditRow[]> {
    return await this.#audit.rowsOf(events, limit);
  }
}
