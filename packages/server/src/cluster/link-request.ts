/**
 * The link request between instances (design §14): `POST CLUSTER_LINK_REQUEST_PATH` (or the same body over a
 * standing channel, cluster/peer-ws.ts), JSON `{runner_id, frame, timeout_ms}`. The holder sends the frame over its
 * LOCAL link only (never forwarded again) and answers the RequestOutcome. It is authenticated by an HMAC-SHA256
 * over the timestamp and the body's sha256 under a key derived from the server secret every instance shares
 * (cluster/peer-auth.ts `clusterKey`), within CLUSTER_MAX_CLOCK_SKEW_MS of the holder's clock, with a body of at
 * most CLUSTER_MAX_BODY_BYTES, its headers checked before the body is read; anything else is refused with its
 * reason. It names the lease the caller read (`holder`), and is executed only over a link holding exactly that
 * lease. A replay inside the window repeats an idempotent frame (a run id the Runner admitted is answered with
 * that run; a cancel is sent to the agent at most once; a sync only reads). The caller's side is
 * cluster/remote-runner.ts; the holder's execution of it, cluster/forwarded.ts.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { InstanceId, ServerFrame } from "@webcodex/protocol";
import type { RequestOutcome, RunnerRequest } from "../link/hub.js";
import { type PeerAuth, readSignedRequest } from "./peer-auth.js";

/** The holder's endpoint for forwarded link requests (on the Server's own listener). */
export const CLUSTER_LINK_REQUEST_PATH = "/_wc/cluster/link-request";
/** The longest `timeout_ms` a caller may ask the holder to wait for the Runner. */
export const CLUSTER_MAX_REQUEST_TIMEOUT_MS = 120_000;
/** How much longer than `timeout_ms` the caller waits for the holder's HTTP answer. */
export const CLUSTER_FORWARD_SLACK_MS = 5_000;

/** What the holder does with a verified link request: send it over its local link only. */
export type ExecuteLinkRequest = (
  runnerId: string,
  frame: RunnerRequest,
  timeoutMs: number,
  /** A run.sync sent from a view of this agent instance: answered only by a link of that instance. */
  agentInstanceId?: string,
  /** A catch-up's run.sync: the instance asking follows the run from now on (cluster/run-push.ts). */
  follower?: PeerInstance,
  /**
   * The lease holder (`<instance id>/<link number>`) the caller read from the shared rows: executed only by
   * the link holding exactly that lease (cluster/holder-proof.ts).
   */
  holder?: string,
) => Promise<RequestOutcome>;

/**
 * The holder's `POST CLUSTER_LINK_REQUEST_PATH`. Refusals (4xx, nothing executed): those of
 * `readSignedRequest`; 400 a body that is not `{runner_id, frame, timeout_ms}` with a run.start / run.sync /
 * run.cancel frame and 1 … CLUSTER_MAX_REQUEST_TIMEOUT_MS (and the optional `agent_instance_id`, `follower`).
 */
export async function handleLinkRequest(
  req: IncomingMessage,
  res: ServerResponse,
  auth: PeerAuth,
  execute: ExecuteLinkRequest,
): Promise<void> {
  const body = await readSignedRequest(req, res, auth);
  if (body === null) return;
  const { status, answer } = await takeLinkRequest(body, execute);
  auth.answer(req, res, status, answer);
}

/**
 * The holder's answer to a verified link request body (a POST's or a channel's, cluster/peer-ws.ts): 400 one that
 * is not a request (which field, why), nothing executed; else 200 and the outcome of executing it.
 */
export async function takeLinkRequest(
  body: Buffer,
  execute: ExecuteLinkRequest,
): Promise<{ status: 200 | 400; answer: object }> {
  const parsed = parseLinkRequest(body);
  if (typeof parsed === "string") return { status: 400, answer: { error: "invalid_request", message: parsed } };
  const outcome = await execute(
    parsed.runnerId,
    parsed.frame,
    parsed.timeoutMs,
    parsed.agentInstanceId,
    parsed.follower,
    parsed.holder,
  );
  return { status: 200, answer: outcome };
}

/** Whether `value` names a link lease holder (link/leases.ts): `<instance id>/<link number>`. */
export function isLeaseHolder(value: unknown): value is string {
  return typeof value === "string" && /^[A-Za-z0-9_-]{1,64}\/\d{1,15}$/.test(value);
}

/** Longest base URL an instance may name for itself in a link request (`follower.url`). */
export const MAX_PEER_URL_LENGTH = 2_048;

/** An instance as it names itself to its peers: its id and the base URL they reach it on. */
export interface PeerInstance {
  instanceId: string;
  url: string;
}

/** `follower` of a link request, checked; a string says what is wrong. */
function parseFollower(value: unknown): PeerInstance | string {
  const bad = `follower (optional, on a run.sync) is {instance_id, url}: an instance id and an http(s) base URL of at most ${MAX_PEER_URL_LENGTH} characters`;
  if (typeof value !== "object" || value === null) return bad;
  const v = value as { instance_id?: unknown; url?: unknown };
  if (typeof v.instance_id !== "string" || !InstanceId.safeParse(v.instance_id).success) return bad;
  if (typeof v.url !== "string" || v.url.length > MAX_PEER_URL_LENGTH) return bad;
  let url: URL;
  try {
    url = new URL(v.url);
  } catch {
    return bad;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return bad;
  return { instanceId: v.instance_id, url: v.url };
}

/** The verified body, checked field by field; a string says what is wrong. */
function parseLinkRequest(body: Buffer):
  | {
      runnerId: string;
      frame: RunnerRequest;
      timeoutMs: number;
      agentInstanceId?: string;
      follower?: PeerInstance;
      holder?: string;
    }
  | string {
  let value: unknown;
  try {
    value = JSON.parse(body.toString("utf8"));
  } catch {
    return "the body is not JSON";
  }
  if (typeof value !== "object" || value === null) return "the body must be an object {runner_id, frame, timeout_ms}";
  const v = value as {
    runner_id?: unknown;
    frame?: unknown;
    timeout_ms?: unknown;
    agent_instance_id?: unknown;
    follower?: unknown;
    holder?: unknown;
  };
  if (typeof v.runner_id !== "string" || !/^[a-z0-9][a-z0-9_-]{0,63}$/.test(v.runner_id)) {
    return "runner_id must be a runner id";
  }
  const t = v.timeout_ms;
  if (typeof t !== "number" || !Number.isInteger(t) || t < 1 || t > CLUSTER_MAX_REQUEST_TIMEOUT_MS) {
    return `timeout_ms must be an integer 1 … ${CLUSTER_MAX_REQUEST_TIMEOUT_MS}`;
  }
  if (typeof v.frame !== "object" || v.frame === null) {
    return "frame must be a run.start, run.sync, run.cancel, run.changes or run.apply frame";
  }
  const type = (v.frame as { type?: unknown }).type;
  const types = ["run.start", "run.sync", "run.cancel", "run.changes", "run.apply"];
  if (typeof type !== "string" || !types.includes(type)) {
    return "frame.type must be run.start, run.sync, run.cancel, run.changes or run.apply";
  }
  // Checked as the frame the Runner will get (with a request id the holder's link assigns).
  const checked = ServerFrame.safeParse({ ...(v.frame as object), request_id: "r0_0" });
  if (!checked.success) {
    const issue = checked.error.issues[0];
    return `frame.${issue?.path.join(".") ?? "?"}: ${issue?.message ?? "invalid"}`;
  }
  const { request_id: _ignored, ...frame } = checked.data as ServerFrame & { request_id: string };
  const out: {
    runnerId: string;
    frame: RunnerRequest;
    timeoutMs: number;
    agentInstanceId?: string;
    follower?: PeerInstance;
    holder?: string;
  } = { runnerId: v.runner_id, frame: frame as RunnerRequest, timeoutMs: t };
  if (v.holder !== undefined) {
    if (!isLeaseHolder(v.holder)) return "holder (optional) is a lease holder: <instance id>/<link number>";
    out.holder = v.holder;
  }
  const expect = v.agent_instance_id;
  if (expect !== undefined) {
    if (type !== "run.sync" || typeof expect !== "string" || !InstanceId.safeParse(expect).success) {
      return "agent_instance_id (optional) is an agent instance id, and only on a run.sync";
    }
    out.agentInstanceId = expect;
  }
  if (v.follower !== undefined) {
    const follower = type === "run.sync" ? parseFollower(v.follower) : "follower is only on a run.sync";
    if (typeof follower === "string") return follower;
    out.follower = follower;
  }
  return out;
}
