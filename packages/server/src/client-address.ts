/**
 * The address a request came from, for rate limits, key-attempt bounds, refusal logs and audit
 * (`[server] trusted_proxies`).
 *
 * Contract:
 * - With no trusted proxies, it is the socket's peer address; forwarded headers are ignored.
 * - With trusted proxies, the hop chain is the socket peer followed by the forwarded addresses,
 *   nearest first (`X-Forwarded-For` when present, else the `for=` values of RFC 7239 `Forwarded`).
 *   The client is the first hop, walking from the socket, that is not a trusted proxy; a malformed or
 *   obfuscated entry (`unknown`, `_hidden`) ends the walk at the hop that sent it. So a client can
 *   never put itself before a proxy it does not control: the proxy appends the address it saw.
 * - Each proxy must append to (or overwrite) the header it uses; a header the proxies do not set is
 *   whatever the client sent, which is why only one header is read (X-Forwarded-For first).
 */
import type { IncomingMessage } from "node:http";
import { BlockList, isIP } from "node:net";

export type ClientAddressOf = (req: IncomingMessage) => string;

const IPV4_MAPPED = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i;

/** An IP literal in its plain form (IPv4-mapped IPv6 → IPv4), or null when `text` is not one. */
function plainIp(text: string): string | null {
  const mapped = IPV4_MAPPED.exec(text)?.[1];
  const ip = mapped ?? text;
  return isIP(ip) === 0 ? null : ip.toLowerCase();
}

/** One `Forwarded` / `X-Forwarded-For` node (`1.2.3.4`, `1.2.3.4:80`, `"[::1]:80"`, `::1`) → its IP, or null. */
function nodeIp(raw: string): string | null {
  let v = raw.trim();
  if (v.startsWith('"') && v.endsWith('"') && v.length >= 2) v = v.slice(1, -1);
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(v);
  if (bracketed?.[1] !== undefined) return plainIp(bracketed[1]);
  const v4port = /^(\d+\.\d+\.\d+\.\d+):\d+$/.exec(v);
  if (v4port?.[1] !== undefined) return plainIp(v4port[1]);
  return plainIp(v);
}

/** The forwarded hops of a request, farthest first as the headers list them; null marks an unusable entry. */
function forwardedHops(req: IncomingMessage): (string | null)[] {
  const xff = req.headers["x-forwarded-for"];
  if (xff !== undefined) {
    const text = Array.isArray(xff) ? xff.join(",") : xff;
    return text.split(",").map(nodeIp);
  }
  const fwd = req.headers.forwarded;
  if (fwd === undefined) return [];
  const hops: (string | null)[] = [];
  for (const element of fwd.split(",")) {
    const pair = element
      .split(";")
      .map((p) => p.trim())
      .find((p) => p.toLowerCase().startsWith("for="));
    hops.push(pair === undefined ? null : nodeIp(pair.slice(4)));
  }
  return hops;
}

/** `[server] trusted_proxies` (validated by config.ts: IP addresses or CIDR blocks) → whether an IP is one. */
function trustedProxyCheck(trustedProxies: readonly string[]): (ip: string) => boolean {
  const trusted = new BlockList();
  for (const entry of trustedProxies) {
    const [addr = "", bits] = entry.split("/");
    const ip = plainIp(addr) ?? addr;
    const family = isIP(ip) === 6 ? "ipv6" : "ipv4";
    if (bits === undefined) trusted.addAddress(ip, family);
    else trusted.addSubnet(ip, Number(bits), family);
  }
  return (ip) => trusted.check(ip, isIP(ip) === 6 ? "ipv6" : "ipv4");
}

/**
 * The socket peer of a request that carries forwarding headers (`X-Forwarded-For`, `Forwarded`) although that
 * peer is not in `[server] trusted_proxies`, or null: such a peer is most likely a proxy or load balancer the
 * operator did not declare, so every client behind it has that one address for rate limits.
 */
export function untrustedForwarder(trustedProxies: readonly string[]): (req: IncomingMessage) => string | null {
  const isTrusted = trustedProxyCheck(trustedProxies);
  return (req) => {
    if (req.headers["x-forwarded-for"] === undefined && req.headers.forwarded === undefined) return null;
    const peer = plainIp(req.socket.remoteAddress ?? "");
    if (peer !== null && isTrusted(peer)) return null;
    return peer ?? "?";
  };
}

/** `[server] trusted_proxies` (validated by config.ts: IP addresses or CIDR blocks) → the address function. */
export function clientAddressResolver(trustedProxies: readonly string[]): ClientAddressOf {
  const socketAddress = (req: IncomingMessage) => req.socket.remoteAddress ?? "?";
  if (trustedProxies.length === 0) return socketAddress;
  const isTrusted = trustedProxyCheck(trustedProxies);
  return (req) => {
    const peer = plainIp(req.socket.remoteAddress ?? "");
    if (peer === null || !isTrusted(peer)) return socketAddress(req);
    let client = peer;
    const hops = forwardedHops(req);
    for (let i = hops.length - 1; i >= 0; i--) {
      const hop = hops[i];
      if (hop === null || hop === undefined) return client;
      client = hop;
      if (!isTrusted(hop)) return client;
    }
    return client;
  };
}
