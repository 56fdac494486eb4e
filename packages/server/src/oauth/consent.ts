/**
 * Login and consent, the shared-key bridge (DESIGN §9):
 *
 * 1. `/authorize` (the SDK's handler validated client, redirect URI, PKCE S256 and the rest)
 *    calls `begin`: the request is parked server-side under an unguessable id with a CSRF
 *    token (also set as an HttpOnly SameSite=Strict cookie) and the page is shown.
 * 2. The person types an access key and approves or denies; `submit` checks the pending
 *    request, the CSRF pair, the per-client+IP attempt budget, then the key.
 * 3. Granted = requested ∩ the key's scopes ∩ the client's ceiling; `coding_agent:run` only
 *    when the client is provisioned for it *now* and the person ticked its line.
 *
 * Deny and every error after the redirect URI was validated go back to the client as an
 * OAuth error redirect; a request whose pending entry or CSRF pair does not check out gets a
 * page instead (its redirect cannot be trusted).
 */
import { randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { OAuthSettings } from "../config.js";
import type { Scope } from "../principals/principal.js";
import type { IdentifiedKey } from "../principals/tokens.js";
import { renderConsent, renderErrorPage } from "./consent-page.js";
import { CODING_AGENT_RUN } from "./scopes.js";
import type { OAuthStore } from "./store.js";

/** A consent page may be answered this long after it was shown. */
export const CONSENT_TTL_MS = 10 * 60_000;
/** Pending consents held at most (the oldest is dropped beyond). */
export const MAX_PENDING_CONSENTS = 1024;
/** (client, IP) pairs whose failed key attempts are remembered at most. */
export const MAX_ATTEMPT_BUCKETS = 10_000;
export const CSRF_COOKIE_PREFIX = "wc_csrf_";

export interface PendingConsent {
  id: string;
  csrf: string;
  clientId: string;
  redirectUri: string;
  state: string | undefined;
  codeChallenge: string;
  requested: Scope[];
  resource: string;
  createdAt: number;
}

/** Failed key attempts per client + IP in a fixed window. */
export class KeyAttempts {
  readonly #buckets = new Map<string, { failures: number; windowStart: number }>();
  constructor(
    readonly max: number,
    readonly windowMs: number,
  ) {}

  #bucket(key: string, now: number) {
    const b = this.#buckets.get(key);
    if (b && now - b.windowStart < this.windowMs) return b;
    const fresh = { failures: 0, windowStart: now };
    if (this.#buckets.size >= MAX_ATTEMPT_BUCKETS) {
      const oldest = this.#buckets.keys().next().value;
      if (oldest !== undefined) this.#buckets.delete(oldest);
    }
    this.#buckets.delete(key);
    this.#buckets.set(key, fresh);
    return fresh;
  }

  blocked(key: string, now = Date.now()): boolean {
    return this.#bucket(key, now).failures >= this.max;
  }

  fail(key: string, now = Date.now()): void {
    this.#bucket(key, now).failures += 1;
  }
}

function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

function cookie(req: IncomingMessage, name: string): string | undefined {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** An OAuth error redirect to a validated redirect URI. */
export function errorRedirect(
  res: ServerResponse,
  redirectUri: string,
  error: string,
  description: string,
  state: string | undefined,
): void {
  const u = new URL(redirectUri);
  u.searchParams.set("error", error);
  u.searchParams.set("error_description", description);
  if (state !== undefined) u.searchParams.set("state", state);
  res.statusCode = 302;
  res.setHeader("Location", u.href);
  res.setHeader("Cache-Control", "no-store");
  res.end();
}

export interface ConsentDeps {
  store: OAuthStore;
  settings: OAuthSettings;
  logger: Logger;
  /** Access key → its principal and key id, or null (the static bearer-token check). */
  identifyKey: (key: string) => IdentifiedKey | null;
}

export interface ConsentForm {
  request_id?: unknown;
  csrf?: unknown;
  action?: unknown;
  key?: unknown;
  coding_agent_run?: unknown;
}

export class Consent {
  readonly #pending = new Map<string, PendingConsent>();
  readonly #attempts: KeyAttempts;
  readonly #deps: ConsentDeps;
  readonly #secureCookie: boolean;

  constructor(deps: ConsentDeps) {
    this.#deps = deps;
    this.#attempts = new KeyAttempts(deps.settings.maxKeyAttempts, deps.settings.keyAttemptWindowSecs * 1000);
    this.#secureCookie = deps.settings.issuer.startsWith("https:");
  }

  /** Park a validated authorization request and show its consent page. */
  begin(res: ServerResponse, request: Omit<PendingConsent, "id" | "csrf" | "createdAt">): void {
    const now = Date.now();
    for (const [id, p] of this.#pending) {
      if (now - p.createdAt < CONSENT_TTL_MS && this.#pending.size < MAX_PENDING_CONSENTS) break;
      this.#pending.delete(id);
    }
    const pending: PendingConsent = {
      ...request,
      id: randomBytes(24).toString("base64url"),
      csrf: randomBytes(24).toString("base64url"),
      createdAt: now,
    };
    this.#pending.set(pending.id, pending);
    res.setHeader(
      "Set-Cookie",
      `${CSRF_COOKIE_PREFIX}${pending.id}=${pending.csrf}; Path=/oauth/consent; Max-Age=${CONSENT_TTL_MS / 1000}; ` +
        `HttpOnly; SameSite=Strict${this.#secureCookie ? "; Secure" : ""}`,
    );
    this.#show(res, pending, undefined, 200);
  }

  #show(res: ServerResponse, p: PendingConsent, error: string | undefined, status: number): void {
    const row = this.#deps.store.client(p.clientId);
    renderConsent(
      res,
      {
        requestId: p.id,
        csrf: p.csrf,
        clientId: p.clientId,
        clientName: row?.client_name ?? null,
        clientKind: row?.kind ?? "dynamic",
        redirectUri: p.redirectUri,
        requested: p.requested,
        codingAgentRunOffered: row?.allow_coding_agent_run === 1,
        error,
      },
      status,
    );
  }

  /** POST /oauth/consent. */
  submit(req: IncomingMessage, res: ServerResponse, form: ConsentForm): void {
    const { store, logger } = this.#deps;
    const id = typeof form.request_id === "string" ? form.request_id : "";
    const p = this.#pending.get(id);
    if (!p || Date.now() - p.createdAt >= CONSENT_TTL_MS) {
      if (p) this.#pending.delete(id);
      renderErrorPage(
        res,
        400,
        "This sign-in request has expired",
        "It was already answered, or is older than 10 minutes.",
      );
      return;
    }
    const csrfField = typeof form.csrf === "string" ? form.csrf : "";
    const csrfCookie = cookie(req, CSRF_COOKIE_PREFIX + id) ?? "";
    if (!sameSecret(csrfField, p.csrf) || !sameSecret(csrfCookie, p.csrf)) {
      logger.warn({ client_id: p.clientId.slice(0, 256) }, "oauth: consent refused: CSRF check failed");
      renderErrorPage(
        res,
        403,
        "This form could not be verified",
        "The page's security token did not match this browser.",
      );
      return;
    }
    if (form.action === "deny") {
      this.#pending.delete(id);
      store.audit("consent_denied", { client_id: p.clientId });
      errorRedirect(res, p.redirectUri, "access_denied", "The person denied the request", p.state);
      return;
    }
    if (form.action !== "approve") {
      renderErrorPage(res, 400, "Unknown answer", "The form must be answered with Allow or Deny.");
      return;
    }
    const client = store.client(p.clientId);
    if (!client || client.revoked_at !== null) {
      this.#pending.delete(id);
      errorRedirect(res, p.redirectUri, "unauthorized_client", "This client is no longer allowed", p.state);
      return;
    }
    const bucket = `${p.clientId}\u0000${req.socket.remoteAddress ?? "?"}`;
    if (this.#attempts.blocked(bucket)) {
      const minutes = Math.ceil(this.#deps.settings.keyAttemptWindowSecs / 60);
      this.#show(res, p, `Too many wrong keys from here. Wait up to ${minutes} minutes, then try again.`, 429);
      return;
    }
    const key = typeof form.key === "string" ? form.key.trim() : "";
    const identified = key.length > 0 && key.length <= 512 ? this.#deps.identifyKey(key) : null;
    if (!identified) {
      this.#attempts.fail(bucket);
      logger.warn({ client_id: p.clientId.slice(0, 256) }, "oauth: consent: wrong access key");
      this.#show(res, p, "That access key is not valid. Check it and try again.", 401);
      return;
    }
    this.#pending.delete(id);
    const wantsRun = form.coding_agent_run === "yes";
    const granted = p.requested.filter((s) => {
      if (!identified.principal.scopes.has(s)) return false;
      if (s === CODING_AGENT_RUN) return wantsRun && client.allow_coding_agent_run === 1;
      return true;
    });
    if (granted.length === 0) {
      errorRedirect(
        res,
        p.redirectUri,
        "invalid_scope",
        "None of the requested scopes can be granted with this key",
        p.state,
      );
      return;
    }
    const { code } = store.createGrantWithCode(
      {
        client_id: p.clientId,
        principal_id: identified.principal.id,
        key_id: identified.key_id,
        scopes: granted,
        projects: [...identified.principal.projects],
        resource: p.resource,
      },
      { redirect_uri: p.redirectUri, code_challenge: p.codeChallenge },
    );
    const u = new URL(p.redirectUri);
    u.searchParams.set("code", code);
    if (p.state !== undefined) u.searchParams.set("state", p.state);
    u.searchParams.set("iss", this.#deps.settings.issuer);
    res.statusCode = 302;
    res.setHeader("Location", u.href);
    res.setHeader("Cache-Control", "no-store");
    res.end();
  }
}
