/**
 * Our `OAuthServerProvider` for the SDK's authorize/token/revoke handlers,
 * and the access-token check `/mcp` runs on every request.
 *
 * - `resource` (RFC 8707) names this Server's one MCP resource, `public_url/mcp` (`sameResource`):
 *   omitted means that resource; scheme and host compare case-insensitively (URL parsing), a
 *   default port equals no port, and one trailing slash on the path is ignored; any other
 *   difference (host, port, path, a query) is `invalid_target`. Tokens record the canonical form and
 *   `/mcp` accepts only tokens whose resource is its own (audience binding).
 * - A token's effective scopes, checked per request: the token's scopes ∩ what its access key
 *   still carries (key revoked or principal removed → nothing) ∩ the client's ceiling *now*
 *   (`coding_agent:run` only while the client is provisioned). Projects: the grant's ∩ the key's.
 */

import {
  InvalidGrantError,
  InvalidScopeError,
  InvalidTargetError,
  InvalidTokenError,
} from "@modelcontextprotocol/sdk/server/auth/errors.js";
import type { AuthorizationParams, OAuthServerProvider } from "@modelcontextprotocol/sdk/server/auth/provider.js";
import type { AuthInfo } from "@modelcontextprotocol/sdk/server/auth/types.js";
import type {
  OAuthClientInformationFull,
  OAuthTokenRevocationRequest,
  OAuthTokens,
} from "@modelcontextprotocol/sdk/shared/auth.js";
import type { Response } from "express";
import type { OAuthSettings } from "../config.js";
import type { Principal, Scope } from "../principals/principal.js";
import type { OAuthClients } from "./clients.js";
import type { Consent } from "./consent.js";
import { OperatorReadClients } from "./operator-read.js";
import {
  CODING_AGENT_RUN,
  isOAuthScope,
  OPERATOR_READ_SCOPE,
  requestedScopes,
  WEBHOOKS_WRITE_SCOPE,
} from "./scopes.js";
import { ACCESS_TOKEN_PREFIX, type IssuedPair, type OAuthStore, parseJsonList, type TokenTtls } from "./store.js";

/**
 * The error descriptions this provider writes: fixed text (or text built only from this
 * Server's configured resource URL), never request input. http.ts keeps these and replaces any
 * other `error_description` (the SDK's validation-library messages) with a fixed one per code.
 */
const OWN_DESCRIPTIONS = new Set<string>();

function own(description: string): string {
  OWN_DESCRIPTIONS.add(description);
  return description;
}

/** Whether an `error_description` is one this provider wrote (see OWN_DESCRIPTIONS). */
export function isOwnErrorDescription(description: string): boolean {
  return OWN_DESCRIPTIONS.has(description);
}

/** Whether `resource` names `canonical` (the rule in this file's header). */
export function sameResource(resource: URL, canonical: string): boolean {
  const want = new URL(canonical);
  const path = (u: URL) => (u.pathname.length > 1 ? u.pathname.replace(/\/$/, "") : u.pathname);
  return (
    resource.origin === want.origin &&
    path(resource) === path(want) &&
    resource.search === "" &&
    resource.hash === "" &&
    resource.username === "" &&
    resource.password === ""
  );
}

export interface ProviderDeps {
  store: OAuthStore;
  clients: OAuthClients;
  consent: Consent;
  settings: OAuthSettings;
  /** The current Principal behind an access key id, or null when the key is gone. */
  keyPrincipal: (keyId: string) => Promise<Principal | null>;
}

export class WebcodexOAuthProvider implements OAuthServerProvider {
  readonly #d: ProviderDeps;
  readonly #ttl: TokenTtls;
  /** Principals this provider authenticated: /mcp answers their missing scopes with 403 insufficient_scope. */
  readonly #oauthPrincipals = new WeakSet<Principal>();

  constructor(deps: ProviderDeps) {
    this.#d = deps;
    this.#ttl = {
      accessMs: deps.settings.accessTokenTtlSecs * 1000,
      refreshMs: deps.settings.refreshTokenTtlSecs * 1000,
      reuseGraceMs: deps.settings.refreshReuseGraceSecs * 1000,
    };
  }

  get clientsStore(): OAuthClients {
    return this.#d.clients;
  }

  /** Omitted: this Server's resource. Otherwise it must name it (sameResource). */
  #checkResource(resource: URL | undefined): void {
    if (resource === undefined) return;
    if (!sameResource(resource, this.#d.settings.resource)) {
      throw new InvalidTargetError(own(`resource must be ${this.#d.settings.resource}`));
    }
  }

  async authorize(client: OAuthClientInformationFull, params: AuthorizationParams, res: Response): Promise<void> {
    this.#checkResource(params.resource);
    await this.#d.consent.begin(res.req, res, {
      clientId: client.client_id,
      redirectUri: params.redirectUri,
      state: params.state,
      codeChallenge: params.codeChallenge,
      requested: requestedScopes(params.scopes),
      resource: this.#d.settings.resource,
    });
  }

  async challengeForAuthorizationCode(client: OAuthClientInformationFull, code: string): Promise<string> {
    const challenge = await this.#d.store.codeChallenge(code, client.client_id);
    if (challenge === undefined)
      throw new InvalidGrantError(own("unknown, expired or already used authorization code"));
    return challenge;
  }

  #tokens(pair: IssuedPair, scopes: readonly string[]): OAuthTokens {
    return {
      access_token: pair.access_token,
      token_type: "Bearer",
      expires_in: this.#d.settings.accessTokenTtlSecs,
      refresh_token: pair.refresh_token,
      scope: scopes.join(" "),
    };
  }

  async exchangeAuthorizationCode(
    client: OAuthClientInformationFull,
    code: string,
    _codeVerifier?: string,
    redirectUri?: string,
    resource?: URL,
  ): Promise<OAuthTokens> {
    this.#checkResource(resource);
    const r = await this.#d.store.redeemCode(code, client.client_id, redirectUri, this.#ttl);
    if (!r.ok) {
      const why = {
        unknown: "unknown authorization code",
        expired: "the authorization code expired",
        reused: "the authorization code was already used; the grant it produced is revoked",
        other_client: "the authorization code belongs to another client",
        redirect_mismatch: "redirect_uri does not match the authorization request",
        revoked: "the grant was revoked",
      }[r.reason];
      throw new InvalidGrantError(own(why));
    }
    return this.#tokens(r.pair, parseJsonList(r.grant.scopes));
  }

  async exchangeRefreshToken(
    client: OAuthClientInformationFull,
    refreshToken: string,
    scopes?: string[],
    resource?: URL,
  ): Promise<OAuthTokens> {
    this.#checkResource(resource);
    const r = await this.#d.store.rotateRefresh(refreshToken, client.client_id, scopes, this.#ttl);
    if (!r.ok) {
      if (r.reason === "scope_widened")
        throw new InvalidScopeError(own("a refresh can narrow the scopes, never widen them"));
      const why = {
        unknown: "unknown refresh token",
        expired: "the refresh token expired",
        reused: "the refresh token was already used; its whole token family is revoked",
        revoked: "the grant was revoked",
        other_client: "the refresh token belongs to another client",
      }[r.reason];
      throw new InvalidGrantError(own(why));
    }
    return this.#tokens(r.pair, r.scopes);
  }

  async verifyAccessToken(token: string): Promise<AuthInfo> {
    const found = await this.#resolve(token);
    if (!found) throw new InvalidTokenError("invalid, expired or revoked access token");
    return {
      token,
      clientId: found.clientId,
      scopes: [...found.principal.scopes],
      expiresAt: Math.floor(found.expiresAt / 1000),
      resource: new URL(this.#d.settings.resource),
    };
  }

  async revokeToken(client: OAuthClientInformationFull, request: OAuthTokenRevocationRequest): Promise<void> {
    await this.#d.store.revokeToken(request.token, client.client_id);
  }

  async #resolve(token: string): Promise<{ principal: Principal; clientId: string; expiresAt: number } | null> {
    const { store, settings } = this.#d;
    const row = await store.accessToken(token);
    if (!row || row.resource !== settings.resource) return null;
    const grant = await store.grant(row.grant_id);
    if (!grant || grant.revoked_at !== null) return null;
    const client = await store.client(row.client_id);
    if (!client || client.revoked_at !== null) return null;
    const key = grant.key_id === null ? null : await this.#d.keyPrincipal(grant.key_id);
    if (!key || key.id !== grant.principal_id) return null;
    const tokenScopes = parseJsonList(row.scopes);
    const operatorRead =
      tokenScopes.includes(OPERATOR_READ_SCOPE) && (await new OperatorReadClients(store).has(client.client_id));
    const scopes = new Set<Scope>();
    for (const s of tokenScopes) {
      if (!isOAuthScope(s) || !key.scopes.has(s)) continue;
      if ((s === CODING_AGENT_RUN || s === WEBHOOKS_WRITE_SCOPE) && client.allow_coding_agent_run !== 1) continue;
      if (s === OPERATOR_READ_SCOPE && !operatorRead) continue;
      scopes.add(s);
    }
    const projects = new Set(parseJsonList(grant.projects).filter((p) => key.projects.has(p)));
    return {
      principal: { id: grant.principal_id, scopes, projects },
      clientId: row.client_id,
      expiresAt: row.expires_at,
    };
  }

  /** /mcp bearer check for OAuth access tokens (anything else → null, for the static check). */
  async authenticate(token: string): Promise<Principal | null> {
    if (!token.startsWith(ACCESS_TOKEN_PREFIX)) return null;
    const found = await this.#resolve(token);
    if (!found) return null;
    this.#oauthPrincipals.add(found.principal);
    return found.principal;
  }

  isOAuthPrincipal(principal: Principal): boolean {
    return this.#oauthPrincipals.has(principal);
  }
}
