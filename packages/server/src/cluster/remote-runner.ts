/**
 * A Runner whose one live link another instance holds (design §14), reached through that instance's link-request
 * endpoint (cluster/link-request.ts).
 *
 * - `remoteRunners` is what `Registry.lookup` asks when the Runner is not linked here: the view the shared rows
 *   give (cluster/directory.ts), with a `RemoteRunnerConnection` that forwards requests to the holder.
 * - A request names the lease the caller read (`holder`), and is executed only over a link holding exactly that
 *   lease; a run.start leaves only after the holder proved it holds it (cluster/holder-proof.ts).
 * - The caller takes only an answer the holder signed for this request (cluster/peer-auth.ts `verifyAnswer`).
 *   A failure before the request could have left (the peer refused the connection, the holder gave no proof
 *   for a start, or it answered a signed refusal before executing anything) is `not_sent`; any failure after it
 *   may have left, and any answer it did not sign, is `timeout` — unknown, exactly like a run.start whose answer
 *   never came (design §6.1: the record stays `sent` and reconciliation or a same-key retry settles it).
 */
import { RunnerFrame, type RunnerResponse } from "@webcodex/protocol";
import type { Logger } from "pino";
import type { RequestOutcome, RunnerRequest } from "../link/hub.js";
import type { RemoteLink, RemoteLookup, RemoteRunner } from "../link/registry.js";
import type { ClusterDirectory } from "./directory.js";
import { proveHolder } from "./holder-proof.js";
import {
  CLUSTER_FORWARD_SLACK_MS,
  CLUSTER_LINK_REQUEST_PATH,
  CLUSTER_MAX_REQUEST_TIMEOUT_MS,
  type PeerInstance,
} from "./link-request.js";
import { CLUSTER_MAX_BODY_BYTES, CLUSTER_SIGNATURE_HEADER, signedHeaders, verifyAnswer } from "./peer-auth.js";
import { type Post, postToPeer } from "./peer-http.js";

/** How a RemoteRunnerConnection reaches and names things (all optional: tests leave most out). */
export interface RemoteRunnerOptions {
  /** The agent instance this view names: a forwarded run.sync is answered only by that instance's link. */
  agentInstanceId?: string;
  /** This instance as its peers reach it: named in a catch-up's run.sync, so the holder pushes the run's updates. */
  self?: PeerInstance;
  /**
   * The lease holder the shared rows name (`<instance id>/<link number>`): named in every request, which the
   * holder executes only while its link holds exactly that lease; a run.start leaves only after the instance
   * at `holderUrl` proved it holds it (cluster/holder-proof.ts). Without it no run.start is sent.
   */
  holderLease?: string;
  /**
   * How a run.sync reaches the holder (over a standing channel, cluster/peer-ws.ts); starts and cancels are
   * always POSTs (`post`), whose "not sent" (the connection was never made) is what a start's outcome rests on.
   */
  syncPost?: Post;
  post?: Post;
}

/** A Runner's link held by another instance, reached through that instance's link-request endpoint. */
export class RemoteRunnerConnection implements RemoteLink {
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

/** How this instance reaches Runners linked to other instances (PostgreSQL state only). */
export interface RemoteRunnersOptions {
  directory: ClusterDirectory;
  /** The link-request key (cluster/peer-auth.ts clusterKey). */
  key: Buffer;
  /** How long a forwarded request waits for the Runner by default (the hub's request timeout). */
  requestTimeoutMs: number;
  log: Logger;
  /** How a forwarded run.sync reaches the holder (cluster/peer-ws.ts `PeerChannels.post`); default `post`. */
  syncPost?: Post;
  /** How starts, cancels and holder proofs reach the holder; default cluster/peer-http.ts `postToPeer`. */
  post?: Post;
}

/** `Registry.lookup`'s way to a Runner linked elsewhere: its view in the shared rows, requests forwarded to the holder. */
export function remoteRunners(cluster: RemoteRunnersOptions): RemoteLookup {
  return async (runnerId: string): Promise<RemoteRunner | undefined> => {
    const view = await cluster.directory.remoteRunner(runnerId);
    if (!view) return undefined;
    return {
      runnerId,
      conn: new RemoteRunnerConnection(
        runnerId,
        view.holderInstanceId,
        view.holderUrl,
        cluster.key,
        cluster.requestTimeoutMs,
        cluster.log,
        {
          agentInstanceId: view.agentInstanceId,
          self: { instanceId: cluster.directory.instanceId, url: cluster.directory.url },
          holderLease: view.holderLease,
          ...(cluster.syncPost ? { syncPost: cluster.syncPost } : {}),
          ...(cluster.post ? { post: cluster.post } : {}),
        },
      ),
      agentInstanceId: view.agentInstanceId,
      storeId: view.storeId,
      providers: view.providers,
      projects: view.projects,
      maxConcurrentRuns: view.maxConcurrentRuns,
      connectedAt: view.connectedAt,
      agentsShareRunnerUser: view.agentsShareRunnerUser,
    };
  };
}
