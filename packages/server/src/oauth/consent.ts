/**
 * Login and consent, the shared-key bridge (design §9):
 *
 * 1. `/authorize` (the SDK's handler validated client, redirect URI, PKCE S256 and the rest)
 *    calls `begin`: the request is parked server-side under an unguessable id with a CSRF
 *    token (also set as an HttpOnly SameSite=Strict cookie) and the page is shown.
 * 2. The person types an access key and chooses Continue (`review`); `submit` checks the
 *    pending request, the CSRF pair, the per-client+address attempt budget, then the key, and
 *    shows exactly what Allow would grant with it: the scopes, the key's projects, how long the
 *    connection lasts, and `coding_agent:run` as its own unchecked line when it can be granted.
 *    The key's id (never the key) is kept with the pending request for step 3.
 * 3. Allow (`approve`): the key behind the reviewed key id is looked up again (revoked since →
 *    back to step 1), or a key sent with `approve` itself is checked as in step 2. Granted =
 *    requested ∩ the key's scopes ∩ the client's ceiling; `coding_agent:run` only when the client
 *    is provisioned for it *now* and the person ticked its line. A result page says what was
 *    granted and returns the browser to the client with the code (a link, and a refresh).
 *
 * Deny and every error after the redirect URI was validated go back to the client as an
 * OAuth error redirect; a request whose pending entry or CSRF pair does not check out gets a
 * page instead (its redirect cannot be trusted).
 */
import { randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { ClientAddressOf } from "../client-address.js";
import type { OAuthSettings } from "../config.js";
import { serverFailpoint } from "../failpoints.js";
import type { Principal, Scope } from "../principals/principal.js";
import type { IdentifiedKey } from "../principals/tokens.js";
import {
  type ClientView,
  type GrantSummary,
  type RunLine,
  renderConsent,
  renderErrorPage,
  renderResult,
  renderReview,
} from "./consent-page.js";
import { OperatorReadClients } from "./operator-read.js";
import { CODING_AGENT_RUN, OPERATOR_READ_SCOPE, WEBHOOKS_WRITE_SCOPE } from "./scopes.js";
import type { OAuthStore } from "./store.js";

/** A consent page may be answered this long after it was shown. */
export const CONSENT_TTL_MS = 10 * 60_000;
/**
 * Open consent pages held at most: in all, per client and per requesting address. A request past a
 * bound is refused with a page; an open page is never evicted to make room, so a flood of
 * unauthenticated /authorize requests cannot take away the page a person is answering.
 */
export const MAX_PENDING_CONSENTS = 1024;
export const MAX_PENDING_PER_CLIENT = 256;
export const MAX_PENDING_PER_ADDRESS = 32;
/** (client, IP) pairs whose failed key attempts are remembered at most. */
export const MAX_ATTEMPT_BUCKETS = 10_000;
export const CSRF_COOKIE_PREFIX = "wc_csrf_";
/** Longest access key the form accepts (issued keys are far shorter). */
export const MAX_KEY_CHARS = 512;

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
  /** The requesting address (client-address.ts), for MAX_PENDING_PER_ADDRESS. */
  address: string;
  /** Set by a successful `review`: whose key was checked (its id only). */
  reviewed?: { keyId: string; principalId: string };
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

  /**
   * Count one attempt now — before the key is looked up, so that concurrent wrong keys cannot all pass a check
   * taken before the others were counted — or null when the bucket is at its limit. `succeeded` gives it back.
   */
  reserve(key: string, now = Date.now()): { succeeded(): void } | null {
    const b = this.#bucket(key, now);
    if (b.failures >= this.max) return null;
    b.failures += 1;
    let settled = false;
    return {
      succeeded: () => {
        if (settled) return;
        settled = true;
        b.failures = Math.max(0, b.failures - 1);
      },
    };
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

/** An OAuth error redirect to a validated redirect URI, with `iss` (RFC 9207) like every authorization response. */
export function errorRedirect(
  res: ServerResponse,
  redirectUri: string,
  error: string,
  description: string,
  state: string | undefined,
  issuer: string,
): void {
  const u = new URL(redirectUri);
  u.searchParams.set("error", error);
  u.searchParams.set("error_description", description);
  if (state !== undefined) u.searchParams.set("state", state);
  u.searchParams.set("iss", issuer);
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
  identifyKey: (key: string) => Promise<IdentifiedKey | null>;
  /** Key id → the Principal it carries now, or null when the key is gone (re-checked at Allow). */
  keyPrincipal: (keyId: string) => Promise<Principal | null>;
  /** The request's client address (`[server] trusted_proxies`): the key-attempt bound is per client + address. */
  clientAddress: ClientAddressOf;
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
  readonly #issuer: string;

  constructor(deps: ConsentDeps) {
    this.#deps = deps;
    this.#attempts = new KeyAttempts(deps.settings.maxKeyAttempts, deps.settings.keyAttemptWindowSecs * 1000);
    this.#secureCookie = deps.settings.issuer.startsWith("https:");
    this.#issuer = deps.settings.issuer;
  }

  /** Why one more open page for this client and address is refused (the bounds above), or null. */
  #pendingBound(clientId: string, address: string): string | null {
    if (this.#pending.size >= MAX_PENDING_CONSENTS) return "this Server has too many open sign-in requests";
    let forClient = 0;
    let forAddress = 0;
    for (const p of this.#pending.values()) {
      if (p.clientId === clientId) forClient += 1;
      if (p.address === address) forAddress += 1;
    }
    if (forAddress >= MAX_PENDING_PER_ADDRESS) return "there are too many open sign-in requests from your address";
    if (forClient >= MAX_PENDING_PER_CLIENT) return "this app has too many open sign-in requests";
    return null;
  }

  /** Park a validated authorization request and show its consent page (or refuse it past a bound). */
  async begin(
    req: IncomingMessage,
    res: ServerResponse,
    request: Omit<PendingConsent, "id" | "csrf" | "createdAt" | "address">,
  ): Promise<void> {
    const now = Date.now();
    // Insertion order is age order: expired entries are at the front.
    for (const [id, p] of this.#pending) {
      if (now - p.createdAt < CONSENT_TTL_MS) break;
      this.#pending.delete(id);
    }
    const address = this.#deps.clientAddress(req);
    const refused = this.#pendingBound(request.clientId, address);
    if (refused !== null) {
      this.#deps.logger.warn({ client_id: request.clientId.slice(0, 256) }, "oauth: consent page refused: bound");
      renderErrorPage(
        res,
        429,
        "Too many open sign-in requests",
        `Not now: ${refused}. Finish or close the ones already open, or wait up to ${CONSENT_TTL_MS / 60_000} minutes.`,
      );
      return;
    }
    const pending: PendingConsent = {
      ...request,
      address,
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
    await this.#show(res, pending, undefined, 200);
  }

  async #clientView(p: PendingConsent): Promise<ClientView & { provisioned: boolean }> {
    const row = await this.#deps.store.client(p.clientId);
    return {
      clientId: p.clientId,
      clientName: row?.client_name ?? null,
      clientKind: row?.kind ?? "dynamic",
      redirectUri: p.redirectUri,
      provisioned: row?.allow_coding_agent_run === 1,
    };
  }

  async #show(res: ServerResponse, p: PendingConsent, error: string | undefined, status: number): Promise<void> {
    const view = await this.#clientView(p);
    const operatorReadOffered = await new OperatorReadClients(this.#deps.store).has(p.clientId);
    renderConsent(
      res,
      {
        ...view,
        requestId: p.id,
        csrf: p.csrf,
        requested: p.requested,
        codingAgentRunOffered: view.provisioned,
        operatorReadOffered,
        error,
      },
      status,
    );
  }

  /** What the key can be granted of this request: the ordinary scopes, and where coding_agent:run stands. */
  async #grantable(
    p: PendingConsent,
    principal: Principal,
    provisioned: boolean,
  ): Promise<{ scopes: Scope[]; run: RunLine }> {
    const operatorRead = await new OperatorReadClients(this.#deps.store).has(p.clientId);
    const scopes = p.requested.filter(
      (s) =>
        s !== CODING_AGENT_RUN &&
        principal.scopes.has(s) &&
        (s !== OPERATOR_READ_SCOPE || operatorRead) &&
        (s !== WEBHOOKS_WRITE_SCOPE || provisioned),
    );
    let run: RunLine = "none";
    if (p.requested.includes(CODING_AGENT_RUN)) {
      if (!provisioned) run = "not_provisioned";
      else run = principal.scopes.has(CODING_AGENT_RUN) ? "offered" : "key_lacks";
    }
    return { scopes, run };
  }

  #summary(scopes: readonly string[], principal: Principal): GrantSummary {
    return {
      scopes,
      projects: [...principal.projects].sort(),
      refreshTtlSecs: this.#deps.settings.refreshTokenTtlSecs,
      accessTtlSecs: this.#deps.settings.accessTokenTtlSecs,
    };
  }

  /**
   * The key behind this answer: the one typed into the form (checked against the attempt bound),
   * else — for Allow after a review — the reviewed key as it is now. null: a page was sent.
   */
  async #principal(
    req: IncomingMessage,
    res: ServerResponse,
    p: PendingConsent,
    form: ConsentForm,
  ): Promise<{ principal: Principal; keyId: string } | null> {
    const { logger } = this.#deps;
    const key = typeof form.key === "string" ? form.key.trim() : "";
    if (key === "" && form.action === "approve" && p.reviewed) {
      const principal = await this.#deps.keyPrincipal(p.reviewed.keyId);
      if (principal && principal.id === p.reviewed.principalId) return { principal, keyId: p.reviewed.keyId };
      delete p.reviewed;
      await this.#show(res, p, "That access key no longer works. Type a current key.", 401);
      return null;
    }
    const bucket = `${p.clientId}\u0000${this.#deps.clientAddress(req)}`;
    const attempt = this.#attempts.reserve(bucket);
    if (attempt === null) {
      const minutes = Math.ceil(this.#deps.settings.keyAttemptWindowSecs / 60);
      await this.#show(res, p, `Too many wrong keys from here. Wait up to ${minutes} minutes, then try again.`, 429);
      return null;
    }
    await serverFailpoint("key_lookup");
    const identified = key.length > 0 && key.length <= MAX_KEY_CHARS ? await this.#deps.identifyKey(key) : null;
    if (identified) attempt.succeeded();
    if (!identified) {
      logger.warn({ client_id: p.clientId.slice(0, 256) }, "oauth: consent: wrong access key");
      await this.#show(res, p, "That access key is not valid. Check it and try again.", 401);
      return null;
    }
    return { principal: identified.principal, keyId: identified.key_id };
  }

  /** POST /oauth/consent. */
  async submit(req: IncomingMessage, res: ServerResponse, form: ConsentForm): Promise<void> {
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
      await store.audit("consent_denied", { client_id: p.clientId });
      errorRedirect(res, p.redirectUri, "access_denied", "The person denied the request", p.state, this.#issuer);
      return;
    }
    if (form.action !== "approve" && form.action !== "review") {
      renderErrorPage(res, 400, "Unknown answer", "The form must be answered with Continue, Allow or Deny.");
      return;
    }
    const client = await store.client(p.clientId);
    if (!client || client.revoked_at !== null) {
      this.#pending.delete(id);
      errorRedirect(
        res,
        p.redirectUri,
        "unauthorized_client",
        "This client is no longer allowed",
        p.state,
        this.#issuer,
      );
      return;
    }
    const who = await this.#principal(req, res, p, form);
    if (!who) return;
    // Answered (or expired) by another submission while the key was read: this one is late.
    if (this.#pending.get(id) !== p) {
      renderErrorPage(res, 400, "This sign-in request has expired", "It was already answered.");
      return;
    }
    const view = await this.#clientView(p);
    const { scopes, run } = await this.#grantable(p, who.principal, client.allow_coding_agent_run === 1);
    if (form.action === "review") {
      p.reviewed = { keyId: who.keyId, principalId: who.principal.id };
      renderReview(res, { ...view, ...this.#summary(scopes, who.principal), requestId: p.id, csrf: p.csrf, run });
      return;
    }
    this.#pending.delete(id);
    const withRun = run === "offered" && form.coding_agent_run === "yes";
    const granted: Scope[] = withRun ? [...scopes, CODING_AGENT_RUN] : scopes;
    if (granted.length === 0) {
      errorRedirect(
        res,
        p.redirectUri,
        "invalid_scope",
        "None of the requested scopes can be granted with this key",
        p.state,
        this.#issuer,
      );
      return;
    }
    const created = await store.createGrantWithCode(
      {
        client_id: p.clientId,
        principal_id: who.principal.id,
        key_id: who.keyId,
        scopes: granted,
        projects: [...who.principal.projects],
        resource: p.resource,
      },
      { redirect_uri: p.redirectUri, code_challenge: p.codeChallenge },
    );
    if (created === null) {
      errorRedirect(
        res,
        p.redirectUri,
        "unauthorized_client",
        "This client is no longer allowed",
        p.state,
        this.#issuer,
      );
      return;
    }
    const u = new URL(p.redirectUri);
    u.searchParams.set("code", created.code);
    if (p.state !== undefined) u.searchParams.set("state", p.state);
    u.searchParams.set("iss", this.#deps.settings.issuer);
    renderResult(res, {
      ...view,
      ...this.#summary(scopes, who.principal),
      codingAgentRun: withRun,
      run,
      continueUrl: u.href,
    });
  }
}
