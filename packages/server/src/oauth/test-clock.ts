/**
 * Test-only clock skew for the OAuth store, so integration tests can see codes and tokens
 * expire without waiting out their lifetimes. WEBCODEX_TEST_HOOK_OAUTH_CLOCK_SKEW_MS is read
 * exactly once, when this module is first loaded (like failpoints.ts); nothing else can set or
 * change it. Unset — the normal case — the OAuth clock is `Date.now`. Set to a whole number of
 * milliseconds in 0 … OAUTH_TEST_CLOCK_MAX_SKEW_MS, every OAuth expiry check, issue time and
 * audit timestamp of this process runs that far ahead. A test issues a code or token, restarts
 * the Server with the skew, and presents it. The Server refuses to start with it unless it
 * listens on a loopback address (mcp/mcp.ts).
 */
export const OAUTH_TEST_CLOCK_ENV = "WEBCODEX_TEST_HOOK_OAUTH_CLOCK_SKEW_MS";
/** Largest skew accepted: 400 days (past the longest refresh-token lifetime). */
export const OAUTH_TEST_CLOCK_MAX_SKEW_MS = 400 * 24 * 3600 * 1000;

function readOnce(): { skewMs: number; invalid: string | null } {
  const raw = process.env[OAUTH_TEST_CLOCK_ENV];
  if (raw === undefined || raw === "") return { skewMs: 0, invalid: null };
  const n = /^\d{1,13}$/.test(raw) ? Number(raw) : Number.NaN;
  if (!Number.isSafeInteger(n) || n > OAUTH_TEST_CLOCK_MAX_SKEW_MS) return { skewMs: 0, invalid: raw.slice(0, 32) };
  return { skewMs: n, invalid: null };
}

const STARTUP = Object.freeze(readOnce());

/** The skew armed for this process (0 when unset), and an unusable value if one was given. */
export function oauthTestClockSkew(): { skewMs: number; invalid: string | null } {
  return STARTUP;
}

/** The clock the OAuth store runs on: `Date.now`, or `Date.now` plus the armed test skew. */
export function oauthClock(): () => number {
  const skew = STARTUP.skewMs;
  return skew === 0 ? Date.now : () => Date.now() + skew;
}
