/**
 * The operator console at `/console` (design §15): one page for principals holding `operator:read`.
 *
 *   GET  /console/login          the login form (sets a login CSRF cookie)
 *   POST /console/login          key (an operator:read token) → session cookie, 303 to /console
 *   POST /console/logout         ends the session (CSRF token required)
 *   GET  /console                the page (no session → 303 to /console/login)
 *   GET  /console/console.js|css the page's own script and style (no third-party assets)
 *   GET  /console/api/snapshot   the current view as JSON (filters: state, project, principal, run)
 *   GET  /console/events         the same view as server-sent events, sent when it changes
 *   POST /console/grants/revoke  revoke an OAuth grant (CSRF token required; audited with the operator's id)
 *   POST /console/webhooks/redeliver  make a webhook dead letter due again (CSRF token required; audited as the
 *                                CLI's `webhooks redeliver` is, with the operator's id)
 *
 * Every response carries a strict CSP (`default-src 'self'`, no inline script or style, `frame-ancestors
 * 'none'`). Every POST must carry the session's CSRF token (sessions.ts) and, when the browser sends an Origin,
 * come from this Server's own origin. The session is re-checked against its key on every request.
 */
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { fileURLToPath } from "node:url";
import type { Logger } from "pino";
import { untrustedForwarder } from "../client-address.js";
import type { ServerConfig } from "../config.js";
import { serverFailpoint } from "../failpoints.js";
import { ABORTED, readBody, TOO_LARGE } from "../http-body.js";
import type { Principal, Scope } from "../principals/principal.js";
import type { IdentifiedKey } from "../principals/tokens.js";
import { RefusalLog } from "../refusal-log.js";
import { LoginLimits } from "./login-limits.js";
import { renderLogin, renderPage } from "./page.js";
import { CONSOLE_SESSION_TTL_MS, type ConsoleSessions, csrfTokenOf, sameSecret } from "./sessions.js";
import type { ConsoleReader } from "./snapshot.js";
import { type ConsoleFilters, parseFilters } from "./views.js";

export {
  CONSOLE_LOGIN_KEY_PREFIX_CHARS,
  CONSOLE_LOGIN_KNOWN_PREFIX_MS,
  CONSOLE_LOGIN_MAX_FAILURES,
  CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE,
  CONSOLE_LOGIN_TRACKED_ADDRESSES,
  CONSOLE_LOGIN_WINDOW_MS,
} from "./login-limits.js";

export const OPERATOR_SCOPE: Scope = "operator:read";

/** Largest form body a console POST may send. */
export const CONSOLE_MAX_FORM_BYTES = 4096;
/** Event streams one principal may hold open at once on this instance. */
export const CONSOLE_MAX_STREAMS_PER_PRINCIPAL = 4;
/** Event streams open at once on this instance, over all principals. */
export const CONSOLE_MAX_STREAMS = 64;
/** A stream re-reads the shared state this often, and sends at most one event per interval. */
export const CONSOLE_STREAM_INTERVAL_MS = 1000;
/** A comment line keeps an idle stream open through proxies this often. */
export const CONSOLE_STREAM_KEEPALIVE_MS = 15_000;
/** A stream ends after this long; the browser reconnects (and so re-authenticates). */
export const CONSOLE_STREAM_MAX_MS = 10 * 60 * 1000;
/** A stream whose reader lets more than this pile up unsent is ended (the browser reconnects when it can). */
export const CONSOLE_STREAM_MAX_BUFFERED_BYTES = 1024 * 1024;
/** What the page's EventSource waits before reconnecting (the `retry:` field). */
export const CONSOLE_STREAM_RETRY_MS = 2000;
/** Untrusted forwarders (client-address.ts untrustedForwarder) the console names in its log, once each. */
export const CONSOLE_UNTRUSTED_FORWARDERS_LOGGED = 16;
/** Refused logins and forms are logged at most once per client address per this window (with a count). */
export const CONSOLE_REFUSAL_LOG_WINDOW_MS = 10_000;
/** How long the login form's CSRF cookie lives. */
export const CONSOLE_LOGIN_FORM_TTL_MS = 10 * 60 * 1000;

const SESSION_COOKIE = "wc_console";
const LOGIN_COOKIE = "wc_console_login";

export const CONSOLE_CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'";

const STATIC_DIR = fileURLToPath(new URL("../../src/console/static/", import.meta.url));

export interface ConsoleDeps {
  config: ServerConfig;
  logger: Logger;
  sessions: ConsoleSessions;
  reader: ConsoleReader;
  /** Bearer key → principal and key id (principals/tokens.ts createKeyIdentifier). */
  identifyKey(key: string): Promise<IdentifiedKey | null>;
  /** The current principal behind a key id, or null once that key is gone. */
  keyPrincipal(keyId: string): Promise<Principal | null>;
  /** Revoke a grant; false when there is no live grant with that id. */
  revokeGrant(grantId: string, reason: string): Promise<boolean>;
  /** Redeliver a webhook dead letter (WebhookOutbox.redeliver, audited as `actor`); false when it is none. */
  redeliverWebhook(eventId: string, actor: `operator_console:${string}`): Promise<boolean>;
  secure: boolean;
  /**
   * The client a request comes from (client-address.ts): the socket address, or what a trusted proxy names,
   * so wrong keys behind a load balancer count against the client that typed them, not every user at once.
   */
  clientAddress(req: IncomingMessage): string;
}

export function isConsolePath(path: string): boolean {
  return path === "/console" || path.startsWith("/console/");
}

function cookie(req: IncomingMessage, name: string): string | undefined {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

function securityHeaders(res: ServerResponse): void {
  res.setHeader("Content-Security-Policy", CONSOLE_CSP);
  res.setHeader("X-Frame-Options", "DENY");
  res.setHeader("X-Content-Type-Options", "nosniff");
  // same-origin, not no-referrer: under no-referrer a browser's form POST says `Origin: null`, and the POST
  // checks need the page's own origin. Nothing is sent to another origin either way.
  res.setHeader("Referrer-Policy", "same-origin");
  res.setHeader("Cache-Control", "no-store");
  res.setHeader("Cross-Origin-Opener-Policy", "same-origin");
  res.setHeader("Cross-Origin-Resource-Policy", "same-origin");
}

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
}

function redirect(res: ServerResponse, to: string, cookies: string[] = []): void {
  if (cookies.length > 0) res.setHeader("Set-Cookie", cookies);
  res.writeHead(303, { location: to }).end();
}

class FormError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

async function readForm(req: IncomingMessage): Promise<URLSearchParams> {
  const type = (req.headers["content-type"] ?? "").split(";")[0]?.trim().toLowerCase();
  if (type !== "application/x-www-form-urlencoded") {
    throw new FormError(415, "content-type must be application/x-www-form-urlencoded");
  }
  const body = await readBody(req, CONSOLE_MAX_FORM_BYTES);
  if (body === TOO_LARGE) throw new FormError(413, `form body over ${CONSOLE_MAX_FORM_BYTES} bytes`);
  if (body === ABORTED) throw new FormError(400, "the form body ended early");
  return new URLSearchParams(body);
}

export interface ConsoleMount {
  handle(req: IncomingMessage, res: ServerResponse): Promise<void>;
  close(): void;
}

export function createConsole(deps: ConsoleDeps): ConsoleMount {
  const { sessions, reader, logger } = deps;
  const assets = {
    "/console/console.js": {
      type: "text/javascript; charset=utf-8",
      body: readFileSync(`${STATIC_DIR}console.js`),
    },
    "/console/console.css": { type: "text/css; charset=utf-8", body: readFileSync(`${STATIC_DIR}console.css`) },
  } as const;
  const limits = new LoginLimits();
  const forwarder = untrustedForwarder(deps.config.trustedProxies);
  const forwardersLogged = new Set<string>();
  // Refused keys and forms are logged at most once per client and window, with the count of the rest.
  const refusals = new RefusalLog(logger, 1, Date.now, CONSOLE_REFUSAL_LOG_WINDOW_MS, true);
  const streams = new Map<string, number>();
  let streamCount = 0;
  const closers = new Set<() => void>();
  const secureAttr = deps.secure ? "; Secure" : "";

  /** The live session's principal (still holding operator:read through the key that opened it) and its id. */
  async function session(req: IncomingMessage): Promise<{ principal: Principal; id: string } | null> {
    const id = cookie(req, SESSION_COOKIE);
    const s = await sessions.get(id);
    if (!s || id === undefined) return null;
    const p = await deps.keyPrincipal(s.key_id);
    if (!p || p.id !== s.principal_id || !p.scopes.has(OPERATOR_SCOPE)) return null;
    return { principal: p, id };
  }

  /** A browser's Origin, when sent, must be this Server's own. */
  function sameOrigin(req: IncomingMessage): boolean {
    const origin = req.headers.origin;
    if (origin === undefined) return true;
    const host = req.headers.host;
    const own = host ? `${deps.secure ? "https" : "http"}://${host}` : null;
    return origin === own || (deps.config.publicUrl !== null && origin === deps.config.publicUrl);
  }

  function checkPost(req: IncomingMessage, form: URLSearchParams, sid: string): string | null {
    if (!sameOrigin(req)) return "the request did not come from this console's own page (Origin mismatch)";
    const given = form.get("csrf") ?? "";
    if (given === "" || !sameSecret(given, csrfTokenOf(sid))) {
      return "missing or wrong CSRF token: reload the console and try again";
    }
    return null;
  }

  async function login(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const address = deps.clientAddress(req);
    const form = await readForm(req);
    const formToken = form.get("login_csrf") ?? "";
    const cookieToken = cookie(req, LOGIN_COOKIE) ?? "";
    if (!sameOrigin(req) || formToken === "" || !sameSecret(formToken, cookieToken)) {
      loginPage(res, 403, "This form could not be verified. Reload the page and sign in again.");
      return;
    }
    const key = (form.get("key") ?? "").trim();
    // Counted before the lookup's await (login-limits.ts), given back if the key is right.
    const attempt = limits.reserve(address, key);
    if (attempt === "key") {
      loginPage(res, 429, "Too many wrong tries of this key from this address. Wait a few minutes, then try again.");
      return;
    }
    if (attempt === "source") {
      loginPage(res, 429, "Too many wrong keys from this address. Wait a few minutes, then try again.");
      return;
    }
    await serverFailpoint("key_lookup");
    const found = key.length > 0 && key.length <= 512 ? await deps.identifyKey(key) : null;
    if (found) attempt.succeeded();
    if (!found) {
      refusals.refused(address, {}, "console: login refused: unknown key");
      loginPage(res, 401, "That key is not valid. Use a key issued with webcodex-server token issue.");
      return;
    }
    if (!found.principal.scopes.has(OPERATOR_SCOPE)) {
      refusals.refused(
        address,
        { principal_id: found.principal.id },
        "console: login refused: key lacks operator:read",
      );
      loginPage(
        res,
        403,
        `This key (principal ${found.principal.id}) lacks the operator:read scope. Ask for a key issued with --scope operator:read.`,
      );
      return;
    }
    const sid = await sessions.open(found.principal.id, found.key_id);
    logger.info({ principal_id: found.principal.id, key_id: found.key_id }, "console: operator signed in");
    redirect(res, "/console", [
      `${SESSION_COOKIE}=${sid}; Path=/console; Max-Age=${CONSOLE_SESSION_TTL_MS / 1000}; HttpOnly; SameSite=Strict${secureAttr}`,
      `${LOGIN_COOKIE}=; Path=/console/login; Max-Age=0; HttpOnly; SameSite=Strict${secureAttr}`,
    ]);
  }

  function loginPage(res: ServerResponse, status: number, error?: string): void {
    const token = randomBytes(32).toString("base64url");
    res.setHeader(
      "Set-Cookie",
      `${LOGIN_COOKIE}=${token}; Path=/console/login; Max-Age=${CONSOLE_LOGIN_FORM_TTL_MS / 1000}; HttpOnly; SameSite=Strict${secureAttr}`,
    );
    res.writeHead(status, { "content-type": "text/html; charset=utf-8" }).end(renderLogin(token, error));
  }

  function stream(
    req: IncomingMessage,
    res: ServerResponse,
    s: { principal: Principal; id: string },
    f: ConsoleFilters,
  ) {
    const mine = streams.get(s.principal.id) ?? 0;
    if (mine >= CONSOLE_MAX_STREAMS_PER_PRINCIPAL || streamCount >= CONSOLE_MAX_STREAMS) {
      res.setHeader("Retry-After", "5");
      json(res, 429, {
        error: `at most ${CONSOLE_MAX_STREAMS_PER_PRINCIPAL} console event streams per principal (and ${CONSOLE_MAX_STREAMS} in all) may be open at once; close another console tab`,
      });
      return;
    }
    streams.set(s.principal.id, mine + 1);
    streamCount += 1;
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "x-accel-buffering": "no",
      connection: "keep-alive",
    });
    res.write(`retry: ${CONSOLE_STREAM_RETRY_MS}\n\n`);
    let last = "";
    let lastWrite = Date.now();
    const started = Date.now();
    /** One tick at a time: a tick that is still reading (a slow database) makes the next one a no-op. */
    let ticking = false;
    const tick = async (): Promise<void> => {
      if (ticking || ended) return;
      ticking = true;
      try {
        await tickOnce();
      } catch (err) {
        logger.error({ err: (err as Error).message }, "console: snapshot not read");
      } finally {
        ticking = false;
      }
    };
    const tickOnce = async (): Promise<void> => {
      const signedIn = (await session(req)) !== null;
      if (ended) return;
      if (!signedIn) {
        res.write("event: signed_out\ndata: {}\n\n");
        end();
        return;
      }
      if (Date.now() - started >= CONSOLE_STREAM_MAX_MS) {
        end();
        return;
      }
      const body = JSON.stringify(await reader.snapshot(f));
      if (ended) return;
      if (res.writableLength > CONSOLE_STREAM_MAX_BUFFERED_BYTES) {
        logger.warn({ principal_id: s.principal.id }, "console: event stream reader too slow; stream ended");
        end();
        return;
      }
      if (body !== last) {
        last = body;
        lastWrite = Date.now();
        res.write(`event: snapshot\ndata: ${body}\n\n`);
      } else if (Date.now() - lastWrite >= CONSOLE_STREAM_KEEPALIVE_MS) {
        lastWrite = Date.now();
        res.write(": keepalive\n\n");
      }
    };
    const timer = setInterval(() => void tick(), CONSOLE_STREAM_INTERVAL_MS);
    let ended = false;
    const end = (): void => {
      if (ended) return;
      ended = true;
      clearInterval(timer);
      closers.delete(end);
      streamCount -= 1;
      const n = (streams.get(s.principal.id) ?? 1) - 1;
      if (n <= 0) streams.delete(s.principal.id);
      else streams.set(s.principal.id, n);
      res.end();
    };
    closers.add(end);
    req.on("close", end);
    void tick();
  }

  /** Once per peer (at most CONSOLE_UNTRUSTED_FORWARDERS_LOGGED): forwarding headers from an undeclared proxy. */
  function noteForwarder(req: IncomingMessage): void {
    const peer = forwarder(req);
    if (peer === null || forwardersLogged.has(peer) || forwardersLogged.size >= CONSOLE_UNTRUSTED_FORWARDERS_LOGGED) {
      return;
    }
    forwardersLogged.add(peer);
    logger.warn(
      { peer },
      "console: requests from this address carry X-Forwarded-For/Forwarded, but it is not in [server] trusted_proxies: " +
        "every client behind it counts as this one address for the wrong-key limits (per key prefix, and per address " +
        "over all keys). Add the proxy to trusted_proxies so that each client is told apart.",
    );
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    securityHeaders(res);
    noteForwarder(req);
    const url = new URL(req.url ?? "/", "http://console.invalid");
    const path = url.pathname;
    const method = req.method ?? "GET";
    if (method === "GET" && Object.hasOwn(assets, path)) {
      const a = assets[path as keyof typeof assets];
      res.writeHead(200, { "content-type": a.type }).end(a.body);
      return;
    }
    if (path === "/console/login") {
      if (method === "GET") {
        if (await session(req)) redirect(res, "/console");
        else loginPage(res, 200);
        return;
      }
      if (method === "POST") return login(req, res);
      res.writeHead(405, { allow: "GET, POST" }).end();
      return;
    }
    const s = await session(req);
    if (path === "/console" || path === "/console/") {
      if (method !== "GET") {
        res.writeHead(405, { allow: "GET" }).end();
        return;
      }
      if (!s) {
        redirect(res, "/console/login");
        return;
      }
      res
        .writeHead(200, { "content-type": "text/html; charset=utf-8" })
        .end(renderPage({ principal: s.principal.id, csrf: csrfTokenOf(s.id) }));
      return;
    }
    if (path === "/console/api/snapshot" || path === "/console/events") {
      if (method !== "GET") {
        res.writeHead(405, { allow: "GET" }).end();
        return;
      }
      if (!s) {
        json(res, 401, { error: "not signed in to the console (or the session ended): sign in at /console/login" });
        return;
      }
      const parsed = parseFilters(url.searchParams);
      if (!parsed.ok) {
        json(res, 400, { error: parsed.error });
        return;
      }
      if (path === "/console/events") stream(req, res, s, parsed.filters);
      else json(res, 200, await reader.snapshot(parsed.filters));
      return;
    }
    if (path === "/console/logout" || path === "/console/grants/revoke" || path === "/console/webhooks/redeliver") {
      if (method !== "POST") {
        res.writeHead(405, { allow: "POST" }).end();
        return;
      }
      if (!s) {
        json(res, 401, { error: "not signed in to the console (or the session ended): sign in at /console/login" });
        return;
      }
      const form = await readForm(req);
      const refused = checkPost(req, form, s.id);
      if (refused) {
        refusals.refused(
          deps.clientAddress(req),
          { principal_id: s.principal.id, path },
          `console: POST refused: ${refused}`,
        );
        json(res, 403, { error: refused });
        return;
      }
      if (path === "/console/logout") {
        await sessions.close(s.id);
        redirect(res, "/console/login", [
          `${SESSION_COOKIE}=; Path=/console; Max-Age=0; HttpOnly; SameSite=Strict${secureAttr}`,
        ]);
        return;
      }
      if (path === "/console/webhooks/redeliver") {
        const eventId = form.get("event_id") ?? "";
        if (!/^msg_[A-Za-z0-9_-]{1,64}$/.test(eventId)) {
          json(res, 400, { error: "event_id: must be a webhook event id such as msg_… (from the dead letters list)" });
          return;
        }
        if (!(await deps.redeliverWebhook(eventId, `operator_console:${s.principal.id}`))) {
          json(res, 404, { error: `no dead letter ${eventId} (already redelivered, or never dead)` });
          return;
        }
        logger.info({ principal_id: s.principal.id, event_id: eventId }, "console: webhook dead letter redelivered");
        json(res, 200, { redelivered: eventId });
        return;
      }
      const grantId = form.get("grant_id") ?? "";
      if (!/^grt_[A-Za-z0-9]{1,64}$/.test(grantId)) {
        json(res, 400, { error: "grant_id: must be a grant id such as grt_… (from the grants list)" });
        return;
      }
      if (!(await deps.revokeGrant(grantId, `operator_console:${s.principal.id}`))) {
        json(res, 404, { error: `no live grant ${grantId} (already revoked, or never existed)` });
        return;
      }
      logger.info({ principal_id: s.principal.id, grant_id: grantId }, "console: OAuth grant revoked");
      json(res, 200, { revoked: grantId });
      return;
    }
    json(res, 404, { error: "not_found" });
  }

  return {
    async handle(req, res) {
      try {
        await route(req, res);
      } catch (err) {
        if (err instanceof FormError) {
          if (!res.headersSent) json(res, err.status, { error: err.message });
          return;
        }
        throw err;
      }
    },
    close() {
      for (const end of [...closers]) end();
    },
  };
}
