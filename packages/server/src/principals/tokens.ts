/**
 * Principal bearer tokens. A token is 32 random bytes (`wct_` + base64url);
 * only its sha256 is stored, with the scopes and projects it was issued for.
 *
 * Scopes never widen: a token's effective scopes and projects are the
 * intersection of what it was issued with and what the Server config grants
 * its principal *now*. Adding a scope to a principal in the config, or a new
 * default, does not reach tokens issued before; removing one takes effect at
 * the next request. A principal removed from the config has no valid tokens.
 * Issuing `coding_agent:run` needs an explicit opt-in (`allowCodingAgentRun`).
 */
import { createHash, randomBytes, randomUUID } from "node:crypto";
import type { StateEngine } from "../state/engine.js";
import { type Principal, SCOPES, type Scope } from "./principal.js";

export const TOKEN_PREFIX = "wct_";
const TOKEN_PATTERN = /^wct_[A-Za-z0-9_-]{43}$/;

/** Live tokens whose rows a Server keeps in memory between requests (the least recently verified go first). */
export const TOKEN_CACHE_ENTRIES = 4_096;
/**
 * On PostgreSQL a remembered row is read again after this long even without a revocation notice, which
 * bounds how long a revocation whose notice was lost (the listening connection down) takes to apply.
 */
export const TOKEN_CACHE_TTL_MS = 1_000;
/** PostgreSQL: `revoke` tells every instance on this channel, in the revoking transaction (state/engine.ts). */
export const TOKEN_REVOCATIONS_CHANNEL = "webcodex_token_revocations";

/** What the Server config says of one principal (config.ts `[[principals]]`). */
export interface PrincipalGrant {
  id: string;
  scopes: ReadonlySet<Scope> | readonly Scope[];
  projects: ReadonlySet<string> | readonly string[];
}

export type PrincipalLookup = (id: string) => PrincipalGrant | undefined;

export interface IssueRequest {
  principal_id: string;
  scopes: readonly string[];
  projects: readonly string[];
  /** The operator's explicit opt-in to issue `coding_agent:run`. */
  allowCodingAgentRun: boolean;
}

export interface IssuedToken {
  /** The bearer token. Shown once; not recoverable. */
  token: string;
  token_id: string;
  principal_id: string;
  scopes: Scope[];
  projects: string[];
}

export interface TokenInfo {
  token_id: string;
  principal_id: string;
  scopes: Scope[];
  projects: string[];
  created_at: string;
  revoked_at: string | null;
}

export class TokenIssueError extends Error {
  override readonly name = "TokenIssueError";
}

export function hashToken(token: string): string {
  return createHash("sha256").update(token, "utf8").digest("hex");
}

function isScope(value: string): value is Scope {
  return (SCOPES as readonly string[]).includes(value);
}

function toSet<T>(values: ReadonlySet<T> | readonly T[]): ReadonlySet<T> {
  return values instanceof Set ? values : new Set(values as readonly T[]);
}

interface TokenRow {
  token_hash: string;
  token_id: string;
  principal_id: string;
  scopes: string;
  projects: string;
  created_at: string;
  revoked_at: string | null;
}

/** What a verification needs of a live token's row, parsed once. */
interface LiveToken {
  token_id: string;
  principal_id: string;
  scopes: readonly string[];
  projects: readonly string[];
  /** Date.now() when read from the database. */
  readAt: number;
}

/** The rows remembered for one engine, shared by every TokenStore on it (a revoke through one forgets for all). */
interface TokenCache {
  live: Map<string, LiveToken>;
  /** SQLite: the `writesElsewhere` number the remembered rows were read under. */
  version: number | null;
  /** PostgreSQL: whether revocation notices are followed (remembered rows may be used). */
  following: boolean;
  /** Counts the times everything was forgotten: a row read across one of them is not remembered. */
  generation: number;
  /**
   * Reads of a token's row in flight, by hash: a verification of the same token meanwhile (a client's
   * burst of requests, many observers of one principal connecting at once) waits for that read instead of
   * queueing its own on the database — only when nothing was forgotten since it began (`generation`).
   * One entry per token whose read is in flight, so bounded by the requests in flight.
   */
  reading: Map<string, { generation: number; row: Promise<TokenRow | undefined> }>;
}

const caches = new WeakMap<StateEngine, TokenCache>();

function forget(cache: TokenCache): void {
  cache.live.clear();
  cache.generation += 1;
}

function cacheOf(db: StateEngine): TokenCache {
  let cache = caches.get(db);
  if (cache === undefined) {
    cache = { live: new Map(), version: null, following: false, generation: 0, reading: new Map() };
    caches.set(db, cache);
  }
  return cache;
}

/**
 * Token hashes in the Server's state database (table `principal_tokens`, schema step 10). A revocation
 * made by `webcodex-server token revoke` (another process) or by another Server instance on the same
 * database applies from the next request on (on PostgreSQL: from the one after its notice arrived,
 * moments after the commit): verification reads the token's row (one indexed query) unless a row read
 * before is remembered and nothing can have revoked it since —
 * - on SQLite, no other connection committed anything since (`engine.writesElsewhere`), and no `revoke`
 *   through this connection (it forgets everything);
 * - on PostgreSQL, once `followRevocations` listens: no revocation notice arrived (each `revoke` sends one
 *   in its own transaction), and the row was read less than TOKEN_CACHE_TTL_MS ago.
 * Without either, every verification reads the row.
 */
export class TokenStore {
  readonly #db: StateEngine;
  readonly #cache: TokenCache;
  #unlisten: (() => void) | null = null;

  /** `db` must be migrated (state/schema.ts). */
  constructor(db: StateEngine) {
    this.#db = db;
    this.#cache = cacheOf(db);
  }

  /**
   * PostgreSQL: listen for revocations, so that verified rows may be remembered (see the class). A no-op
   * on SQLite. Throws when the database cannot be reached; `close` stops listening.
   */
  async followRevocations(): Promise<void> {
    if (this.#db.dialect !== "postgres" || this.#unlisten !== null) return;
    const cache = this.#cache;
    this.#unlisten = await this.#db.listen(TOKEN_REVOCATIONS_CHANNEL, () => forget(cache));
    cache.following = true;
  }

  /** Stop listening (`followRevocations`) and forget remembered rows. */
  close(): void {
    if (this.#unlisten === null) return;
    this.#unlisten();
    this.#unlisten = null;
    this.#cache.following = false;
    forget(this.#cache);
  }

  /**
   * Issue a token for a configured principal. Every requested scope and project
   * must already be granted to that principal by the config.
   */
  async issue(request: IssueRequest, lookup: PrincipalLookup): Promise<IssuedToken> {
    const grant = lookup(request.principal_id);
    if (!grant) throw new TokenIssueError(`principal '${request.principal_id}' is not declared in the Server config`);
    const grantScopes = toSet(grant.scopes);
    const grantProjects = toSet(grant.projects);
    if (request.scopes.length === 0) throw new TokenIssueError("at least one --scope is required");
    const scopes: Scope[] = [];
    for (const s of request.scopes) {
      if (!isScope(s)) throw new TokenIssueError(`unknown scope '${s}' (known: ${SCOPES.join(", ")})`);
      if (!grantScopes.has(s)) {
        throw new TokenIssueError(`scope '${s}' is not granted to principal '${grant.id}' in the Server config`);
      }
      if (!scopes.includes(s)) scopes.push(s);
    }
    if (scopes.includes("coding_agent:run") && !request.allowCodingAgentRun) {
      throw new TokenIssueError(
        "issuing coding_agent:run lets the token holder run coding agents on granted projects; pass --allow-coding-agent-run to confirm",
      );
    }
    const projects: string[] = [];
    for (const p of request.projects) {
      if (!grantProjects.has(p)) {
        throw new TokenIssueError(`project '${p}' is not granted to principal '${grant.id}' in the Server config`);
      }
      if (!projects.includes(p)) projects.push(p);
    }
    const token = TOKEN_PREFIX + randomBytes(32).toString("base64url");
    const tokenId = `tok_${randomUUID().replaceAll("-", "").slice(0, 16)}`;
    await this.#db.run(
      "INSERT INTO principal_tokens (token_hash, token_id, principal_id, scopes, projects, created_at) VALUES (?, ?, ?, ?, ?, ?)",
      [hashToken(token), tokenId, grant.id, JSON.stringify(scopes), JSON.stringify(projects), new Date().toISOString()],
    );
    return { token, token_id: tokenId, principal_id: grant.id, scopes, projects };
  }

  /**
   * The principal a bearer token stands for, or null (unknown, revoked,
   * malformed, or its principal is no longer configured). Lookup is by
   * sha256 of the presented token; the token itself is never stored or logged.
   */
  async verify(token: string, lookup: PrincipalLookup): Promise<Principal | null> {
    return (await this.identify(token, lookup))?.principal ?? null;
  }

  /** Like `verify`, with the token's id (the OAuth consent records which key granted it). */
  async identify(token: string, lookup: PrincipalLookup): Promise<{ principal: Principal; token_id: string } | null> {
    if (!TOKEN_PATTERN.test(token)) return null;
    const hash = hashToken(token);
    let live = await this.#remembered(hash);
    if (live === undefined) {
      const generation = this.#cache.generation;
      const row = await this.#readLive(hash, generation);
      if (!row) return null;
      live = {
        token_id: row.token_id,
        principal_id: row.principal_id,
        scopes: parseList(row.scopes),
        projects: parseList(row.projects),
        readAt: Date.now(),
      };
      if (generation === this.#cache.generation) this.#remember(hash, live);
    }
    const principal = this.#principalOf(live, lookup);
    return principal ? { principal, token_id: live.token_id } : null;
  }

  /** The live row of `hash` from the database: a read begun under the same `generation` is shared. */
  async #readLive(hash: string, generation: number): Promise<TokenRow | undefined> {
    const reading = this.#cache.reading;
    const inFlight = reading.get(hash);
    if (inFlight !== undefined && inFlight.generation === generation) return await inFlight.row;
    const row = this.#db.get<TokenRow>("SELECT * FROM principal_tokens WHERE token_hash = ? AND revoked_at IS NULL", [
      hash,
    ]);
    const entry = { generation, row };
    reading.set(hash, entry);
    try {
      return await row;
    } finally {
      if (reading.get(hash) === entry) reading.delete(hash);
    }
  }

  /** The remembered live row of `hash`, when nothing can have revoked it since it was read (see the class). */
  async #remembered(hash: string): Promise<LiveToken | undefined> {
    const cache = this.#cache;
    if (this.#db.dialect === "sqlite") {
      const version = await this.#db.writesElsewhere();
      if (version !== cache.version) {
        forget(cache);
        cache.version = version;
        return undefined;
      }
    } else if (!cache.following) return undefined;
    const live = cache.live.get(hash);
    if (live === undefined) return undefined;
    if (this.#db.dialect !== "sqlite" && Date.now() - live.readAt >= TOKEN_CACHE_TTL_MS) {
      cache.live.delete(hash);
      return undefined;
    }
    // Most recently verified last: the first entry is the one to drop at the bound.
    cache.live.delete(hash);
    cache.live.set(hash, live);
    return live;
  }

  #remember(hash: string, live: LiveToken): void {
    const cache = this.#cache;
    if (this.#db.dialect !== "sqlite" && !cache.following) return;
    if (cache.live.size >= TOKEN_CACHE_ENTRIES) {
      const oldest = cache.live.keys().next().value;
      if (oldest !== undefined) cache.live.delete(oldest);
    }
    cache.live.set(hash, live);
  }

  /** The current Principal of a live token id (null when revoked, unknown or its principal is gone). */
  async principalOfId(tokenId: string, lookup: PrincipalLookup): Promise<Principal | null> {
    const row = await this.#db.get<TokenRow>(
      "SELECT * FROM principal_tokens WHERE token_id = ? AND revoked_at IS NULL",
      [tokenId],
    );
    return row
      ? this.#principalOf({ ...row, scopes: parseList(row.scopes), projects: parseList(row.projects) }, lookup)
      : null;
  }

  #principalOf(
    row: { principal_id: string; scopes: readonly string[]; projects: readonly string[] },
    lookup: PrincipalLookup,
  ): Principal | null {
    const grant = lookup(row.principal_id);
    if (!grant) return null;
    const grantScopes = toSet(grant.scopes);
    const grantProjects = toSet(grant.projects);
    const scopes = new Set<Scope>();
    for (const s of row.scopes) if (isScope(s) && grantScopes.has(s)) scopes.add(s);
    const projects = new Set<string>();
    for (const p of row.projects) if (grantProjects.has(p)) projects.add(p);
    return { id: row.principal_id, scopes, projects };
  }

  async list(principalId?: string): Promise<TokenInfo[]> {
    const rows =
      principalId === undefined
        ? await this.#db.all<TokenRow>("SELECT * FROM principal_tokens ORDER BY created_at, token_id")
        : await this.#db.all<TokenRow>(
            "SELECT * FROM principal_tokens WHERE principal_id = ? ORDER BY created_at, token_id",
            [principalId],
          );
    return rows.map((row) => ({
      token_id: row.token_id,
      principal_id: row.principal_id,
      scopes: parseList(row.scopes).filter(isScope),
      projects: parseList(row.projects),
      created_at: row.created_at,
      revoked_at: row.revoked_at,
    }));
  }

  /** true when a live token with this id was revoked. */
  async revoke(tokenId: string): Promise<boolean> {
    forget(this.#cache);
    const revoked = await this.#db.transaction(async (tx) => {
      const result = await tx.run(
        "UPDATE principal_tokens SET revoked_at = ? WHERE token_id = ? AND revoked_at IS NULL",
        [new Date().toISOString(), tokenId],
      );
      // Every instance forgets what it remembers of tokens, when (and only if) this commits.
      if (result.changes > 0 && this.#db.dialect === "postgres") {
        await tx.get("SELECT pg_notify(?, ?) AS notified", [TOKEN_REVOCATIONS_CHANNEL, tokenId]);
      }
      return result.changes > 0;
    });
    forget(this.#cache);
    return revoked;
  }
}

function parseList(json: string): string[] {
  const value: unknown = JSON.parse(json);
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === "string") : [];
}

/** Extract the bearer token from an Authorization header value, or null. */
export function bearerToken(header: string | undefined): string | null {
  if (!header) return null;
  const match = /^Bearer ([A-Za-z0-9._~+/=-]{1,512})$/i.exec(header.trim());
  return match?.[1] ?? null;
}

/** Principals as the Server config declares them (config.ts `[[principals]]`). */
export interface ConfiguredPrincipal {
  id: string;
  scopes: readonly Scope[];
  projects: readonly string[];
  /** Operator-declared token hashes (hex sha256); they carry `token_scopes` ∩ `scopes`. */
  token_sha256?: readonly string[];
  /** The fixed scopes of the inline tokens (never the principal's `scopes` alone). */
  token_scopes?: readonly Scope[] | undefined;
  /** Explicit opt-in for `coding_agent:run` on inline tokens. */
  allow_coding_agent_run?: boolean;
}

/** Effective scopes of an inline config token: its fixed list ∩ the principal's current scopes. */
function inlineScopes(p: ConfiguredPrincipal): Set<Scope> {
  const current = new Set(p.scopes);
  return new Set(
    (p.token_scopes ?? []).filter(
      (s) => current.has(s) && (s !== "coding_agent:run" || p.allow_coding_agent_run === true),
    ),
  );
}

export function principalLookup(principals: readonly ConfiguredPrincipal[]): PrincipalLookup {
  const byId = new Map(principals.map((p) => [p.id, p]));
  return (id) => byId.get(id);
}

/**
 * Bearer token → Principal for the MCP front end. CLI-issued tokens (state DB)
 * are checked first; then hashes declared inline in the config, which carry their fixed
 * `token_scopes` ∩ the principal's current scopes (so they never widen either). Unknown → null.
 */
export function createAuthenticator(
  store: TokenStore,
  principals: readonly ConfiguredPrincipal[],
): (token: string) => Promise<Principal | null> {
  const identify = createKeyIdentifier(store, principals);
  return async (token) => (await identify(token))?.principal ?? null;
}

/** An access key with its id: `tok_…` for issued keys, `cfg_` + 16 hex of its hash for a config-declared one. */
export interface IdentifiedKey {
  principal: Principal;
  key_id: string;
}

/** Prefix of the key ids of config-declared (`token_sha256`) keys. */
export const INLINE_KEY_ID_PREFIX = "cfg_";

/**
 * Bearer token → Principal and key id. CLI-issued tokens (state DB) are checked first; then hashes
 * declared inline in the config, which carry their fixed `token_scopes` ∩ the principal's current
 * scopes (so they never widen either). Unknown → null.
 */
export function createKeyIdentifier(
  store: TokenStore,
  principals: readonly ConfiguredPrincipal[],
): (token: string) => Promise<IdentifiedKey | null> {
  const lookup = principalLookup(principals);
  const inline = new Map<string, ConfiguredPrincipal>();
  for (const p of principals) for (const h of p.token_sha256 ?? []) inline.set(h, p);
  return async (token) => {
    const issued = await store.identify(token, lookup);
    if (issued) return { principal: issued.principal, key_id: issued.token_id };
    if (inline.size === 0) return null;
    const hash = hashToken(token);
    const p = inline.get(hash);
    if (!p) return null;
    return {
      principal: { id: p.id, scopes: inlineScopes(p), projects: new Set(p.projects) },
      key_id: INLINE_KEY_ID_PREFIX + hash.slice(0, 16),
    };
  };
}

/** The current Principal behind a key id (see IdentifiedKey), or null when that key is gone. */
export function keyPrincipal(
  store: TokenStore,
  principals: readonly ConfiguredPrincipal[],
): (keyId: string) => Promise<Principal | null> {
  const lookup = principalLookup(principals);
  return async (keyId) => {
    if (!keyId.startsWith(INLINE_KEY_ID_PREFIX)) return await store.principalOfId(keyId, lookup);
    const prefix = keyId.slice(INLINE_KEY_ID_PREFIX.length);
    for (const p of principals) {
      if ((p.token_sha256 ?? []).some((h) => h.startsWith(prefix))) {
        return { id: p.id, scopes: inlineScopes(p), projects: new Set(p.projects) };
      }
    }
    return null;
  };
}
