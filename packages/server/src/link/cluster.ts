/**
 * Routing between Server instances on one PostgreSQL state (design §14): any instance answers a start, an
 * observe or a cancel for a Runner whose one live link another instance holds.
 *
 * - The directory (`server_instances`, schema step 13): every instance writes its id and the URL its peers
 *   reach it on (`[server.cluster] advertise_url`, default the instances' own listener) at start and every
 *   CLUSTER_HEARTBEAT_MS; a row not refreshed for CLUSTER_INSTANCE_STALE_MS names no live instance.
 * - A remote Runner (`remoteRunner`): its presence row (what its hello advertised, link/presence.ts), its
 *   lease row (which instance holds the link, link/lease-store.ts) and that instance's directory row. The
 *   fences come from the hello the holder accepted; a view gone stale (the Runner restarted meanwhile) makes
 *   the Runner refuse the start (`stale_runner`), never run it twice.
 * - The link request (`POST CLUSTER_LINK_REQUEST_PATH`, JSON `{runner_id, frame, timeout_ms}`): the holder
 *   sends the frame over its LOCAL link only (never forwarded again) and answers the RequestOutcome. It is
 *   authenticated by an HMAC-SHA256 over the timestamp and the body's sha256 under a key derived from the
 *   server secret every instance shares (`clusterKey`), within CLUSTER_MAX_CLOCK_SKEW_MS of the holder's
 *   clock, with a body of at most CLUSTER_MAX_BODY_BYTES, its headers checked before the body is read; anything
 *   else is refused with its reason (link/peer-auth.ts). It names the lease the caller read (`holder`), and
 *   is executed only over a link holding exactly that lease; a run.start leaves only after the holder proved
 *   it holds it (link/holder-proof.ts). A replay inside the window repeats an idempotent frame (a run id the
 *   Runner admitted is answered with that run; a cancel is sent to the agent at most once; a sync only reads).
 * - The caller (`RemoteRunnerConnection.request`) takes only an answer the holder signed for this request
 *   (link/peer-auth.ts `verifyAnswer`). A failure before the request could have left (the peer refused the
 *   connection, the holder gave no proof for a start, or it answered a signed refusal before executing
 *   anything) is `not_sent`; any failure after it may have left, and any answer it did not sign, is `timeout`
 *   — unknown, exactly like a run.start whose answer never came (design §6.1: the record stays `sent` and
 *   reconciliation or a same-key retry settles it).
 */
import { createHmac } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import {
  InstanceId,
  type ProjectAdvert,
  type ProviderAdvert,
  RunnerFrame,
  type RunnerResponse,
  ServerFrame,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import type { StateEngine } from "../state/engine.js";
import { proveHolder } from "./holder-proof.js";
import type { RequestOutcome, RunnerRequest } from "./hub.js";
import {
  CLUSTER_MAX_BODY_BYTES,
  CLUSTER_SIGNATURE_HEADER,
  type PeerAuth,
  readSignedRequest,
  signedHeaders,
  verifyAnswer,
} from "./peer-auth.js";
import { type Post, postToPeer } from "./peer-http.js";
import { PRESENCE_STALE_MS } from "./presence.js";

/** How often an instance rewrites its directory row. */
export const CLUSTER_HEARTBEAT_MS = 5_000;
/** A directory row not rewritten for this long names no live instance (three missed heartbeats). */
export const CLUSTER_INSTANCE_STALE_MS = 3 * CLUSTER_HEARTBEAT_MS;
/** The holder's endpoint for forwarded link requests (on the Server's own listener). */
export const CLUSTER_LINK_REQUEST_PATH = "/_wc/cluster/link-request";
/** The longest `timeout_ms` a caller may ask the holder to wait for the Runner. */
export const CLUSTER_MAX_REQUEST_TIMEOUT_MS = 120_000;
/** How much longer than `timeout_ms` the caller waits for the holder's HTTP answer. */
export const CLUSTER_FORWARD_SLACK_MS = 5_000;
export {
  CLUSTER_MAX_BODY_BYTES,
  CLUSTER_MAX_CLOCK_SKEW_MS,
  CLUSTER_SIGNATURE_HEADER,
  CLUSTER_TIMESTAMP_HEADER,
  readSignedRequest,
  refuse,
  type SignatureRefusal,
  signatureRefusal,
  signedHeaders,
  signLinkRequest,
} from "./peer-auth.js";

/** The key link requests are signed with: derived from the server secret, used for nothing else. */
export function clusterKey(serverSecret: Buffer): Buffer {
  return createHmac("sha256", serverSecret).update("webcodex.cluster.link-request.v1").digest();
}

/** What a link to a Runner does, whichever instance holds it (hub.ts RunnerConnection, or the holder's). */
export interface LinkConnection {
  readonly runnerId: string;
  readonly closed: boolean;
  request(req: RunnerRequest, timeoutMs?: number): Promise<RequestOutcome>;
}

/** How a RemoteRunnerConnection reaches and names things (all optional: tests leave most out). */
export interface RemoteRunnerOptions {
  /** The agent instance this view names: a forwarded run.sync is answered only by that instance's link. */
  agentInstanceId?: string;
  /** This instance as its peers reach it: named in a catch-up's run.sync, so the holder pushes the run's updates. */
  self?: PeerInstance;
  /**
   * The lease holder the shared rows name (`<instance id>/<link number>`): named in every request, which the
   * holder executes only while its link holds exactly that lease; a run.start leaves only after the instance
   * at `holderUrl` proved it holds it (link/holder-proof.ts). Without it no run.start is sent.
   */
  holderLease?: string;
  /**
   * How a run.sync reaches the holder (over a standing channel, link/peer-ws.ts); starts and cancels are
   * always POSTs (`post`), whose "not sent" (the connection was never made) is what a start's outcome rests on.
   */
  syncPost?: Post;
  post?: Post;
}

/** A Runner's link held by another instance, reached through that instance's link-request endpoint. */
export class RemoteRunnerConnection implements LinkConnection {
  readonly closed = false;
  /** Set when a request through this view found the holder without that Runner (answered not_sent). */
  missed = false;

  constructor(
    readonly runnerId: string,
    /** The holder's directory row: its id and base URL. */
    readonly holderInstanceId: string,
    readonly holderUrl: string,
    private readonly key: Buffer,
    private readonly defaultTimeoutMs: number,
    private readonly log: Logger,
    private readonly opts: RemoteRunnerOptions = {},
  ) {}

  async request(req: RunnerRequest, timeoutMs = this.defaultTimeoutMs): Promise<RequestOutcome> {
    const outcome = await this.#request(req, timeoutMs);
    if (!outcome.ok && outcome.reason === "not_sent") this.missed = true;
    return outcome;
  }

  async #request(req: RunnerRequest, timeoutMs: number): Promise<RequestOutcome> {
    const { agentInstanceId, self, holderLease } = this.opts;
    const post = this.opts.post ?? postToPeer;
    if (req.type === "run.start") {
      // A prompt goes only to the instance that proves it holds the Runner's link now.
      const unproven =
        holderLease === undefined
          ? "no lease holder known"
          : await proveHolder(post, this.key, this.holderUrl, this.holderInstanceId, this.runnerId, holderLease);
      if (unproven !== null) {
        this.log.error(
          { runner_id: this.runnerId, holder: this.holderInstanceId, reason: unproven },
          "the instance named holder of the runner's link did not prove it holds it; run.start not sent",
        );
        return { ok: false, reason: "not_sent" };
      }
    }
    const wait = Math.min(Math.max(1, Math.trunc(timeoutMs)), CLUSTER_MAX_REQUEST_TIMEOUT_MS);
    const expect =
      req.type === "run.sync" && agentInstanceId !== undefined ? { agent_instance_id: agentInstanceId } : {};
    // A catch-up (it asks for events) follows the run: the holder pushes it the run's next updates.
    const follow =
      req.type === "run.sync" && req.max_events > 0 && self !== undefined
        ? { follower: { instance_id: self.instanceId, url: self.url } }
        : {};
    const lease = holderLease !== undefined ? { holder: holderLease } : {};
    const body = Buffer.from(
      JSON.stringify({ runner_id: this.runnerId, frame: req, timeout_ms: wait, ...expect, ...follow, ...lease }),
      "utf8",
    );
    const headers = signedHeaders(this.key, body);
    const raw = await (req.type === "run.sync" ? (this.opts.syncPost ?? post) : post)(
      `${this.holderUrl}${CLUSTER_LINK_REQUEST_PATH}`,
      headers,
      body,
      wait + CLUSTER_FORWARD_SLACK_MS,
      CLUSTER_MAX_BODY_BYTES,
    );
    // Only an answer the holder signed for this very request counts; anything else says nothing.
    const answer = verifyAnswer(this.key, headers[CLUSTER_SIGNATURE_HEADER] ?? "", this.holderInstanceId, raw);
    if (answer.kind === "failed") {
      this.log.warn(
        { runner_id: this.runnerId, holder: this.holderInstanceId, type: req.type, code: answer.code },
        answer.sent
          ? "forwarded link request: outcome unknown"
          : "the instance holding the runner's link cannot be reached; not sent",
      );
      return { ok: false, reason: answer.sent ? "timeout" : "not_sent" };
    }
    const { status, text } = answer;
    if (status >= 400 && status < 500) {
      // The holder refused the request before executing anything (see handleLinkRequest).
      this.log.error(
        { runner_id: this.runnerId, holder: this.holderInstanceId, status, refusal: text.slice(0, 300) },
        "the instance holding the runner's link refused a forwarded request; not sent",
      );
      return { ok: false, reason: "not_sent" };
    }
    if (status !== 200) return { ok: false, reason: "timeout" };
    return parseOutcome(text) ?? { ok: false, reason: "timeout" };
  }
}

/** The holder's answer, checked: a Runner response frame, or a not-ok reason. Null when it is neither. */
function parseOutcome(text: string): RequestOutcome | null {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof value !== "object" || value === null) return null;
  const v = value as { ok?: unknown; reason?: unknown; frame?: unknown };
  if (v.ok === false) {
    const r = v.reason;
    return r === "timeout" || r === "closed" || r === "busy" || r === "not_sent" ? { ok: false, reason: r } : null;
  }
  if (v.ok !== true) return null;
  const parsed = RunnerFrame.safeParse(v.frame);
  if (!parsed.success) return null;
  const f = parsed.data;
  const responses: readonly string[] = ["run.start.result", "run.sync.result", "run.cancel.result", "error"];
  return responses.includes(f.type) ? { ok: true, frame: f as RunnerResponse } : null;
}

/** A Runner linked to another instance, as the shared rows show it. */
export interface RemoteRunnerView {
  runnerId: string;
  holderInstanceId: string;
  /** The lease row's holder: `<instance id>/<link number>`. */
  holderLease: string;
  holderUrl: string;
  agentInstanceId: string;
  storeId: string;
  providers: ProviderAdvert[];
  projects: ProjectAdvert[];
  maxConcurrentRuns: number;
  connectedAt: string;
  agentsShareRunnerUser: boolean | null;
}

interface ViewRow {
  online: number;
  since: string;
  seen_ms: number;
  agent_instance_id: string | null;
  store_id: string | null;
  provider_adverts: string;
  projects: string;
  max_concurrent_runs: number | null;
  agents_share_runner_user: number | null;
  holder: string;
  expires_ms: number;
  /** The holder's directory row (null: it has none). */
  peer_url: string | null;
  peer_heartbeat_at: number | null;
}

/** This instance's directory row, and the reads of the other instances' rows. */
export class ClusterDirectory {
  #timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly db: StateEngine,
    readonly instanceId: string,
    readonly url: string,
    private readonly log: Logger,
  ) {}

  /** Write this instance's row now (throws when the database cannot take it) and then every heartbeat. */
  async start(): Promise<void> {
    // A row at this instance's own URL under another id is an earlier process at this address (this one
    // holds the port now): it is dead, however fresh its last heartbeat.
    await this.db.run("DELETE FROM server_instances WHERE url = ? AND instance_id <> ?", [this.url, this.instanceId]);
    await this.#beat();
    this.#timer = setInterval(() => {
      this.#beat().catch((err: unknown) =>
        this.log.error({ err: (err as Error).message }, "cluster directory row not refreshed (state DB)"),
      );
    }, CLUSTER_HEARTBEAT_MS);
    this.#timer.unref();
  }

  async #beat(): Promise<void> {
    await this.db.run(
      `INSERT INTO server_instances (instance_id, url, heartbeat_at) VALUES (?, ?, ?)
       ON CONFLICT (instance_id) DO UPDATE SET url = excluded.url, heartbeat_at = excluded.heartbeat_at`,
      [this.instanceId, this.url, Date.now()],
    );
  }

  /** Stop the heartbeat and remove this instance's row (a clean stop; a killed one's row goes stale). */
  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    await this.db.run("DELETE FROM server_instances WHERE instance_id = ?", [this.instanceId]).catch(() => undefined);
  }

  /**
   * The Runner `runnerId` as linked to ANOTHER live instance, or undefined: its presence row says online and
   * fresh, its lease is unexpired and held by an instance other than this one, and that instance's
   * directory row is fresh and not at this instance's own URL.
   */
  async remoteRunner(runnerId: string, nowMs = Date.now()): Promise<RemoteRunnerView | undefined> {
    // One read: the holder's directory row joins on the lease's holder (`<instance id>/<connection>`).
    const row = await this.db.get<ViewRow>(
      `SELECT p.online, p.since, p.seen_ms, p.agent_instance_id, p.store_id, p.provider_adverts, p.projects,
              p.max_concurrent_runs, p.agents_share_runner_user, l.holder, l.expires_ms,
              i.url AS peer_url, i.heartbeat_at AS peer_heartbeat_at
         FROM runner_presence p JOIN runner_link_leases l ON l.runner_id = p.runner_id
         LEFT JOIN server_instances i ON substr(l.holder, 1, length(i.instance_id) + 1) = i.instance_id || '/'
        WHERE p.runner_id = ?`,
      [runnerId],
    );
    if (row?.online !== 1 || nowMs - Number(row.seen_ms) >= PRESENCE_STALE_MS) return undefined;
    if (Number(row.expires_ms) <= nowMs || row.agent_instance_id === null || row.store_id === null) return undefined;
    const holderInstanceId = row.holder.split("/")[0] ?? "";
    if (holderInstanceId === "" || holderInstanceId === this.instanceId) return undefined;
    // A holder at this instance's own URL is an earlier process at this address (killed, then this one
    // started): its link died with it, however fresh its rows.
    if (
      row.peer_url === null ||
      row.peer_url === this.url ||
      nowMs - Number(row.peer_heartbeat_at) >= CLUSTER_INSTANCE_STALE_MS
    ) {
      return undefined;
    }
    const peer = { url: row.peer_url };
    let providers: ProviderAdvert[];
    let projects: ProjectAdvert[];
    try {
      providers = JSON.parse(row.provider_adverts) as ProviderAdvert[];
      projects = JSON.parse(row.projects) as ProjectAdvert[];
    } catch {
      return undefined;
    }
    return {
      runnerId,
      holderInstanceId,
      holderLease: row.holder,
      holderUrl: peer.url,
      agentInstanceId: row.agent_instance_id,
      storeId: row.store_id,
      providers,
      projects,
      maxConcurrentRuns: row.max_concurrent_runs ?? 1,
      connectedAt: row.since,
      agentsShareRunnerUser: row.agents_share_runner_user === null ? null : row.agents_share_runner_user === 1,
    };
  }
}

/** What the holder does with a verified link request: send it over its local link only. */
export type ExecuteLinkRequest = (
  runnerId: string,
  frame: RunnerRequest,
  timeoutMs: number,
  /** A run.sync sent from a view of this agent instance: answered only by a link of that instance. */
  agentInstanceId?: string,
  /** A catch-up's run.sync: the instance asking follows the run from now on (link/run-push.ts). */
  follower?: PeerInstance,
  /**
   * The lease holder (`<instance id>/<link number>`) the caller read from the shared rows: executed only by
   * the link holding exactly that lease (link/holder-proof.ts).
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
 * The holder's answer to a verified link request body (a POST's or a channel's, link/peer-ws.ts): 400 one that
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
    return "frame must be a run.start, run.sync, run.cancel or run.changes frame";
  }
  const type = (v.frame as { type?: unknown }).type;
  if (type !== "run.start" && type !== "run.sync" && type !== "run.cancel" && type !== "run.changes") {
    return "frame.type must be run.start, run.sync or run.cancel, or run.changes";
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
