/**
 * Client ID Metadata Documents (MCP 2025-11-25, draft-ietf-oauth-client-id-metadata-document):
 * a client whose `client_id` is an https URL publishes its metadata there. Fetching a URL an
 * unauthenticated caller names is a server-side request forgery risk, so the fetch is fenced:
 *
 * - https only, a non-root path, no credentials or fragment;
 * - the host's addresses are checked where the socket connects (the `lookup` hook), so DNS
 *   rebinding between a check and the connect cannot slip through: private, link-local,
 *   unique-local, CGNAT, multicast and unspecified addresses are refused, and loopback too
 *   unless the dev setting allows it;
 * - no redirects (a 3xx is a refusal), `CIMD_TIMEOUT_MS` for the whole exchange,
 *   `CIMD_MAX_BYTES` for the body (Content-Length checked first, then counted);
 * - the document must be JSON, match the SDK's `OAuthClientMetadataSchema`, name the same
 *   `client_id`, list redirect URIs, and be a public client (`none` auth).
 */
import { lookup as dnsLookup, type LookupAddress } from "node:dns";
import { request } from "node:https";
import { BlockList, isIP } from "node:net";
import { OAuthClientMetadataSchema } from "@modelcontextprotocol/sdk/shared/auth.js";
import { ABORTED, readBody, TOO_LARGE } from "../http-body.js";

export const CIMD_TIMEOUT_MS = 5000;
export const CIMD_MAX_BYTES = 64 * 1024;
/** A fetched document is reused this long before it is fetched again. */
export const CIMD_CACHE_TTL_MS = 60 * 60 * 1000;
export const MAX_REDIRECT_URIS = 16;
export const MAX_CLIENT_NAME_CHARS = 128;

export interface ClientMetadataDocument {
  client_id: string;
  client_name: string | null;
  redirect_uris: string[];
}

export class ClientMetadataError extends Error {
  override readonly name = "ClientMetadataError";
}

export interface FetchOptions {
  allowLoopback: boolean;
  timeoutMs?: number;
  maxBytes?: number;
  /** Extra trusted CA certificates (tests with a self-signed loopback server). */
  ca?: string | undefined;
}

const REFUSED = new BlockList();
for (const [net, bits] of [
  ["0.0.0.0", 8],
  ["10.0.0.0", 8],
  ["100.64.0.0", 10],
  ["169.254.0.0", 16],
  ["172.16.0.0", 12],
  ["192.0.0.0", 24],
  ["192.168.0.0", 16],
  ["198.18.0.0", 15],
  ["224.0.0.0", 3],
] as const) {
  REFUSED.addSubnet(net, bits, "ipv4");
}
for (const [net, bits] of [
  ["::", 128],
  ["fc00::", 7],
  ["fe80::", 10],
  ["ff00::", 8],
  ["64:ff9b::", 96],
] as const) {
  REFUSED.addSubnet(net, bits, "ipv6");
}
const LOOPBACK = new BlockList();
LOOPBACK.addSubnet("127.0.0.0", 8, "ipv4");
LOOPBACK.addAddress("::1", "ipv6");

/** Why an address may not be fetched, or null when it may. IPv4-mapped IPv6 is judged as IPv4. */
export function refusedAddress(address: string, allowLoopback: boolean): string | null {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address)?.[1];
  const addr = mapped ?? address;
  const family = isIP(addr);
  if (family === 0) return "not an IP address";
  const type = family === 4 ? "ipv4" : "ipv6";
  if (LOOPBACK.check(addr, type)) return allowLoopback ? null : "a loopback address";
  if (REFUSED.check(addr, type)) return "a private, link-local or reserved address";
  return null;
}

/** Whether a client id is a metadata-document URL (https with a non-root path). */
export function isMetadataUrl(clientId: string): boolean {
  try {
    const u = new URL(clientId);
    return u.protocol === "https:" && u.pathname !== "/" && u.hash === "" && !u.username && !u.password;
  } catch {
    return false;
  }
}

/**
 * A socket `lookup` that resolves like dns.lookup but fails with EREFUSED_ADDRESS when any address the host
 * resolves to is refused by `refuse` (its reason, or null): the connect-time half of an SSRF guard, so a name
 * that resolved to a public address at registration cannot reach a private one later. Also used by webhook
 * deliveries (webhooks/destination.ts).
 */
export function refusingLookup(refuse: (address: string) => string | null) {
  return (
    hostname: string,
    options: object,
    callback: (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void,
  ): void => {
    dnsLookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, []);
      const list = addresses as LookupAddress[];
      for (const a of list) {
        const why = refuse(a.address);
        if (why) return callback(Object.assign(new Error(`resolves to ${why}`), { code: "EREFUSED_ADDRESS" }), []);
      }
      if ((options as { all?: boolean }).all === true) return callback(null, list);
      const first = list[0];
      if (!first) return callback(Object.assign(new Error("no address"), { code: "ENOTFOUND" }), []);
      return callback(null, first.address, first.family);
    });
  };
}

/** Fetch and validate the metadata document at `clientId`. Throws ClientMetadataError with a precise reason. */
export async function fetchClientMetadata(clientId: string, opts: FetchOptions): Promise<ClientMetadataDocument> {
  if (!isMetadataUrl(clientId)) {
    throw new ClientMetadataError("client_id URL must be https with a path, without credentials or fragment");
  }
  const url = new URL(clientId);
  const literal = url.hostname.replace(/^\[|\]$/g, "");
  if (isIP(literal) !== 0) {
    const why = refusedAddress(literal, opts.allowLoopback);
    if (why) throw new ClientMetadataError(`client metadata host is ${why}`);
  }
  const timeoutMs = opts.timeoutMs ?? CIMD_TIMEOUT_MS;
  const maxBytes = opts.maxBytes ?? CIMD_MAX_BYTES;
  const body = await new Promise<string>((resolve, reject) => {
    const signal = AbortSignal.timeout(timeoutMs);
    const req = request(
      url,
      {
        method: "GET",
        headers: { accept: "application/json" },
        lookup: refusingLookup((address) => refusedAddress(address, opts.allowLoopback)) as never,
        signal,
        ...(opts.ca ? { ca: opts.ca } : {}),
      },
      (res) => {
        const status = res.statusCode ?? 0;
        if (status >= 300 && status < 400) {
          res.resume();
          req.destroy();
          return reject(
            new ClientMetadataError("client metadata URL answered with a redirect; redirects are not followed"),
          );
        }
        if (status !== 200) {
          res.resume();
          req.destroy();
          return reject(new ClientMetadataError(`client metadata URL answered HTTP ${status}`));
        }
        void readBody(res, maxBytes).then((text) => {
          if (text === TOO_LARGE) {
            req.destroy();
            reject(new ClientMetadataError(`client metadata document is larger than ${maxBytes} bytes`));
          } else if (text === ABORTED) {
            reject(
              new ClientMetadataError(
                signal.aborted
                  ? `client metadata URL did not answer within ${timeoutMs} ms`
                  : "client metadata URL closed the connection before the document's end",
              ),
            );
          } else resolve(text);
        });
      },
    );
    req.on("error", (err: NodeJS.ErrnoException) => {
      if (signal.aborted) reject(new ClientMetadataError(`client metadata URL did not answer within ${timeoutMs} ms`));
      else if (err.code === "EREFUSED_ADDRESS") reject(new ClientMetadataError(`client metadata host ${err.message}`));
      else reject(new ClientMetadataError(`client metadata URL could not be fetched (${err.code ?? "error"})`));
    });
    req.end();
  });
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    throw new ClientMetadataError("client metadata document is not JSON");
  }
  return validateDocument(clientId, json);
}

function validateDocument(clientId: string, json: unknown): ClientMetadataDocument {
  const parsed = OAuthClientMetadataSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new ClientMetadataError(`client metadata document: ${issue?.path.join(".") || "(root)"}: ${issue?.message}`);
  }
  const docId = (json as { client_id?: unknown }).client_id;
  if (docId !== clientId) throw new ClientMetadataError("client metadata document's client_id is not its own URL");
  const meta = parsed.data;
  if (meta.redirect_uris.length === 0 || meta.redirect_uris.length > MAX_REDIRECT_URIS) {
    throw new ClientMetadataError(`client metadata document must list 1-${MAX_REDIRECT_URIS} redirect_uris`);
  }
  if (meta.token_endpoint_auth_method !== undefined && meta.token_endpoint_auth_method !== "none") {
    throw new ClientMetadataError("client metadata document: token_endpoint_auth_method must be none (public client)");
  }
  return {
    client_id: clientId,
    client_name: meta.client_name?.slice(0, MAX_CLIENT_NAME_CHARS) ?? null,
    redirect_uris: meta.redirect_uris.map(String),
  };
}
