/**
 * OAuth 2.1 for remote MCP hosts (design §9), assembled for `src/mcp.ts`: the store on the
 * Server's state engine, the clients, the consent bridge, the SDK-handler HTTP surface, the
 * access-token check for `/mcp`, and the `WWW-Authenticate` challenges `/mcp` sends.
 */
import type { Logger } from "pino";
import { type ClientAddressOf, clientAddressResolver } from "../client-address.js";
import type { OAuthSettings } from "../config.js";
import type { PrincipalConfig } from "../config-file.js";
import type { Principal, Scope } from "../principals/principal.js";
import { createKeyIdentifier, keyPrincipal, type TokenStore } from "../principals/tokens.js";
import type { StateEngine } from "../state/engine.js";
import { OAuthClients } from "./clients.js";
import { Consent } from "./consent.js";
import { createOAuthHttp, isOAuthPath, resourceMetadataUrl } from "./http.js";
import { WebcodexOAuthProvider } from "./provider.js";
import { DEFAULT_REQUESTED_SCOPES, scopesForTool } from "./scopes.js";
import { OAuthStore } from "./store.js";

export { isOAuthPath } from "./http.js";

export interface OAuthMount {
  handle: ReturnType<typeof createOAuthHttp>;
  owns: (path: string) => boolean;
  /** `/mcp` bearer check for OAuth access tokens; null for anything else. */
  authenticate: (token: string) => Promise<Principal | null>;
  /** The `WWW-Authenticate` value of a 401 from /mcp. */
  unauthorizedChallenge: (invalidToken: boolean) => string;
  /**
   * For an OAuth principal whose token lacks what a tools/call needs: the scopes to ask for
   * (→ 403 insufficient_scope). null when the call may proceed (or the principal is not OAuth).
   */
  insufficientScope: (principal: Principal, toolNames: readonly string[]) => Scope[] | null;
  insufficientScopeChallenge: (scopes: readonly Scope[]) => string;
  store: OAuthStore;
}

/** Assemble OAuth over `engine`; the configured `[[oauth.clients]]` are written to the store before it returns. */
export async function createOAuth(opts: {
  settings: OAuthSettings;
  engine: StateEngine;
  tokens: TokenStore;
  principals: readonly PrincipalConfig[];
  logger: Logger;
  /** Extra CA certificates for client metadata fetches (tests); NODE_EXTRA_CA_CERTS works too. */
  ca?: string;
  /** The clock codes, tokens and audit rows run on (default `Date.now`; test-clock.ts). */
  clock?: () => number;
  /** A request's client address (`[server] trusted_proxies`); default the socket peer. */
  clientAddress?: ClientAddressOf;
}): Promise<OAuthMount> {
  const { settings, logger } = opts;
  const clientAddress = opts.clientAddress ?? clientAddressResolver([]);
  const store = new OAuthStore(opts.engine, opts.clock);
  const clients = new OAuthClients({ store, settings, logger, ca: opts.ca });
  await clients.syncOperatorClients();
  const principalOfKey = keyPrincipal(opts.tokens, opts.principals);
  const consent = new Consent({
    store,
    settings,
    logger,
    identifyKey: createKeyIdentifier(opts.tokens, opts.principals),
    keyPrincipal: principalOfKey,
    clientAddress,
  });
  const provider = new WebcodexOAuthProvider({
    store,
    clients,
    consent,
    settings,
    keyPrincipal: principalOfKey,
  });
  const metadataUrl = resourceMetadataUrl(settings);
  const defaultScope = DEFAULT_REQUESTED_SCOPES.join(" ");
  return {
    handle: createOAuthHttp({
      settings,
      provider,
      clients,
      consent,
      logger,
      clientAddress,
      redirectConfirmed: async (clientId) =>
        (await store.client(clientId))?.kind === "operator" || (await store.hasGrant(clientId)),
    }),
    owns: isOAuthPath,
    authenticate: async (token) => await provider.authenticate(token),
    unauthorizedChallenge: (invalid) =>
      `Bearer realm="webcodex", resource_metadata="${metadataUrl}", scope="${defaultScope}"` +
      (invalid ? ', error="invalid_token", error_description="The access token is invalid, expired or revoked"' : ""),
    insufficientScope: (principal, toolNames) => {
      if (!provider.isOAuthPrincipal(principal)) return null;
      const needed = new Set<Scope>();
      for (const name of toolNames) for (const s of scopesForTool(name)) needed.add(s);
      const missing = [...needed].filter((s) => !principal.scopes.has(s));
      return missing.length === 0 ? null : [...new Set([...principal.scopes, ...needed])];
    },
    insufficientScopeChallenge: (scopes) =>
      `Bearer realm="webcodex", error="insufficient_scope", scope="${scopes.join(" ")}", resource_metadata="${metadataUrl}", ` +
      `error_description="This token lacks a scope the call needs"`,
    store,
  };
}
