/**
 * The OAuth state in the Server's SQLite database: clients, grants, codes,
 * access and refresh tokens, and the OAuth audit rows (tables made by
 * migration step 4 in state/schema.ts).
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
 */
import { createCipheriv, createDecipheriv, createHash, hkdfSync, randomBytes, randomUUID } from "node:crypto";
import type BetterSqlite3 from "better-sqlite3";
import type { Scope } from "../principals/principal.js";

export type ClientKind = "dynamic" | "cimd" | "operator";

export interface ClientRow {
  client_id: string;
  kind: ClientKind;
  client_name: string | null;
  /** JSON array. */
  redirect_uris: string;
  allow_coding_agent_run: number;
  created_at: string;
  /** For metadata-document clients: when the document was last fetched (null: never). */
  fetched_at: string | null;
  revoked_at: string | null;
  /** The issuer (`public_url`) a dynamic client was registered under; null for other kinds and older rows. */
  issuer: string | null;
}

export interface GrantRow {
  grant_id: string;
  client_id: string;
  principal_id: string;
  /** The access key's token id (`tok_…`), or null for a key declared in the config. */
  key_id: string | null;
  scopes: string;
  projects: string;
  resource: string;
  created_at: string;
  revoked_at: string | null;
  revoked_reason: string | null;
}

export interface CodeRow {
  code_hash: string;
  grant_id: string;
  client_id: string;
  redirect_uri: string;
  code_challenge: string;
  expires_at: number;
  used_at: number | null;
}

export interface TokenRow {
  token_hash: string;
  kind: "access" | "refresh";
  grant_id: string;
  client_id: string;
  scopes: string;
  resource: string;
  expires_at: number;
  used_at: number | null;
  /** A spent refresh token's successor pair, encrypted (see the header); null outside the grace window. */
  successor: Buffer | null;
}

export type OAuthAuditEvent =
  | "grant"
  | "consent_denied"
  | "code_reused"
  | "refresh_reused"
  | "refresh_replayed"
  | "grant_revoked"
  | "client_registered"
  | "client_revoked"
  | "client_provisioned"
  | "client_unprovisioned"
  | "token_revoked";

export interface OAuthAuditRow {
  id: number;
  at: string;
  event: OAuthAuditEvent;
  client_id: string | null;
  principal_id: string | null;
  grant_id: string | null;
  scopes: string | null;
  detail: string | null;
}

/** Authorization codes live at most this long (OAuth 2.1 recommends ≤ 10 min; the issue asks ≤ 60 s). */
export const CODE_TTL_MS = 60_000;
/** OAuth audit rows kept; older ones are trimmed on insert. */
export const OAUTH_AUDIT_MAX_ROWS = 100_000;

export const ACCESS_TOKEN_PREFIX = "wcoa_";
export const REFRESH_TOKEN_PREFIX = "wcor_";
const CODE_PREFIX = "wcoc_";

export function sha256(value: string): string {
  return createHash("sha256").update(value, "utf8").digest("hex");
}

function secret(prefix: string): string {
  return prefix + randomBytes(32).toString("base64url");
}

export function parseJsonList(json: string | null): string[] {
  if (json === null) return [];
  try {
    const value: unknown = JSON.parse(json);
    return Array.isArray(value) ? value.filter((v): v is string => typeof v === "string") : [];
  } catch {
    return [];
  }
}

export interface NewGrant {
  client_id: string;
  principal_id: string;
  key_id: string | null;
  scopes: readonly Scope[];
  projects: readonly string[];
  resource: string;
}

export interface IssuedPair {
  access_token: string;
  refresh_token: string;
  access_expires_at: number;
}

export type RefreshOutcome =
  | { ok: true; grant: GrantRow; pair: IssuedPair; scopes: string[]; replayed: boolean }
  | { ok: false; reason: "unknown" | "expired" | "reused" | "revoked" | "other_client" | "scope_widened" };

export type CodeOutcome =
  | { ok: true; grant: GrantRow; pair: IssuedPair }
  | { ok: false; reason: "unknown" | "expired" | "reused" | "other_client" | "redirect_mismatch" | "revoked" };

export class OAuthStore {
  readonly db: BetterSqlite3.Database;
  readonly #clock: () => number;

  /** `db` is the Server's state DB, migrated by state/schema.ts (step 4 made these tables). */
  constructor(db: BetterSqlite3.Database, clock: () => number = Date.now) {
    this.db = db;
    this.#clock = clock;
  }

  // ---- clients -------------------------------------------------------------------

  client(clientId: string): ClientRow | undefined {
    return this.db.prepare<[string], ClientRow>("SELECT * FROM oauth_clients WHERE client_id = ?").get(clientId);
  }

  clients(): ClientRow[] {
    return this.db.prepare<[], ClientRow>("SELECT * FROM oauth_clients ORDER BY created_at").all();
  }

  /**
   * Insert or refresh a client's registration data. Never touches `allow_coding_agent_run` or
   * `revoked_at` of an existing row: registration data cannot widen or revive a client.
   */
  upsertClient(row: {
    client_id: string;
    kind: ClientKind;
    client_name: string | null;
    redirect_uris: string[];
    /** The issuer a dynamic client is registered under; kept as first written. */
    issuer?: string | null;
  }): void {
    const now = new Date(this.#clock()).toISOString();
    this.db
      .prepare(
        `INSERT INTO oauth_clients (client_id, kind, client_name, redirect_uris, allow_coding_agent_run, created_at, fetched_at, issuer)
         VALUES (@client_id, @kind, @client_name, @redirect_uris, 0, @now, CASE WHEN @kind = 'cimd' THEN @now END, @issuer)
         ON CONFLICT (client_id) DO UPDATE SET client_name = excluded.client_name, redirect_uris = excluded.redirect_uris,
           fetched_at = excluded.fetched_at`,
      )
      .run({ ...row, issuer: row.issuer ?? null, redirect_uris: JSON.stringify(row.redirect_uris), now });
  }

  /** Dynamic and metadata-document clients held (what max_dynamic_clients bounds). */
  countRegistered(): number {
    return (
      this.db
        .prepare<[], { n: number }>("SELECT COUNT(*) AS n FROM oauth_clients WHERE kind IN ('dynamic', 'cimd')")
        .get()?.n ?? 0
    );
  }

  /** Delete the oldest unprovisioned dynamic/metadata client with no live grant; false when none qualifies. */
  evictOldestUnused(): boolean {
    const row = this.db
      .prepare<[], { client_id: string }>(
        `SELECT client_id FROM oauth_clients c WHERE kind IN ('dynamic', 'cimd') AND allow_coding_agent_run = 0
           AND NOT EXISTS (SELECT 1 FROM oauth_grants g WHERE g.client_id = c.client_id AND g.revoked_at IS NULL)
         ORDER BY created_at LIMIT 1`,
      )
      .get();
    if (!row) return false;
    this.db.prepare("DELETE FROM oauth_clients WHERE client_id = ?").run(row.client_id);
    return true;
  }

  /** Provision (or unprovision) a client for `coding_agent:run`. Returns whether the flag changed. */
  setCodingAgentRun(clientId: string, allow: boolean): boolean {
    const changed = this.db
      .prepare(
        "UPDATE oauth_clients SET allow_coding_agent_run = ? WHERE client_id = ? AND allow_coding_agent_run != ?",
      )
      .run(allow ? 1 : 0, clientId, allow ? 1 : 0).changes;
    if (changed > 0) {
      this.audit(allow ? "client_provisioned" : "client_unprovisioned", {
        client_id: clientId,
        scopes: ["coding_agent:run"],
      });
    }
    return changed > 0;
  }

  /** Revoke a client and every grant it holds. */
  revokeClient(clientId: string): boolean {
    return this.db.transaction(() => {
      const changed = this.db
        .prepare("UPDATE oauth_clients SET revoked_at = ? WHERE client_id = ? AND revoked_at IS NULL")
        .run(new Date(this.#clock()).toISOString(), clientId).changes;
      if (changed === 0) return false;
      this.audit("client_revoked", { client_id: clientId });
      for (const g of this.grants({ client_id: clientId })) {
        if (g.revoked_at === null) this.revokeGrant(g.grant_id, "client_revoked");
      }
      return true;
    })();
  }

  // ---- grants --------------------------------------------------------------------

  grant(grantId: string): GrantRow | undefined {
    return this.db.prepare<[string], GrantRow>("SELECT * FROM oauth_grants WHERE grant_id = ?").get(grantId);
  }

  grants(filter: { principal_id?: string; client_id?: string } = {}): GrantRow[] {
    const where: string[] = [];
    if (filter.principal_id !== undefined) where.push("principal_id = @principal_id");
    if (filter.client_id !== undefined) where.push("client_id = @client_id");
    const sql = `SELECT * FROM oauth_grants ${where.length ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY created_at`;
    return this.db.prepare<Record<string, string>, GrantRow>(sql).all(filter as Record<string, string>);
  }

  /** Whether a person ever allowed this client (any grant, live or revoked): its redirect URI was confirmed. */
  hasGrant(clientId: string): boolean {
    return (
      this.db
        .prepare<[string], { one: number }>("SELECT 1 AS one FROM oauth_grants WHERE client_id = ? LIMIT 1")
        .get(clientId)?.one === 1
    );
  }

  /** Record a consented grant and its single-use code. Returns the code (shown once). */
  createGrantWithCode(
    grant: NewGrant,
    code: { redirect_uri: string; code_challenge: string },
  ): {
    grant_id: string;
    code: string;
  } {
    const grantId = `grt_${randomUUID().replaceAll("-", "").slice(0, 20)}`;
    const value = secret(CODE_PREFIX);
    const now = this.#clock();
    this.db.transaction(() => {
      // Keep the tables bounded: spent codes past their life and expired tokens go as new grants arrive.
      this.db.prepare("DELETE FROM oauth_codes WHERE expires_at < ?").run(now - CODE_TTL_MS);
      this.db.prepare("DELETE FROM oauth_tokens WHERE expires_at <= ?").run(now);
      this.db
        .prepare(
          `INSERT INTO oauth_grants (grant_id, client_id, principal_id, key_id, scopes, projects, resource, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
        )
        .run(
          grantId,
          grant.client_id,
          grant.principal_id,
          grant.key_id,
          JSON.stringify(grant.scopes),
          JSON.stringify(grant.projects),
          grant.resource,
          new Date(now).toISOString(),
        );
      this.db
        .prepare(
          `INSERT INTO oauth_codes (code_hash, grant_id, client_id, redirect_uri, code_challenge, expires_at)
           VALUES (?, ?, ?, ?, ?, ?)`,
        )
        .run(sha256(value), grantId, grant.client_id, code.redirect_uri, code.code_challenge, now + CODE_TTL_MS);
      this.audit("grant", {
        client_id: grant.client_id,
        principal_id: grant.principal_id,
        grant_id: grantId,
        scopes: grant.scopes,
      });
    })();
    return { grant_id: grantId, code: value };
  }

  /** Revoke a grant (a token family): every access and refresh token under it stops working. */
  revokeGrant(grantId: string, reason: string): boolean {
    const changed = this.db
      .prepare("UPDATE oauth_grants SET revoked_at = ?, revoked_reason = ? WHERE grant_id = ? AND revoked_at IS NULL")
      .run(new Date(this.#clock()).toISOString(), reason, grantId).changes;
    if (changed === 0) return false;
    this.db.prepare("DELETE FROM oauth_tokens WHERE grant_id = ?").run(grantId);
    const g = this.grant(grantId);
    this.audit("grant_revoked", {
      grant_id: grantId,
      client_id: g?.client_id ?? null,
      principal_id: g?.principal_id ?? null,
      detail: reason,
    });
    return true;
  }

  // ---- codes ---------------------------------------------------------------------

  /** The PKCE challenge a code was issued with (the SDK's token handler verifies the verifier). */
  codeChallenge(code: string, clientId: string): string | undefined {
    const row = this.db.prepare<[string], CodeRow>("SELECT * FROM oauth_codes WHERE code_hash = ?").get(sha256(code));
    return row && row.client_id === clientId ? row.code_challenge : undefined;
  }

  /** Redeem a code once; a second redemption revokes the grant it produced (RFC 6749 §4.1.2). */
  redeemCode(code: string, clientId: string, redirectUri: string | undefined, ttl: TokenTtls): CodeOutcome {
    return this.db.transaction((): CodeOutcome => {
      const row = this.db.prepare<[string], CodeRow>("SELECT * FROM oauth_codes WHERE code_hash = ?").get(sha256(code));
      if (!row) return { ok: false, reason: "unknown" };
      if (row.client_id !== clientId) return { ok: false, reason: "other_client" };
      const now = this.#clock();
      if (row.used_at !== null) {
        this.audit("code_reused", { client_id: clientId, grant_id: row.grant_id });
        this.revokeGrant(row.grant_id, "code_reused");
        return { ok: false, reason: "reused" };
      }
      this.db.prepare("UPDATE oauth_codes SET used_at = ? WHERE code_hash = ?").run(now, row.code_hash);
      if (row.expires_at <= now) return { ok: false, reason: "expired" };
      if (redirectUri !== undefined && redirectUri !== row.redirect_uri)
        return { ok: false, reason: "redirect_mismatch" };
      const grant = this.grant(row.grant_id);
      if (!grant || grant.revoked_at !== null) return { ok: false, reason: "revoked" };
      return { ok: true, grant, pair: this.#issuePair(grant, parseJsonList(grant.scopes), ttl) };
    })();
  }

  // ---- tokens --------------------------------------------------------------------

  #issuePair(grant: GrantRow, accessScopes: string[], ttl: TokenTtls): IssuedPair {
    const now = this.#clock();
    const access = secret(ACCESS_TOKEN_PREFIX);
    const refresh = secret(REFRESH_TOKEN_PREFIX);
    const insert = this.db.prepare(
      `INSERT INTO oauth_tokens (token_hash, kind, grant_id, client_id, scopes, resource, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
    );
    const accessExpires = now + ttl.accessMs;
    insert.run(
      sha256(access),
      "access",
      grant.grant_id,
      grant.client_id,
      JSON.stringify(accessScopes),
      grant.resource,
      accessExpires,
    );
    insert.run(
      sha256(refresh),
      "refresh",
      grant.grant_id,
      grant.client_id,
      grant.scopes,
      grant.resource,
      now + ttl.refreshMs,
    );
    // Expired rows of this grant are dead weight: drop them as the family moves on.
    this.db.prepare("DELETE FROM oauth_tokens WHERE grant_id = ? AND expires_at <= ?").run(grant.grant_id, now);
    return { access_token: access, refresh_token: refresh, access_expires_at: accessExpires };
  }

  /**
   * Rotate a refresh token: the presented one is spent and a new pair is issued. A spent one
   * presented again within `ttl.reuseGraceMs` of its rotation gets the same pair again (while that
   * pair's refresh token is unspent and the grant live); otherwise it revokes the family.
   * `scopes` may narrow the new access token, never widen it.
   */
  rotateRefresh(refresh: string, clientId: string, scopes: string[] | undefined, ttl: TokenTtls): RefreshOutcome {
    return this.db.transaction((): RefreshOutcome => {
      const row = this.db
        .prepare<[string], TokenRow>("SELECT * FROM oauth_tokens WHERE token_hash = ? AND kind = 'refresh'")
        .get(sha256(refresh));
      if (!row) return { ok: false, reason: "unknown" };
      if (row.client_id !== clientId) return { ok: false, reason: "other_client" };
      const now = this.#clock();
      if (row.used_at !== null) {
        const replay = now - row.used_at <= ttl.reuseGraceMs ? this.#replay(row, refresh) : null;
        if (replay) {
          this.audit("refresh_replayed", { client_id: clientId, grant_id: row.grant_id, detail: "within grace" });
          return replay;
        }
        this.audit("refresh_reused", { client_id: clientId, grant_id: row.grant_id });
        this.revokeGrant(row.grant_id, "refresh_reused");
        return { ok: false, reason: "reused" };
      }
      if (row.expires_at <= now) return { ok: false, reason: "expired" };
      const grant = this.grant(row.grant_id);
      if (!grant || grant.revoked_at !== null) return { ok: false, reason: "revoked" };
      const allowed = parseJsonList(row.scopes);
      const wanted = scopes ?? allowed;
      if (wanted.some((s) => !allowed.includes(s))) return { ok: false, reason: "scope_widened" };
      const pair = this.#issuePair(grant, wanted, ttl);
      const successor =
        ttl.reuseGraceMs > 0 ? sealSuccessor(refresh, row.token_hash, { ...pair, scopes: wanted }) : null;
      this.db
        .prepare("UPDATE oauth_tokens SET used_at = ?, successor = ? WHERE token_hash = ?")
        .run(now, successor, row.token_hash);
      // Successors past their window are erased as rotations go by.
      this.db
        .prepare("UPDATE oauth_tokens SET successor = NULL WHERE successor IS NOT NULL AND used_at < ?")
        .run(now - ttl.reuseGraceMs);
      return { ok: true, grant, pair, scopes: wanted, replayed: false };
    })();
  }

  /** The pair a spent refresh token's rotation issued, if it still stands (inside rotateRefresh's transaction). */
  #replay(row: TokenRow, refresh: string): RefreshOutcome | null {
    if (row.successor === null) return null;
    const sealed = openSuccessor(refresh, row.token_hash, row.successor);
    if (!sealed) return null;
    const next = this.db
      .prepare<[string], TokenRow>("SELECT * FROM oauth_tokens WHERE token_hash = ? AND kind = 'refresh'")
      .get(sha256(sealed.refresh_token));
    if (!next || next.used_at !== null || next.grant_id !== row.grant_id) return null;
    const grant = this.grant(row.grant_id);
    if (!grant || grant.revoked_at !== null) return null;
    const { scopes, ...pair } = sealed;
    return { ok: true, grant, pair, scopes, replayed: true };
  }

  /** A live, unexpired access token's row, or undefined. */
  accessToken(token: string): TokenRow | undefined {
    const row = this.db
      .prepare<[string], TokenRow>("SELECT * FROM oauth_tokens WHERE token_hash = ? AND kind = 'access'")
      .get(sha256(token));
    if (!row || row.expires_at <= this.#clock()) return undefined;
    return row;
  }

  /** RFC 7009: revoke one token of this client. A refresh token takes its whole family with it. */
  revokeToken(token: string, clientId: string): void {
    const row = this.db
      .prepare<[string], TokenRow>("SELECT * FROM oauth_tokens WHERE token_hash = ?")
      .get(sha256(token));
    if (!row || row.client_id !== clientId) return;
    if (row.kind === "refresh") {
      this.revokeGrant(row.grant_id, "refresh_token_revoked");
      return;
    }
    this.db.prepare("DELETE FROM oauth_tokens WHERE token_hash = ?").run(row.token_hash);
    this.audit("token_revoked", { client_id: clientId, grant_id: row.grant_id, detail: "access" });
  }

  // ---- audit ---------------------------------------------------------------------

  audit(
    event: OAuthAuditEvent,
    fields: {
      client_id?: string | null;
      principal_id?: string | null;
      grant_id?: string | null;
      scopes?: readonly string[];
      detail?: string;
    },
  ): void {
    this.db
      .prepare(
        "INSERT INTO oauth_audit (at, event, client_id, principal_id, grant_id, scopes, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
      )
      .run(
        new Date(this.#clock()).toISOString(),
        event,
        fields.client_id ?? null,
        fields.principal_id ?? null,
        fields.grant_id ?? null,
        fields.scopes ? fields.scopes.join(" ") : null,
        fields.detail ?? null,
      );
    this.db
      .prepare("DELETE FROM oauth_audit WHERE id <= (SELECT MAX(id) FROM oauth_audit) - ?")
      .run(OAUTH_AUDIT_MAX_ROWS);
  }

  auditRows(limit = 1000): OAuthAuditRow[] {
    return this.db
      .prepare<[number], OAuthAuditRow>(
        "SELECT * FROM (SELECT * FROM oauth_audit ORDER BY id DESC LIMIT ?) ORDER BY id",
      )
      .all(limit);
  }
}

export interface TokenTtls {
  accessMs: number;
  refreshMs: number;
  /** `[oauth] refresh_reuse_grace_secs` in ms; 0: every reuse revokes the family. */
  reuseGraceMs: number;
}

interface SealedPair extends IssuedPair {
  scopes: string[];
}

const SUCCESSOR_KDF_SALT = "webcodex oauth refresh successor v1";
const GCM_IV_BYTES = 12;
const GCM_TAG_BYTES = 16;

/** The successor key: HKDF-SHA256 of the spent refresh token, bound to its row. Never the stored sha256. */
function successorKey(refresh: string, tokenHash: string): Buffer {
  return Buffer.from(hkdfSync("sha256", refresh, SUCCESSOR_KDF_SALT, tokenHash, 32));
}

function sealSuccessor(refresh: string, tokenHash: string, pair: SealedPair): Buffer {
  const iv = randomBytes(GCM_IV_BYTES);
  const cipher = createCipheriv("aes-256-gcm", successorKey(refresh, tokenHash), iv);
  cipher.setAAD(Buffer.from(tokenHash, "utf8"));
  const body = Buffer.concat([cipher.update(JSON.stringify(pair), "utf8"), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), body]);
}

function openSuccessor(refresh: string, tokenHash: string, sealed: Buffer): SealedPair | null {
  if (sealed.length <= GCM_IV_BYTES + GCM_TAG_BYTES) return null;
  try {
    const decipher = createDecipheriv(
      "aes-256-gcm",
      successorKey(refresh, tokenHash),
      sealed.subarray(0, GCM_IV_BYTES),
    );
    decipher.setAAD(Buffer.from(tokenHash, "utf8"));
    decipher.setAuthTag(sealed.subarray(GCM_IV_BYTES, GCM_IV_BYTES + GCM_TAG_BYTES));
    const text = Buffer.concat([
      decipher.update(sealed.subarray(GCM_IV_BYTES + GCM_TAG_BYTES)),
      decipher.final(),
    ]).toString("utf8");
    const v = JSON.parse(text) as SealedPair;
    if (typeof v.access_token !== "string" || typeof v.refresh_token !== "string" || !Array.isArray(v.scopes))
      return null;
    return v;
  } catch {
    return null;
  }
}
