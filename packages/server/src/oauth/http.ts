/**
 * The OAuth HTTP surface, mounted next to `/mcp` when `[oauth] enabled`:
 *
 *   GET  /.well-known/oauth-protected-resource[/mcp]  RFC 9728 (both paths)
 *   GET  /.well-known/oauth-authorization-server      RFC 8414
 *   GET|POST /authorize   SDK authorizationHandler (after our check of client + redirect URI)
 *   POST /token           SDK tokenHandler (PKCE S256 verified by the SDK)
 *   POST /register        SDK clientRegistrationHandler (RFC 7591, rate-limited per IP), after our
 *                         SEP-837 `application_type` check; absent with `[oauth] dynamic_registration = false`
 *   POST /revoke          SDK revocationHandler (RFC 7009)
 *   POST /oauth/consent   our consent form (consent.ts)
 *
 * The SDK handlers are Express routers, so these paths run in one small Express app; `/mcp`
 * itself stays on node:http (mcp/http.ts).
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { authorizationHandler, redirectUriMatches } from "@modelcontextprotocol/sdk/server/auth/handlers/authorize.js";
import { metadataHandler } from "@modelcontextprotocol/sdk/server/auth/handlers/metadata.js";
import { clientRegistrationHandler } from "@modelcontextprotocol/sdk/server/auth/handlers/register.js";
import { revocationHandler } from "@modelcontextprotocol/sdk/server/auth/handlers/revoke.js";
import { tokenHandler } from "@modelcontextprotocol/sdk/server/auth/handlers/token.js";
import type { OAuthMetadata, OAuthProtectedResourceMetadata } from "@modelcontextprotocol/sdk/shared/auth.js";
import express, { type NextFunction, type Request, type Response } from "express";
import type { Logger } from "pino";
import type { ClientAddressOf } from "../client-address.js";
import type { OAuthSettings } from "../config.js";
import type { OAuthClients } from "./clients.js";
import { isLoopbackRedirect, redirectUriProblem } from "./clients.js";
import type { Consent, ConsentForm } from "./consent.js";
import { renderErrorPage } from "./consent-page.js";
import { isOwnErrorDescription, type WebcodexOAuthProvider } from "./provider.js";
import { OAUTH_SCOPES } from "./scopes.js";

/** Largest form or JSON body the OAuth endpoints accept. */
export const OAUTH_MAX_BODY = "16kb";
/** Authorization requests per IP per 15 minutes (the SDK handler's limiter). */
export const AUTHORIZE_PER_15_MIN = 100;

/**
 * The SDK limiters key on `req.ip`, which this app sets to the client address of client-address.ts
 * (the socket peer, or what `[server] trusted_proxies` vouch for); Express's own `trust proxy` stays
 * off. express-rate-limit would print a stack trace to stderr for every request carrying
 * X-Forwarded-For or Forwarded; that is expected here, not a misconfiguration.
 */
const QUIET = { validate: { xForwardedForHeader: false, forwardedHeader: false } } as const;

/**
 * The `error_description` sent for each OAuth error code when the description did not come from
 * our provider: the SDK's handlers put raw validation-library messages (issue dumps, which can
 * echo request fields) there. Codes are kept; only the description is replaced.
 */
export const FIXED_ERROR_DESCRIPTIONS: Readonly<Record<string, string>> = {
  invalid_request:
    "The request is missing a required parameter, has an unsupported value, or is malformed (see RFC 6749 §5.2)",
  invalid_client: "Client authentication failed: unknown client_id, or a client this Server does not accept",
  invalid_grant: "The authorization code or refresh token is invalid, expired, revoked or was issued to another client",
  unauthorized_client: "This client may not use this grant type",
  unsupported_grant_type: "grant_type must be authorization_code or refresh_token",
  invalid_scope: "The requested scope is invalid or exceeds what was granted",
  invalid_target: "resource must be this Server's /mcp URL",
  unsupported_token_type: "This Server revokes only its own access and refresh tokens",
  too_many_requests: "Too many requests from this address; try again later",
  server_error: "The Server could not handle this request",
};
const UNKNOWN_ERROR_DESCRIPTION = "The request was refused";

/**
 * Before the SDK's token and revocation handlers: every JSON error body they send keeps its
 * `error` code, and its `error_description` is ours (isOwnErrorDescription) or the fixed text
 * for the code — never a library message or request input.
 */
function fixedErrorDescriptions(_req: Request, res: Response, next: NextFunction): void {
  const json = res.json.bind(res);
  res.json = (body: unknown) => {
    if (res.statusCode >= 400 && body !== null && typeof body === "object") {
      const b = body as Record<string, unknown>;
      const code = typeof b.error === "string" ? b.error : "server_error";
      const described = typeof b.error_description === "string" ? b.error_description : undefined;
      if (described === undefined || !isOwnErrorDescription(described)) {
        const out: Record<string, unknown> = {
          error: code,
          error_description: FIXED_ERROR_DESCRIPTIONS[code] ?? UNKNOWN_ERROR_DESCRIPTION,
        };
        return json(out);
      }
    }
    return json(body);
  };
  next();
}

export const PRM_PATH = "/.well-known/oauth-protected-resource";
export const AS_METADATA_PATH = "/.well-known/oauth-authorization-server";

/**
 * Around the SDK's authorize handler: every error redirect it sends (a malformed request, our
 * provider's `invalid_target`) carries `iss` (RFC 9207) and a fixed or own `error_description`.
 * For a client whose redirect URI no person has confirmed yet (`confirmed`), the error is shown
 * as a page instead: a freshly registered client could otherwise use this host as an open
 * redirect to any address it registered.
 */
function authorizeErrorRedirects(issuer: string, confirmed: (clientId: string) => Promise<boolean>) {
  return async (req: Request, res: Response, next: NextFunction): Promise<void> => {
    const src = (req.method === "POST" ? req.body : req.query) as Record<string, unknown> | undefined;
    const clientId = typeof src?.client_id === "string" ? src.client_id : "";
    // Read before the SDK handler runs: its error redirects are synchronous.
    const redirectConfirmed = clientId !== "" && (await confirmed(clientId));
    const redirect = res.redirect.bind(res) as (status: number, url: string) => void;
    res.redirect = ((a: number | string, b?: number | string) => {
      const status = typeof a === "number" ? a : typeof b === "number" ? b : 302;
      const url = typeof a === "string" ? a : String(b);
      let u: URL;
      try {
        u = new URL(url);
      } catch {
        return redirect(status, url);
      }
      const code = u.searchParams.get("error");
      if (code !== null) {
        const described = u.searchParams.get("error_description");
        const description =
          described !== null && isOwnErrorDescription(described)
            ? described
            : (FIXED_ERROR_DESCRIPTIONS[code] ?? UNKNOWN_ERROR_DESCRIPTION);
        if (!redirectConfirmed) {
          renderErrorPage(res, 400, "This app's sign-in request was refused", `${description} (${code}).`);
          return;
        }
        u.searchParams.set("error_description", description);
        u.searchParams.set("iss", issuer);
      }
      return redirect(status, u.href);
    }) as Response["redirect"];
    next();
  };
}

/** SEP-837 `application_type` values a registration may name. */
export const APPLICATION_TYPES = ["web", "native"] as const;

/**
 * Why a registration's redirect URIs do not suit its `application_type` (SEP-837), or null:
 * - `web`: https only;
 * - `native`: loopback http (127.0.0.1, localhost, [::1]; any port at /authorize), a private-use
 *   scheme, or https;
 * - absent: either (what clients.ts accepts for any client).
 */
export function applicationTypeProblem(applicationType: unknown, redirectUris: unknown): string | null {
  if (applicationType === undefined) return null;
  if (typeof applicationType !== "string" || !(APPLICATION_TYPES as readonly string[]).includes(applicationType))
    return "application_type must be web or native";
  if (!Array.isArray(redirectUris)) return null;
  for (const raw of redirectUris) {
    if (typeof raw !== "string") continue;
    let u: URL;
    try {
      u = new URL(raw);
    } catch {
      continue;
    }
    if (applicationType === "web" && u.protocol !== "https:")
      return "redirect_uris of a web client (application_type web) must be https";
    if (applicationType === "native" && u.protocol === "http:" && !isLoopbackRedirect(u))
      return "http redirect_uris of a native client must be loopback (127.0.0.1, localhost or [::1])";
  }
  return null;
}

/**
 * Refuses a registration whose `application_type` or redirect URIs are not acceptable before the SDK's handler
 * runs, with RFC 7591's own codes: `invalid_client_metadata`, or `invalid_redirect_uri` naming the rule.
 */
function registrationPrecheck(appSchemes: readonly string[]) {
  return (req: Request, res: Response, next: NextFunction): void => {
    const body = (req.body ?? {}) as Record<string, unknown>;
    const problem =
      applicationTypeProblem(body.application_type, body.redirect_uris) ?? schemeProblem(body.redirect_uris);
    if (problem === null) {
      next();
      return;
    }
    res.status(400).json({
      error: problem.startsWith("application_type") ? "invalid_client_metadata" : "invalid_redirect_uri",
      error_description: problem,
    });
  };

  /** The first redirect URI whose scheme is refused (clients.ts redirectUriProblem), as the rule it breaks. */
  function schemeProblem(redirectUris: unknown): string | null {
    if (!Array.isArray(redirectUris)) return null;
    for (const raw of redirectUris) {
      if (typeof raw !== "string") continue;
      const problem = redirectUriProblem(raw, appSchemes);
      if (problem?.startsWith("the scheme")) return `redirect_uris: ${problem}`;
    }
    return null;
  }
}

/** Whether a request path belongs to the OAuth surface. */
export function isOAuthPath(path: string): boolean {
  return (
    path === PRM_PATH ||
    path === `${PRM_PATH}/mcp` ||
    path === AS_METADATA_PATH ||
    path === "/authorize" ||
    path === "/token" ||
    path === "/register" ||
    path === "/revoke" ||
    path === "/oauth/consent"
  );
}

export function protectedResourceMetadata(settings: OAuthSettings): OAuthProtectedResourceMetadata {
  return {
    resource: settings.resource,
    authorization_servers: [settings.issuer],
    scopes_supported: [...OAUTH_SCOPES],
    bearer_methods_supported: ["header"],
    resource_name: "WebCodex",
  };
}

export function authorizationServerMetadata(settings: OAuthSettings): OAuthMetadata {
  const at = (path: string) => `${settings.issuer}${path}`;
  return {
    issuer: settings.issuer,
    authorization_endpoint: at("/authorize"),
    token_endpoint: at("/token"),
    // Client ID metadata documents are the preferred way to register (MCP 2026-07-28 deprecates DCR).
    ...(settings.dynamicRegistration ? { registration_endpoint: at("/register") } : {}),
    revocation_endpoint: at("/revoke"),
    response_types_supported: ["code"],
    grant_types_supported: ["authorization_code", "refresh_token"],
    code_challenge_methods_supported: ["S256"],
    token_endpoint_auth_methods_supported: ["none"],
    revocation_endpoint_auth_methods_supported: ["none"],
    scopes_supported: [...OAUTH_SCOPES],
    client_id_metadata_document_supported: true,
    authorization_response_iss_parameter_supported: true,
  } as OAuthMetadata;
}

/** The RFC 9728 URL /mcp's 401 points at. */
export function resourceMetadataUrl(settings: OAuthSettings): string {
  return `${settings.issuer}${PRM_PATH}/mcp`;
}

export interface OAuthHttpDeps {
  settings: OAuthSettings;
  provider: WebcodexOAuthProvider;
  clients: OAuthClients;
  consent: Consent;
  logger: Logger;
  /** The request's client address (`[server] trusted_proxies`); rate limits key on it. */
  clientAddress: ClientAddressOf;
  /** Whether a person has confirmed this client's redirect (an operator client, or one with a grant). */
  redirectConfirmed: (clientId: string) => Promise<boolean>;
}

/**
 * Before the SDK's authorize handler: a client we cannot resolve or a redirect URI it did not
 * register gets a page (never a redirect — the redirect URI cannot be trusted), with the reason.
 */
function authorizePrecheck(clients: OAuthClients) {
  return async (req: Request, res: Response, next: NextFunction): Promise<void> => {
    if (req.method !== "GET" && req.method !== "POST") return next();
    const src = (req.method === "POST" ? req.body : req.query) as Record<string, unknown> | undefined;
    const clientId = typeof src?.client_id === "string" ? src.client_id : "";
    const redirectUri = typeof src?.redirect_uri === "string" ? src.redirect_uri : undefined;
    if (!clientId) {
      renderErrorPage(res, 400, "This app's sign-in request is incomplete", "The request names no client_id.");
      return;
    }
    const resolved = await clients.resolve(clientId);
    if (!resolved.ok) {
      renderErrorPage(res, 400, "This app cannot sign in here", `The client is not usable: ${resolved.reason}.`);
      return;
    }
    const registered = resolved.client.redirect_uris.map(String);
    if (redirectUri !== undefined && !registered.some((r) => redirectUriMatches(redirectUri, r))) {
      renderErrorPage(
        res,
        400,
        "This app's return address is not registered",
        "The redirect_uri does not match any address registered for this client, so this Server will not send you there.",
      );
      return;
    }
    if (redirectUri === undefined && registered.length !== 1) {
      renderErrorPage(
        res,
        400,
        "This app's sign-in request is incomplete",
        "redirect_uri is required for this client.",
      );
      return;
    }
    next();
  };
}

/** The OAuth request handler (an Express app); hand it every request `isOAuthPath` accepts. */
export function createOAuthHttp(deps: OAuthHttpDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const { settings, provider, clients, consent, logger, clientAddress, redirectConfirmed } = deps;
  const app = express();
  app.disable("x-powered-by");
  app.set("trust proxy", false);
  app.use((req, _res, next) => {
    Object.defineProperty(req, "ip", { value: clientAddress(req), configurable: true });
    next();
  });
  const prm = metadataHandler(protectedResourceMetadata(settings));
  app.use(`${PRM_PATH}/mcp`, prm);
  app.use(PRM_PATH, prm);
  app.use(AS_METADATA_PATH, metadataHandler(authorizationServerMetadata(settings)));
  app.use(
    "/authorize",
    express.urlencoded({ extended: false, limit: OAUTH_MAX_BODY }),
    authorizePrecheck(clients),
    authorizeErrorRedirects(settings.issuer, redirectConfirmed),
    authorizationHandler({ provider, rateLimit: { ...QUIET, windowMs: 15 * 60_000, max: AUTHORIZE_PER_15_MIN } }),
  );
  app.use("/token", fixedErrorDescriptions, tokenHandler({ provider, rateLimit: QUIET }));
  if (settings.dynamicRegistration) {
    app.use(
      "/register",
      express.json({ limit: OAUTH_MAX_BODY }),
      registrationPrecheck(settings.appRedirectSchemes),
      clientRegistrationHandler({
        clientsStore: clients,
        clientSecretExpirySeconds: 0,
        rateLimit: { ...QUIET, windowMs: 60 * 60_000, max: settings.registrationsPerHour },
      }),
    );
  } else {
    app.use("/register", (_req, res) => {
      res.status(404).json({
        error: "invalid_request",
        error_description:
          "Dynamic client registration is off on this Server; use a client ID metadata document (an https client_id URL)",
      });
    });
  }
  app.use("/revoke", fixedErrorDescriptions, revocationHandler({ provider, rateLimit: QUIET }));
  app.post("/oauth/consent", express.urlencoded({ extended: false, limit: OAUTH_MAX_BODY }), (req, res, next) => {
    consent.submit(req, res, (req.body ?? {}) as ConsentForm).catch(next);
  });
  app.use((err: unknown, _req: Request, res: Response, _next: NextFunction) => {
    logger.warn({ err: err instanceof Error ? err.name : typeof err }, "oauth: request failed");
    if (res.headersSent) return;
    const status = (err as { status?: number }).status ?? 500;
    res
      .status(status >= 400 && status < 600 ? status : 500)
      .json({ error: status < 500 ? "invalid_request" : "server_error" });
  });
  return (req, res) => {
    app(req as Request, res as Response);
  };
}
