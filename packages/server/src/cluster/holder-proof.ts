/**
 * A prompt goes only to the instance that holds the Runner's link now (design §14). Before a forwarded
 * run.start leaves, the requester asks the instance at the holder's URL to prove it holds the lease the shared
 * rows name (`POST CLUSTER_HOLDER_PROOF_PATH`, `{runner_id, holder}`, signed like every request between
 * instances, no prompt in it). The holder answers `{holds: true}` only while its own live link holds exactly
 * that lease (`<instance id>/<link number>`), and signs the answer for this request and under its own instance
 * id (cluster/peer-auth.ts). Anything else — a process that took a dead instance's port, an instance of the
 * cluster that is not that holder, no answer — means the start is not sent (`not_sent`: nothing can have run).
 * The start itself names the lease again, and the holder executes it only over a link holding that lease.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { RunnerId } from "@webcodex/protocol";
import { z } from "zod";
import {
  CLUSTER_SIGNATURE_HEADER,
  type PeerAuth,
  readSignedRequest,
  signedHeaders,
  verifyAnswer,
} from "./peer-auth.js";
import type { Post } from "./peer-http.js";

/** The holder's endpoint for proofs that it holds a Runner's link lease. */
export const CLUSTER_HOLDER_PROOF_PATH = "/_wc/cluster/holder-proof";
/** How long the requester waits for a proof. */
export const HOLDER_PROOF_TIMEOUT_MS = 5_000;
/** A proof's answer is read up to this many bytes. */
export const HOLDER_PROOF_ANSWER_MAX_BYTES = 1_024;

const LEASE_HOLDER = z.string().regex(/^[A-Za-z0-9_-]{1,64}\/\d{1,15}$/, "must be <instance id>/<link number>");
const ProofRequest = z.object({ runner_id: RunnerId, holder: LEASE_HOLDER }).strict();

/**
 * Ask the instance at `url` (whose id is `instanceId`) to prove it holds `holder`, the lease of `runnerId`:
 * null when it did, else why not (for the log).
 */
export async function proveHolder(
  post: Post,
  key: Buffer,
  url: string,
  instanceId: string,
  runnerId: string,
  holder: string,
): Promise<string | null> {
  if (!holder.startsWith(`${instanceId}/`)) return "the lease names another instance";
  const body = Buffer.from(JSON.stringify({ runner_id: runnerId, holder }), "utf8");
  const headers = signedHeaders(key, body);
  const raw = await post(
    `${url}${CLUSTER_HOLDER_PROOF_PATH}`,
    headers,
    body,
    HOLDER_PROOF_TIMEOUT_MS,
    HOLDER_PROOF_ANSWER_MAX_BYTES,
  );
  const answer = verifyAnswer(key, headers[CLUSTER_SIGNATURE_HEADER] ?? "", instanceId, raw);
  if (answer.kind === "failed") return answer.code ?? "no answer";
  if (answer.status !== 200) return `answered ${answer.status}`;
  try {
    return (JSON.parse(answer.text) as { holds?: unknown }).holds === true ? null : "it does not hold the lease";
  } catch {
    return "not an answer of ours";
  }
}

/** Whether this instance's live link of `runnerId` holds exactly the lease `holder`. */
export type HoldsLease = (runnerId: string, holder: string) => boolean;

/** The holder's `POST CLUSTER_HOLDER_PROOF_PATH`: refusals of `readSignedRequest`, 400 a malformed body, else `{holds}`. */
export async function handleHolderProof(
  req: IncomingMessage,
  res: ServerResponse,
  auth: PeerAuth,
  holds: HoldsLease,
): Promise<void> {
  const body = await readSignedRequest(req, res, auth);
  if (body === null) return;
  let value: unknown;
  try {
    value = JSON.parse(body.toString("utf8"));
  } catch {
    value = null;
  }
  const parsed = ProofRequest.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    auth.answer(req, res, 400, {
      error: "invalid_request",
      message: `${issue?.path.join(".") || "body"}: ${issue?.message ?? "invalid"} (a proof asks {runner_id, holder})`,
    });
    return;
  }
  auth.answer(req, res, 200, { holds: holds(parsed.data.runner_id, parsed.data.holder) });
}
