/**
 * Wrong-key limits of the console login (docs/operating.md "Operator console"), per Server instance.
 *
 * The client is what `[server] trusted_proxies` lets the Server tell (client-address.ts): the forwarded
 * client behind a trusted proxy, otherwise the socket peer — which, behind a load balancer the operator did not
 * declare, is the load balancer for every operator at once. So that ten wrong keys cannot lock everyone out,
 * each attempt counts in two fixed windows:
 *
 * - per (client, presented key prefix): CONSOLE_LOGIN_MAX_FAILURES. The prefix (the first
 *   CONSOLE_LOGIN_KEY_PREFIX_CHARS characters, kept only as a truncated hash) separates operators: one who
 *   keeps pasting a wrong key, or a guesser working on one key, is stopped without touching the others.
 * - per client: CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE over all prefixes, which bounds guessing (and the
 *   work it causes) through one address. Past it, only a prefix that signed in from that client before
 *   (remembered CONSOLE_LOGIN_KNOWN_PREFIX_MS) may still try: a flood of made-up keys through a shared
 *   address does not lock out the operators who already use the console from it.
 *
 * An attempt is counted before the key is looked up (`reserve`, synchronously, before any await) and given
 * back when the key turns out right, so concurrent wrong keys cannot all pass a check taken before the others
 * were counted.
 */
import { createHash } from "node:crypto";

/** Wrong keys one (client, key prefix) may try per window before login answers 429. */
export const CONSOLE_LOGIN_MAX_FAILURES = 10;
/** Wrong keys one client may try per window over all key prefixes. */
export const CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE = 100;
export const CONSOLE_LOGIN_WINDOW_MS = 10 * 60 * 1000;
/** Characters of a presented key that name its bucket: `wct_` and 8 random characters of an issued key. */
export const CONSOLE_LOGIN_KEY_PREFIX_CHARS = 12;
/** How long a key prefix that signed in from a client may try past that client's budget. */
export const CONSOLE_LOGIN_KNOWN_PREFIX_MS = 24 * 60 * 60 * 1000;
/** Windows and known prefixes remembered at once, each table (past it the oldest entry goes). */
export const CONSOLE_LOGIN_TRACKED_ADDRESSES = 4096;

/** Why a login is refused before its key is looked up. */
export type LoginRefusal = "key" | "source";

/** One counted attempt: `succeeded` gives it back (and remembers the prefix); otherwise it stays counted. */
export interface LoginAttempt {
  succeeded(): void;
}

interface Window {
  start: number;
  n: number;
}

/** The bucket name of a presented key: a truncated hash of its prefix (the key itself is never kept). */
function prefixBucket(key: string): string {
  return createHash("sha256")
    .update(`webcodex-console-login\u0000${key.slice(0, CONSOLE_LOGIN_KEY_PREFIX_CHARS)}`)
    .digest("base64url")
    .slice(0, 16);
}

/** Insert at the end of a bounded Map (its order is age order): past the bound the oldest entry goes. */
function setBounded<V>(map: Map<string, V>, key: string, value: V): void {
  map.delete(key);
  if (map.size >= CONSOLE_LOGIN_TRACKED_ADDRESSES) {
    const oldest = map.keys().next().value;
    if (oldest !== undefined) map.delete(oldest);
  }
  map.set(key, value);
}

export class LoginLimits {
  readonly #windows = new Map<string, Window>();
  /** (client, prefix) → when it last signed in. */
  readonly #known = new Map<string, number>();

  #window(name: string, now: number): Window {
    const w = this.#windows.get(name);
    if (w !== undefined && now - w.start < CONSOLE_LOGIN_WINDOW_MS) return w;
    const fresh = { start: now, n: 0 };
    setBounded(this.#windows, name, fresh);
    return fresh;
  }

  /** Count one attempt of `key` from `client` now, or say which limit refuses it. */
  reserve(client: string, key: string, now = Date.now()): LoginAttempt | LoginRefusal {
    const pair = `${client}\u0000${prefixBucket(key)}`;
    const perKey = this.#window(`k\u0000${pair}`, now);
    const perSource = this.#window(`s\u0000${client}`, now);
    if (perKey.n >= CONSOLE_LOGIN_MAX_FAILURES) return "key";
    const knownAt = this.#known.get(pair);
    const known = knownAt !== undefined && now - knownAt < CONSOLE_LOGIN_KNOWN_PREFIX_MS;
    if (!known && perSource.n >= CONSOLE_LOGIN_MAX_FAILURES_PER_SOURCE) return "source";
    perKey.n += 1;
    perSource.n += 1;
    let settled = false;
    return {
      succeeded: () => {
        if (settled) return;
        settled = true;
        perKey.n = Math.max(0, perKey.n - 1);
        perSource.n = Math.max(0, perSource.n - 1);
        setBounded(this.#known, pair, now);
      },
    };
  }
}
