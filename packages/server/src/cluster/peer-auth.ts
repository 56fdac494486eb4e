/**
 * Trust between Server instances (design §14): what an instance checks before it reads a peer's request,
 * and how an answer is tied to the request it answers and to the instance that made it.
 *
 * - Before any body byte is read, a request's headers are checked: a timestamp within
 *   CLUSTER_MAX_CLOCK_SKEW_MS, a signature of the right form, a declared `content-length` of at most
 *   CLUSTER_MAX_BODY_BYTES. Anything else is refused from the headers alone (401 / 411 / 413, `connection:
 *   close`, the body never read). The signature covers the body, so it is verified once the body is read:
 *   until then the body's bytes are reserved from one budget per instance (CLUSTER_UNVERIFIED_BYTES_TOTAL,
 *   503 `busy` past it), released on every path, and a body not read within CLUSTER_BODY_READ_TIMEOUT_MS
 *   ends its connection. One connection reads one body at a time, so one connection holds at most
 *   CLUSTER_MAX_BODY_BYTES of it.
 * - Every answer is signed by the answering instance: HMAC-SHA256 under the cluster key over the request's
 *   own signature (which covers its timestamp and body), the answering instance's id, the status and the
 *   sha256 of the answer's body (`signAnswer`). The requester takes an answer only when it verifies and
 *   names the instance it meant to ask (`verifyAnswer`); anything else is "no answer" (outcome unknown).
 * - Refusals are logged through one RefusalLog per instance: at most one line per source address and
 *   CLUSTER_REFUSAL_LOG_WINDOW_MS, and one more at the window's end with the count of the rest.
 */
import { createHash, createHmac, timingSafeEqual } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { MAX_FRAME_BYTES } from "@webcodex/protocol";
import type { Logger } from "pino";
import { ABORTED, readBodyBytes, TOO_LARGE } from "../http-body.js";
import { RefusalLog } from "../refusal-log.js";

/** What a request to a peer came back with (cluster/peer-http.ts `postToPeer`, cluster/peer-ws.ts channels). */
export type PeerAnswer =
  /** `signer` and `signature`: the answering instance's id and its signature of the answer (below). */
  | { kind: "answered"; status: number; text: string; signer?: string; signature?: string }
  /** No answer: `sent` false when the request cannot have left (the connection was never made). */
  | { kind: "failed"; sent: boolean; code: string | null };

/** A request body's bound between instances: one frame (a run.start with its prompt) and its envelope. */
export const CLUSTER_MAX_BODY_BYTES = MAX_FRAME_BYTES + 16 * 1024;

/** Unverified request bodies this instance holds at once, over all its peers' connections. */
export const CLUSTER_UNVERIFIED_BYTES_TOTAL = 16 * 1024 * 1024;
/** A request body not read whole within this long (a stalled sender) ends its connection. */
export const CLUSTER_BODY_READ_TIMEOUT_MS = 10_000;
/** Refused requests between instances are logged at most once per source address per this window. */
export const CLUSTER_REFUSAL_LOG_WINDOW_MS = 10_000;
/** The answering instance's id, and its signature of the answer (see the header). */
export const CLUSTER_ANSWER_INSTANCE_HEADER = "x-webcodex-cluster-instance";
export const CLUSTER_ANSWER_SIGNATURE_HEADER = "x-webcodex-cluster-answer-signature";

const TIMESTAMP = /^\d{1,15}$/;
const SIGNATURE = /^[0-9a-f]{64}$/;
/** Server instance ids (server.ts: 12 random bytes, base64url). */
const INSTANCE = /^[A-Za-z0-9_-]{1,64}$/;

/** Counts of the instance's side of its peers' requests (`/__test/cluster-stats`). */
export interface PeerAuthCounts {
  /** Bytes of unverified bodies held now, and the most ever held at once. */
  unverified_bytes: number;
  unverified_bytes_peak: number;
  /** Requests refused from their headers, before any body byte was read. */
  refused_before_body: number;
  /** Requests refused because CLUSTER_UNVERIFIED_BYTES_TOTAL was held. */
  refused_busy: number;
  /** Requests whose body did not verify under the key. */
  refused_signature: number;
}

/** Why a message between instances is refused (always 401), or null when it verifies. */
export interface SignatureRefusal {
  status: 401;
  error: "bad_timestamp" | "stale_timestamp" | "bad_signature";
  message: string;
}

/** The request headers of a signed message: the sender's clock (epoch ms) and the signature (hex). */
export const CLUSTER_TIMESTAMP_HEADER = "x-webcodex-cluster-timestamp";
export const CLUSTER_SIGNATURE_HEADER = "x-webcodex-cluster-signature";
/** How far a request's timestamp may be from the holder's clock, either way. */
export const CLUSTER_MAX_CLOCK_SKEW_MS = 30_000;

/** hex HMAC-SHA256 over `timestamp ‖ "\n" ‖ sha256(body)`. */
export function signLinkRequest(key: Buffer, timestamp: string, body: Buffer): string {
  const digest = createHash("sha256").update(body).digest("hex");
  return createHmac("sha256", key).update(`${timestamp}\n${digest}`).digest("hex");
}

/** The header checks made before a body is read: the timestamp's form and window, the signature's form. */
export function headerRefusal(timestamp: unknown, signature: unknown, nowMs = Date.now()): SignatureRefusal | null {
  if (typeof timestamp !== "string" || !TIMESTAMP.test(timestamp)) {
    return {
      status: 401,
      error: "bad_timestamp",
      message: `${CLUSTER_TIMESTAMP_HEADER} must be the sender's clock in epoch milliseconds`,
    };
  }
  if (Math.abs(nowMs - Number(timestamp)) > CLUSTER_MAX_CLOCK_SKEW_MS) {
    return {
      status: 401,
      error: "stale_timestamp",
      message: `${CLUSTER_TIMESTAMP_HEADER} is more than ${CLUSTER_MAX_CLOCK_SKEW_MS} ms from this instance's clock`,
    };
  }
  if (typeof signature !== "string" || !SIGNATURE.test(signature)) {
    return { status: 401, error: "bad_signature", message: `${CLUSTER_SIGNATURE_HEADER} must be 64 hex digits` };
  }
  return null;
}

/** `headerRefusal`, then the signature over the exact `body` under `key`. */
export function signatureRefusal(
  key: Buffer,
  timestamp: unknown,
  signature: unknown,
  body: Buffer,
): SignatureRefusal | null {
  const early = headerRefusal(timestamp, signature);
  if (early !== null) return early;
  const expected = Buffer.from(signLinkRequest(key, timestamp as string, body), "hex");
  if (!timingSafeEqual(expected, Buffer.from(signature as string, "hex"))) {
    return { status: 401, error: "bad_signature", message: "the signature does not verify under this cluster's key" };
  }
  return null;
}

/** The headers of a signed request to another instance. */
export function signedHeaders(key: Buffer, body: Buffer): Record<string, string> {
  const timestamp = String(Date.now());
  return {
    "content-type": "application/json",
    [CLUSTER_TIMESTAMP_HEADER]: timestamp,
    [CLUSTER_SIGNATURE_HEADER]: signLinkRequest(key, timestamp, body),
  };
}

/** hex HMAC-SHA256 of an answer: bound to the request's signature, the answering instance, status and body. */
export function signAnswer(
  key: Buffer,
  requestSignature: string,
  instanceId: string,
  status: number,
  body: string,
): string {
  const digest = createHash("sha256").update(body, "utf8").digest("hex");
  return createHmac("sha256", key)
    .update(`answer\n${requestSignature}\n${instanceId}\n${status}\n${digest}`)
    .digest("hex");
}

/**
 * `answer` when it is signed by `expectedInstance` for the request signed `requestSignature`; else a failure
 * that may have been sent (an unsigned, wrongly signed or mismatched answer says nothing about what was done).
 */
export function verifyAnswer(
  key: Buffer,
  requestSignature: string,
  expectedInstance: string,
  answer: PeerAnswer,
): PeerAnswer {
  if (answer.kind !== "answered") return answer;
  const { signer, signature } = answer;
  if (signer !== expectedInstance || signature === undefined || !SIGNATURE.test(signature)) {
    return { kind: "failed", sent: true, code: signer === undefined ? "unsigned_answer" : "answer_from_another" };
  }
  const expected = Buffer.from(signAnswer(key, requestSignature, signer, answer.status, answer.text), "hex");
  if (!timingSafeEqual(expected, Buffer.from(signature, "hex"))) {
    return { kind: "failed", sent: true, code: "bad_answer_signature" };
  }
  return answer;
}

/** The key link requests are signed with: derived from the server secret, used for nothing else. */
export function clusterKey(serverSecret: Buffer): Buffer {
  return createHmac("sha256", serverSecret).update("webcodex.cluster.link-request.v1").digest();
}

/** Whether `value` can be an answering instance's id (an answer header). */
export function isInstanceId(value: unknown): value is string {
  return typeof value === "string" && INSTANCE.test(value);
}

/** This instance's side of its peers' requests: the checks before and after a body, the answers' signatures. */
export class PeerAuth {
  readonly counts: PeerAuthCounts = {
    unverified_bytes: 0,
    unverified_bytes_peak: 0,
    refused_before_body: 0,
    refused_busy: 0,
    refused_signature: 0,
  };
  readonly #refusals: RefusalLog;

  constructor(
    readonly key: Buffer,
    /** This instance's id: named in, and covered by, the signature of each of its answers. */
    readonly instanceId: string,
    log: Logger,
    readonly maxUnverifiedBytes = CLUSTER_UNVERIFIED_BYTES_TOTAL,
  ) {
    this.#refusals = new RefusalLog(log, 1, Date.now, CLUSTER_REFUSAL_LOG_WINDOW_MS, true);
  }

  /** Reserve `bytes` of unverified body; the release (call it on every path), or null past the budget. */
  reserve(bytes: number): (() => void) | null {
    if (this.counts.unverified_bytes + bytes > this.maxUnverifiedBytes) {
      this.counts.refused_busy += 1;
      return null;
    }
    this.counts.unverified_bytes += bytes;
    this.counts.unverified_bytes_peak = Math.max(this.counts.unverified_bytes_peak, this.counts.unverified_bytes);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.counts.unverified_bytes -= bytes;
    };
  }

  /** Count and log (bounded, see the header) one refused request or channel from `remote`. */
  refused(remote: string, what: string, error: string, beforeBody: boolean): void {
    if (beforeBody) this.counts.refused_before_body += 1;
    else if (error === "bad_signature") this.counts.refused_signature += 1;
    this.#refusals.refused(remote, { error, what }, "cluster request refused");
  }

  /** The answer headers for `status` and `body`, answering the request signed `requestSignature`. */
  answerHeaders(requestSignature: string, status: number, body: string): Record<string, string> {
    return {
      [CLUSTER_ANSWER_INSTANCE_HEADER]: this.instanceId,
      [CLUSTER_ANSWER_SIGNATURE_HEADER]: signAnswer(this.key, requestSignature, this.instanceId, status, body),
    };
  }

  /** Write a signed JSON answer to a verified request. */
  answer(req: IncomingMessage, res: ServerResponse, status: number, answer: object): void {
    if (res.headersSent) return;
    const body = JSON.stringify(answer);
    const signature = String(req.headers[CLUSTER_SIGNATURE_HEADER] ?? "");
    res.writeHead(status, { "content-type": "application/json", ...this.answerHeaders(signature, status, body) });
    res.end(body);
  }
}

/** A request between instances refused before anything was executed: `{error, message}` with its status. */
export function refuse(res: ServerResponse, status: number, error: string, message: string, close = false): void {
  if (res.headersSent) return;
  // The body was not read (or not whole): the connection is not reused.
  if (close) res.setHeader("connection", "close");
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify({ error, message }));
}

/**
 * A signed POST between instances, checked and read: its body, or null when it was refused (answered here,
 * nothing to execute). From the headers alone, the body unread: 405 not POST; 401 a missing or malformed
 * timestamp or signature, or a timestamp outside CLUSTER_MAX_CLOCK_SKEW_MS; 411 no `content-length`; 413 one
 * over CLUSTER_MAX_BODY_BYTES; 503 CLUSTER_UNVERIFIED_BYTES_TOTAL held by other unverified bodies. Then, the
 * body read (within CLUSTER_BODY_READ_TIMEOUT_MS): 401 a signature that does not verify under the key.
 */
export async function readSignedRequest(
  req: IncomingMessage,
  res: ServerResponse,
  auth: PeerAuth,
): Promise<Buffer | null> {
  const remote = req.socket.remoteAddress ?? "?";
  const what = `${req.method ?? "?"} ${req.url ?? "?"}`;
  if (req.method !== "POST") {
    refuse(res, 405, "method_not_allowed", "cluster requests are POST", true);
    return null;
  }
  const early = headerRefusal(req.headers[CLUSTER_TIMESTAMP_HEADER], req.headers[CLUSTER_SIGNATURE_HEADER]);
  if (early !== null) {
    auth.refused(remote, what, early.error, true);
    refuse(res, early.status, early.error, early.message, true);
    return null;
  }
  const declared = req.headers["content-length"];
  const length = declared !== undefined && /^\d{1,9}$/.test(declared) ? Number(declared) : null;
  if (length === null) {
    auth.refused(remote, what, "length_required", true);
    refuse(res, 411, "length_required", "a cluster request declares its content-length", true);
    return null;
  }
  if (length > CLUSTER_MAX_BODY_BYTES) {
    auth.refused(remote, what, "body_too_large", true);
    refuse(res, 413, "body_too_large", `a cluster request body is at most ${CLUSTER_MAX_BODY_BYTES} bytes`, true);
    return null;
  }
  const release = auth.reserve(length);
  if (release === null) {
    auth.refused(remote, what, "busy", true);
    refuse(res, 503, "busy", "too many cluster requests are being read; retry", true);
    return null;
  }
  const stalled = setTimeout(() => req.destroy(), CLUSTER_BODY_READ_TIMEOUT_MS);
  let body: Awaited<ReturnType<typeof readBodyBytes>>;
  try {
    body = await readBodyBytes(req, length);
  } finally {
    clearTimeout(stalled);
    release();
  }
  if (body === TOO_LARGE) {
    refuse(res, 413, "body_too_large", "the body is longer than its content-length", true);
    return null;
  }
  if (body === ABORTED) return null; // the sender went away (or stalled): nobody reads an answer
  const refusal = signatureRefusal(
    auth.key,
    req.headers[CLUSTER_TIMESTAMP_HEADER],
    req.headers[CLUSTER_SIGNATURE_HEADER],
    body,
  );
  if (refusal !== null) {
    auth.refused(remote, what, refusal.error, false);
    refuse(res, refusal.status, refusal.error, refusal.message);
    return null;
  }
  return body;
}
