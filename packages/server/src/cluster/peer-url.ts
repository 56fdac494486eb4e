/**
 * Plain http:// between instances only on loopback, unless the operator opted in (design §14; as the Runner's
 * ws:// rule, `[server] allow_insecure_transport`). The requests carry prompts and the answers agent output;
 * signatures make them authentic, not secret. A peer whose directory row names http:// on any other address
 * gets nothing from this instance (`not sent`) unless `[server.cluster] allow_insecure_transport = true`.
 */
import { isLoopbackHost } from "@webcodex/protocol";
import type { Logger } from "pino";
import { RefusalLog } from "../refusal-log.js";
import type { Post } from "./peer-http.js";

/** Refused sends to one insecure peer are logged at most once per this window. */
export const INSECURE_PEER_LOG_WINDOW_MS = 60_000;

/** Why a request to `url` must not be sent, or null: http:// to a host that is not a loopback address. */
export function insecurePeerRefusal(url: string, allowInsecure: boolean): string | null {
  if (allowInsecure || !URL.canParse(url)) return null;
  const u = new URL(url);
  if (u.protocol !== "http:") return null;
  const host = u.hostname.replace(/^\[|\]$/g, "");
  if (isLoopbackHost(host)) return null;
  return (
    `refusing plain http:// to the instance at ${u.host}, not a loopback address: serve the instances over ` +
    "https ([server.tls]) or set [server.cluster] allow_insecure_transport = true"
  );
}

/** `post`, except to a peer `insecurePeerRefusal` refuses: failed, never sent. */
export function guardInsecurePeers(post: Post, allowInsecure: boolean, log: Logger): Post {
  if (allowInsecure) return post;
  const refusals = new RefusalLog(log, 1, Date.now, INSECURE_PEER_LOG_WINDOW_MS, true);
  return (url, headers, body, timeoutMs, maxBodyBytes) => {
    const refused = insecurePeerRefusal(url, false);
    if (refused === null) return post(url, headers, body, timeoutMs, maxBodyBytes);
    refusals.refused(URL.canParse(url) ? new URL(url).host : "?", {}, refused);
    return Promise.resolve({ kind: "failed", sent: false, code: "insecure_peer" });
  };
}
