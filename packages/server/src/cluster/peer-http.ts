/**
 * One POST to another Server instance (cluster/link-request.ts), over `node:http`/`node:https` with keep-alive
 * agents: a connection to a peer is reused across requests instead of made per request. `fetch` did the
 * same job at several times the CPU (Web streams and a Response per request, profiled in the cluster
 * fan-out), on the path every cross-instance wake-up takes.
 */
import http from "node:http";
import https from "node:https";
import { ABORTED, readBody, TOO_LARGE } from "../http-body.js";
import {
  CLUSTER_ANSWER_INSTANCE_HEADER,
  CLUSTER_ANSWER_SIGNATURE_HEADER,
  isInstanceId,
  type PeerAnswer,
} from "./peer-auth.js";

/** Connections to one peer at most; more requests wait for one of them (each is bounded by its timeout). */
export const PEER_MAX_SOCKETS = 256;
/**
 * An idle connection to a peer is closed after this long: below the peer's HTTP keep-alive timeout (Node's
 * default 5 s), so a request is not written to a connection the peer is closing.
 */
export const PEER_IDLE_SOCKET_MS = 4_000;

const AGENT_OPTIONS = { keepAlive: true, maxSockets: PEER_MAX_SOCKETS, timeout: PEER_IDLE_SOCKET_MS } as const;
const HTTP_AGENT = new http.Agent(AGENT_OPTIONS);
const HTTPS_AGENT = new https.Agent(AGENT_OPTIONS);

/** Errors a transport reports when the connection was never made: nothing was sent. */
const NEVER_CONNECTED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"]);

/** What a request to a peer came back with (defined beside the answer's signature check, cluster/peer-auth.ts). */
export type { PeerAnswer };

/** How a request reaches a peer: `postToPeer`, or over a standing channel (cluster/peer-ws.ts `PeerChannels.post`). */
export type Post = (
  url: string,
  headers: Record<string, string>,
  body: Buffer,
  timeoutMs: number,
  maxBodyBytes: number,
) => Promise<PeerAnswer>;

/**
 * POST `body` to `url`; the answer's body is read up to `maxBodyBytes` (beyond that, or past `timeoutMs`
 * from the start, the request fails as possibly sent).
 */
export function postToPeer(
  url: string,
  headers: Record<string, string>,
  body: Buffer,
  timeoutMs: number,
  maxBodyBytes: number,
): Promise<PeerAnswer> {
  return new Promise((resolve) => {
    let settled = false;
    let connected = false;
    const done = (answer: PeerAnswer) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(answer);
    };
    const target = new URL(url);
    const secure = target.protocol === "https:";
    const req = (secure ? https : http).request(
      target,
      {
        method: "POST",
        agent: secure ? HTTPS_AGENT : HTTP_AGENT,
        headers: { ...headers, "content-length": String(body.length) },
      },
      async (res) => {
        const text = await readBody(res, maxBodyBytes);
        if (text === TOO_LARGE) {
          req.destroy();
          done({ kind: "failed", sent: true, code: "body_too_large" });
        } else if (text === ABORTED) done({ kind: "failed", sent: true, code: null });
        else {
          const signer = res.headers[CLUSTER_ANSWER_INSTANCE_HEADER];
          const signature = res.headers[CLUSTER_ANSWER_SIGNATURE_HEADER];
          done({
            kind: "answered",
            status: res.statusCode ?? 0,
            text,
            ...(isInstanceId(signer) && typeof signature === "string" ? { signer, signature } : {}),
          });
        }
      },
    );
    // A reused connection is connected already; a new one reports when it is.
    req.on("socket", (socket) => {
      if (!socket.connecting) connected = true;
      else socket.once("connect", () => (connected = true));
    });
    req.on("error", (err: NodeJS.ErrnoException) => {
      const code = typeof err.code === "string" ? err.code : null;
      done({ kind: "failed", sent: connected || code === null || !NEVER_CONNECTED.has(code), code });
    });
    const timer = setTimeout(() => {
      req.destroy();
      done({ kind: "failed", sent: true, code: "timeout" });
    }, timeoutMs);
    req.end(body);
  });
}
