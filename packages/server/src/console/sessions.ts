/**
 * Operator console sessions (table `console_sessions` on the state engine, schema step 10; read on every
 * request, never cached, since another Server instance may open or end one).
 *
 * A browser cannot send a bearer header when it navigates, so the console trades an `operator:read` key for
 * a session once (console/http.ts `POST /console/login`): a random 32-byte session id goes to the browser as
 * an HttpOnly, SameSite=Strict cookie, and only its sha256 is stored, with the principal and the id of the
 * key that opened it. Every request re-checks that key (revoked key, or the principal lost `operator:read` in
 * the config → the session is worth nothing from that request on). A session lives at most
 * CONSOLE_SESSION_TTL_MS and ends at logout.
 *
 * The CSRF token is derived from the session id (HMAC-free: sha256 over a fixed label and the id), so it is
 * never stored and cannot be computed without the HttpOnly cookie.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { StateEngine } from "../state/engine.js";

/** How long a console session lasts from login, whatever happens in between. */
export const CONSOLE_SESSION_TTL_MS = 8 * 60 * 60 * 1000;
/** Live sessions one principal may hold; a new login past it ends that principal's oldest. */
export const CONSOLE_MAX_SESSIONS_PER_PRINCIPAL = 16;

const SESSION_PATTERN = /^[A-Za-z0-9_-]{43}$/;

export interface ConsoleSession {
  principal_id: string;
  key_id: string;
  expires_ms: number;
}

function sha256(value: string): string {
  return createHash("sha256").update(value, "utf8").digest("hex");
}

/** The CSRF token of a session: the page gets it, a POST must carry it back. */
export function csrfTokenOf(sessionId: string): string {
  return createHash("sha256").update(`webcodex-console-csrf\u0000${sessionId}`, "utf8").digest("base64url");
}

export function sameSecret(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

export class ConsoleSessions {
  readonly #engine: StateEngine;
  readonly #clock: () => number;

  constructor(engine: StateEngine, clock: () => number = Date.now) {
    this.#engine = engine;
    this.#clock = clock;
  }

  /**
   * A new session for a principal whose key the caller verified; returns the id (the cookie value, shown once).
   * One transaction under a per-principal lock, so logins on several instances at once keep the bound.
   */
  async open(principalId: string, keyId: string): Promise<string> {
    const id = randomBytes(32).toString("base64url");
    const now = this.#clock();
    await this.#engine.transaction(
      async (tx) => {
        await tx.run("DELETE FROM console_sessions WHERE expires_ms <= ?", [now]);
        await tx.run(
          `DELETE FROM console_sessions WHERE principal_id = ? AND session_hash NOT IN (
             SELECT session_hash FROM console_sessions WHERE principal_id = ? ORDER BY created_ms DESC, session_hash LIMIT ?)`,
          [principalId, principalId, CONSOLE_MAX_SESSIONS_PER_PRINCIPAL - 1],
        );
        await tx.run(
          "INSERT INTO console_sessions (session_hash, principal_id, key_id, created_ms, expires_ms) VALUES (?, ?, ?, ?, ?)",
          [sha256(id), principalId, keyId, now, now + CONSOLE_SESSION_TTL_MS],
        );
      },
      { lock: `console_sessions:${principalId}` },
    );
    return id;
  }

  /** The live session of a cookie value, or null (malformed, unknown, ended or expired). */
  async get(sessionId: string | undefined): Promise<ConsoleSession | null> {
    if (sessionId === undefined || !SESSION_PATTERN.test(sessionId)) return null;
    const row = await this.#engine.get<ConsoleSession>(
      "SELECT principal_id, key_id, expires_ms FROM console_sessions WHERE session_hash = ?",
      [sha256(sessionId)],
    );
    if (!row || row.expires_ms <= this.#clock()) return null;
    return row;
  }

  async close(sessionId: string): Promise<void> {
    if (!SESSION_PATTERN.test(sessionId)) return;
    await this.#engine.run("DELETE FROM console_sessions WHERE session_hash = ?", [sha256(sessionId)]);
  }
}
