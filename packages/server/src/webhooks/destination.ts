/**
 * Where a webhook may go (design §18), checked at registration (`checkDestination`) and again where the
 * socket connects (`destinationLookup`), so a name that resolves elsewhere later (DNS rebinding) is caught:
 *
 * - `https://` to a public address; no credentials, no fragment, at most MAX_URL_CHARS;
 * - `http://` only to a loopback address, and only when the operator allows it
 *   (`[server.webhooks] allow_loopback_http`), which also lets https reach loopback;
 * - private, link-local (metadata: 169.254.169.254), unique-local, CGNAT, multicast and unspecified
 *   addresses are refused — the classification is the OAuth client-metadata fetcher's (`refusedAddress`).
 */
import { lookup as dnsLookup, type LookupAddress } from "node:dns";
import { isIP } from "node:net";
import { promisify } from "node:util";
import { refusedAddress, refusingLookup } from "../oauth/client-metadata.js";

export const MAX_URL_CHARS = 2048;

export class DestinationError extends Error {
  override readonly name = "DestinationError";
}

export interface DestinationPolicy {
  /** `[server.webhooks] allow_loopback_http`. */
  allowLoopbackHttp: boolean;
}

const LOOPBACK_NAMES = new Set(["localhost"]);

function isLoopbackAddress(address: string): boolean {
  return refusedAddress(address, false) === "a loopback address";
}

/** Why `address` may not be connected to for a URL of `protocol`, or null. */
export function refusedFor(address: string, protocol: string, policy: DestinationPolicy): string | null {
  const why = refusedAddress(address, policy.allowLoopbackHttp);
  if (why) return why;
  if (protocol === "http:" && !isLoopbackAddress(address)) return "not a loopback address (http is loopback only)";
  return null;
}

/** The URL parsed and its form checked (no DNS); throws DestinationError naming what is wrong. */
export function parseDestination(raw: string, policy: DestinationPolicy): URL {
  if (raw.length > MAX_URL_CHARS) throw new DestinationError(`url: at most ${MAX_URL_CHARS} characters`);
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new DestinationError("url: not an absolute URL");
  }
  if (url.username || url.password) throw new DestinationError("url: credentials in the URL are not allowed");
  if (url.hash) throw new DestinationError("url: a fragment is not allowed");
  if (url.protocol === "http:") {
    if (!policy.allowLoopbackHttp) {
      throw new DestinationError(
        "url: must be https (http only to a loopback address with [server.webhooks] allow_loopback_http = true)",
      );
    }
  } else if (url.protocol !== "https:") {
    throw new DestinationError("url: must be https");
  }
  const host = url.hostname.replace(/^\[|\]$/g, "");
  if (isIP(host) !== 0) {
    const why = refusedFor(host, url.protocol, policy);
    if (why) throw new DestinationError(`url: the host is ${why}`);
  } else if (url.protocol === "http:" && !LOOPBACK_NAMES.has(host.toLowerCase())) {
    throw new DestinationError("url: http is allowed to a loopback address only (127.0.0.1, ::1 or localhost)");
  }
  return url;
}

const lookupAll = promisify(dnsLookup);

/** Registration: the URL's form, then every address its host resolves to now. */
export async function checkDestination(raw: string, policy: DestinationPolicy): Promise<URL> {
  const url = parseDestination(raw, policy);
  const host = url.hostname.replace(/^\[|\]$/g, "");
  if (isIP(host) !== 0) return url;
  let addresses: LookupAddress[];
  try {
    addresses = await lookupAll(host, { all: true });
  } catch (err) {
    throw new DestinationError(`url: the host does not resolve (${(err as NodeJS.ErrnoException).code ?? "error"})`);
  }
  for (const a of addresses) {
    const why = refusedFor(a.address, url.protocol, policy);
    if (why) throw new DestinationError(`url: the host resolves to ${why}`);
  }
  return url;
}

/** The `lookup` of the delivery's socket: every resolved address checked as at registration. */
export function destinationLookup(protocol: string, policy: DestinationPolicy) {
  return refusingLookup((address) => refusedFor(address, protocol, policy));
}
