/**
 * Standard Webhooks signing (https://www.standardwebhooks.com), hand-written on node:crypto: a secret is
 * `whsec_` + base64 of SECRET_BYTES random bytes; an attempt carries `webhook-id` (the event's id, the same on
 * every retry), `webhook-timestamp` (seconds, this attempt's) and `webhook-signature` =
 * `v1,` + base64(HMAC-SHA256(secret bytes, "<id>.<timestamp>.<body>")). Receivers verify it with the
 * `standardwebhooks` package (the tests do).
 */
import { createHmac, randomBytes } from "node:crypto";

export const SECRET_PREFIX = "whsec_";
/** Random bytes of a signing secret (Standard Webhooks: 24 to 64). */
export const SECRET_BYTES = 32;

/** A new signing secret, `whsec_…`. */
export function newSecret(): string {
  return `${SECRET_PREFIX}${randomBytes(SECRET_BYTES).toString("base64")}`;
}

/**
 * The three headers of one attempt, signed with each of `secrets` (the current one first; after a rotation, the
 * previous one too until its overlap ends): Standard Webhooks lists several signatures space-separated, and a
 * receiver accepts the request when one of them verifies with its secret.
 */
export function signedHeaders(
  secrets: readonly string[],
  id: string,
  timestampSecs: number,
  body: string,
): Record<string, string> {
  const signatures = secrets.map((secret) => {
    const key = Buffer.from(secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret, "base64");
    return `v1,${createHmac("sha256", key).update(`${id}.${timestampSecs}.${body}`).digest("base64")}`;
  });
  return {
    "webhook-id": id,
    "webhook-timestamp": String(timestampSecs),
    "webhook-signature": signatures.join(" "),
  };
}
