/**
 * One delivery attempt: a signed POST of an event's body to its subscription's URL, fenced like the OAuth
 * client-metadata fetch — the destination checked again (`parseDestination`) and at connect
 * (`destinationLookup`), no redirects followed (a 3xx is a failure), ATTEMPT_TIMEOUT_MS for the whole
 * exchange, at most MAX_RESPONSE_BYTES of the answer read and then dropped (nothing of it is kept). The
 * outcome is a result, never a throw; its `error` is a short fixed classification, never the receiver's words.
 */
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import { DestinationError, type DestinationPolicy, destinationLookup, parseDestination } from "./destination.js";
import { signedHeaders } from "./signing.js";

/** The whole exchange of one attempt: connect, send, the answer's status and (bounded) body. */
export const ATTEMPT_TIMEOUT_MS = 10_000;
/** Bytes of a receiver's answer read (and discarded) at most; past them the connection is closed. */
export const MAX_RESPONSE_BYTES = 4096;
/** The User-Agent of every attempt. */
export const WEBHOOK_USER_AGENT = "webcodex-webhooks/1";

/** The error of an attempt aborted by its caller (not the receiver's doing: not recorded as a failure). */
export const ABORTED_ERROR = "aborted";

export type AttemptOutcome = { ok: true; status: number } | { ok: false; status: number | null; error: string };

export interface AttemptInput {
  url: string;
  /** The secrets it is signed with (signing.ts `signedHeaders`). */
  secrets: readonly string[];
  eventId: string;
  body: string;
  nowMs: number;
  policy: DestinationPolicy;
  /** Extra trusted CA certificates (tests with a self-signed https receiver). */
  ca?: string;
  timeoutMs?: number;
  /** Aborts the attempt (the Server is stopping): the outcome is then `{ok: false, error: "aborted"}`. */
  signal?: AbortSignal;
}

export async function attemptDelivery(input: AttemptInput): Promise<AttemptOutcome> {
  let url: URL;
  try {
    url = parseDestination(input.url, input.policy);
  } catch (err) {
    return { ok: false, status: null, error: err instanceof DestinationError ? "refused destination" : "bad url" };
  }
  const timeoutMs = input.timeoutMs ?? ATTEMPT_TIMEOUT_MS;
  const headers = {
    ...signedHeaders(input.secrets, input.eventId, Math.floor(input.nowMs / 1000), input.body),
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(input.body)),
    "user-agent": WEBHOOK_USER_AGENT,
  };
  const request = url.protocol === "https:" ? httpsRequest : httpRequest;
  return await new Promise<AttemptOutcome>((resolve) => {
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = input.signal ? AbortSignal.any([timeout, input.signal]) : timeout;
    let settled = false;
    const settle = (outcome: AttemptOutcome) => {
      if (settled) return;
      settled = true;
      resolve(outcome);
    };
    const req = request(
      url,
      {
        method: "POST",
        headers,
        agent: false,
        lookup: destinationLookup(url.protocol, input.policy) as never,
        signal,
        ...(input.ca ? { ca: input.ca } : {}),
      },
      (res) => {
        const status = res.statusCode ?? 0;
        let read = 0;
        res.on("data", (chunk: Buffer) => {
          read += chunk.byteLength;
          if (read > MAX_RESPONSE_BYTES) res.destroy();
        });
        const done = () => {
          if (status >= 200 && status < 300) settle({ ok: true, status });
          else if (status >= 300 && status < 400) settle({ ok: false, status, error: "redirect not followed" });
          else settle({ ok: false, status, error: `HTTP ${status}` });
        };
        res.once("end", done);
        res.once("close", done);
        res.once("error", done);
      },
    );
    req.on("error", (err: NodeJS.ErrnoException) => {
      if (input.signal?.aborted) settle({ ok: false, status: null, error: ABORTED_ERROR });
      else if (signal.aborted) settle({ ok: false, status: null, error: "timeout" });
      else if (err.code === "EREFUSED_ADDRESS") settle({ ok: false, status: null, error: "refused address" });
      else settle({ ok: false, status: null, error: `connection failed (${err.code ?? "error"})` });
    });
    req.end(input.body);
  });
}
