/**
 * The holder pushes a run's updates to the instances that follow it (design §14), so that an observer
 * waiting on another instance wakes one HTTP hop after the Runner's `run.update` arrived, instead of after
 * a notification through the database and a forwarded `run.sync` back to the holder.
 *
 * - Following: an instance catching a mirror up names itself in its forwarded `run.sync`
 *   (`follower`, cluster/link-request.ts); the holder takes it as a follower of that run before it answers, so every
 *   update applied after the answer was made is pushed.
 * - A push (`POST CLUSTER_RUN_PUSH_PATH`, signed like a link request): the run's summary and the events of
 *   the update, with the holder's instance id and its number of the update (`update`, increasing over all
 *   runs of that holder process). The follower takes it only when it continues its mirror exactly
 *   (cluster/following.ts `applyPushed`); anything else makes it catch up through the holder, as a notification does.
 * - The notification of every update is still sent: a push is only ever a shortcut. The follower skips a
 *   notification of an update it already took whole (same holder, same or later number).
 * - At most one push per follower and run is in flight; updates meanwhile are folded into the next push (the
 *   newest summary and update number, the events appended, at most MAX_PENDING_PUSH_EVENTS of them — beyond,
 *   the events are left out and the follower, seeing it is behind, catches up itself).
 * - A follower is dropped when a push fails or it answers `following: false` (nobody waits there any more, or
 *   it is another process now), when its run ends, and least recently updated first beyond MAX_FOLLOWED_RUNS.
 *   A dropped follower that still has observers catches up on the next notification and names itself again.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import {
  InstanceId,
  isTerminalState,
  MAX_EVENTS_PER_UPDATE,
  RunEvent,
  RunId,
  RunnerId,
  RunSummary,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import { z } from "zod";
import type { PeerInstance } from "./link-request.js";
import {
  CLUSTER_MAX_BODY_BYTES,
  CLUSTER_SIGNATURE_HEADER,
  type PeerAuth,
  readSignedRequest,
  signedHeaders,
  verifyAnswer,
} from "./peer-auth.js";
import { type Post, postToPeer } from "./peer-http.js";

/** The follower's endpoint for pushed updates (on the Server's own listener). */
export const CLUSTER_RUN_PUSH_PATH = "/_wc/cluster/run-push";
/** How long the holder waits for a follower's answer to one push; without one, the follower is dropped. */
export const RUN_PUSH_TIMEOUT_MS = 2_000;
/** A follower's answer (`{"following":true}`) is read up to this many bytes. */
export const RUN_PUSH_ANSWER_MAX_BYTES = 1_024;
/** Runs the holder pushes to followers of at once; beyond, the least recently updated is dropped. */
export const MAX_FOLLOWED_RUNS = 10_000;
/** Instances following one run at most; another one beyond follows by notifications only. */
export const MAX_FOLLOWERS_PER_RUN = 16;
/** Events waiting for one follower while its push is in flight; beyond, they are left out (it catches up). */
export const MAX_PENDING_PUSH_EVENTS = MAX_EVENTS_PER_UPDATE;
/** A follower stays one while an observer waited on its mirror within this long (or one waits now). */
export const FOLLOW_IDLE_MS = 10_000;

/** One pushed update, as the follower gets it. */
export interface RunPush {
  runId: string;
  runnerId: string;
  /** The pushing (holder) instance, and its number of this update. */
  holder: string;
  update: number;
  /** The instance the push is meant for: another process at its URL answers `following: false`. */
  to: string;
  /** The agent instance whose seqs the events carry (the Runner process the holder's link is to). */
  agentInstanceId: string;
  run: RunSummary;
  events: RunEvent[];
}

/** What the holder knows of one update when it pushes it. */
export type RunUpdateForPush = Omit<RunPush, "holder" | "to">;

/** The follower's side: take a push; answers whether it still follows the run. */
export type ApplyRunPush = (push: RunPush) => boolean;

interface Follower {
  url: string;
  inFlight: boolean;
  /** Folded updates waiting for the push in flight. */
  pending: RunUpdateForPush | null;
  /** Events were left out of `pending` (past MAX_PENDING_PUSH_EVENTS): it carries none until it is sent. */
  overrun: boolean;
}

/** Counts for tests and the operator (`/__test/cluster-stats`). */
export interface RunPushCounts {
  pushes_sent: number;
  pushes_failed: number;
}

/** The holder's side: who follows which run, and the pushes to them. */
export class RunPushes {
  /** Per run, its followers by instance id; least recently updated run first. */
  readonly #runs = new Map<string, Map<string, Follower>>();
  readonly counts: RunPushCounts = { pushes_sent: 0, pushes_failed: 0 };

  constructor(
    private readonly key: Buffer,
    /** This (holder) instance's id. */
    private readonly holder: string,
    private readonly log: Logger,
    private readonly post: Post = postToPeer,
    /** Called with a follower's URL when it is named one: a transport may connect ahead of its first push. */
    private readonly prepare: (url: string) => void = () => undefined,
  ) {}

  /** Runs with followers (bounded by MAX_FOLLOWED_RUNS). */
  get followedRuns(): number {
    return this.#runs.size;
  }

  /** `peer` follows `runId` from now on (its catch-up's run.sync named it). */
  follow(runId: string, peer: PeerInstance): void {
    if (peer.instanceId === this.holder) return;
    let followers = this.#runs.get(runId);
    if (followers === undefined) {
      followers = new Map();
      this.#runs.set(runId, followers);
      if (this.#runs.size > MAX_FOLLOWED_RUNS) {
        const oldest = this.#runs.keys().next().value;
        if (oldest !== undefined) this.#runs.delete(oldest);
      }
    }
    const known = followers.get(peer.instanceId);
    if (known !== undefined) {
      known.url = peer.url;
      return;
    }
    if (followers.size >= MAX_FOLLOWERS_PER_RUN) return;
    followers.set(peer.instanceId, { url: peer.url, inFlight: false, pending: null, overrun: false });
    this.prepare(peer.url);
  }

  /** The holder applied an update of `u.runId`: push it to the run's followers. A run that ended has none after. */
  updated(u: RunUpdateForPush): void {
    const followers = this.#runs.get(u.runId);
    if (followers === undefined) return;
    this.#runs.delete(u.runId);
    if (!isTerminalState(u.run.state)) this.#runs.set(u.runId, followers);
    for (const [instanceId, f] of followers) {
      if (!f.inFlight) {
        f.inFlight = true;
        void this.#push(u.runId, instanceId, f, u);
        continue;
      }
      const held = f.pending?.events ?? [];
      const fits = !f.overrun && held.length + u.events.length <= MAX_PENDING_PUSH_EVENTS;
      if (!fits) f.overrun = true;
      f.pending = { ...u, events: fits ? [...held, ...u.events] : [] };
    }
  }

  async #push(runId: string, instanceId: string, f: Follower, first: RunUpdateForPush): Promise<void> {
    let u: RunUpdateForPush | null = first;
    try {
      while (u !== null) {
        const following = await this.#send(instanceId, f.url, u);
        if (!following) {
          const followers = this.#runs.get(runId);
          if (followers?.get(instanceId) === f) followers.delete(instanceId);
          if (followers?.size === 0) this.#runs.delete(runId);
          return;
        }
        u = f.pending;
        f.pending = null;
        f.overrun = false;
      }
    } finally {
      f.inFlight = false;
      f.pending = null;
      f.overrun = false;
    }
  }

  /** One push; whether the follower still follows (false also when it could not be reached). */
  async #send(to: string, url: string, u: RunUpdateForPush): Promise<boolean> {
    const wire = (events: RunEvent[]) =>
      Buffer.from(
        JSON.stringify({
          run_id: u.runId,
          runner_id: u.runnerId,
          holder: this.holder,
          update: u.update,
          to,
          agent_instance_id: u.agentInstanceId,
          run: u.run,
          events,
        }),
        "utf8",
      );
    let body = wire(u.events);
    // Too large for one request: the summary alone, and the follower, seeing it is behind, catches up.
    if (body.length > CLUSTER_MAX_BODY_BYTES) body = wire([]);
    this.counts.pushes_sent += 1;
    const headers = signedHeaders(this.key, body);
    const raw = await this.post(
      `${url}${CLUSTER_RUN_PUSH_PATH}`,
      headers,
      body,
      RUN_PUSH_TIMEOUT_MS,
      RUN_PUSH_ANSWER_MAX_BYTES,
    );
    // Only the follower's own answer to this push counts (cluster/peer-auth.ts).
    const answer = verifyAnswer(this.key, headers[CLUSTER_SIGNATURE_HEADER] ?? "", to, raw);
    if (answer.kind === "answered" && answer.status === 200) {
      try {
        return (JSON.parse(answer.text) as { following?: unknown }).following === true;
      } catch {
        // not an answer of ours: dropped below
      }
    }
    this.counts.pushes_failed += 1;
    this.log.debug(
      { run_id: u.runId, to, status: answer.kind === "answered" ? answer.status : answer.code },
      "run update not pushed to a following instance; it follows by notifications",
    );
    return false;
  }
}

const PushBody = z
  .object({
    run_id: RunId,
    runner_id: RunnerId,
    holder: InstanceId,
    update: z.number().int().positive().max(Number.MAX_SAFE_INTEGER),
    to: InstanceId,
    agent_instance_id: InstanceId,
    run: RunSummary,
    events: z.array(RunEvent).max(MAX_PENDING_PUSH_EVENTS),
  })
  .strict();

/** The pushed body, checked field by field; a string says what is wrong. */
export function parseRunPush(body: Buffer): RunPush | string {
  let value: unknown;
  try {
    value = JSON.parse(body.toString("utf8"));
  } catch {
    return "the body is not JSON";
  }
  const parsed = PushBody.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    return `${issue?.path.join(".") || "body"}: ${issue?.message ?? "invalid"}`;
  }
  const v = parsed.data;
  if (v.run.run_id !== v.run_id) return "run.run_id must be run_id";
  return {
    runId: v.run_id,
    runnerId: v.runner_id,
    holder: v.holder,
    update: v.update,
    to: v.to,
    agentInstanceId: v.agent_instance_id,
    run: v.run,
    events: v.events,
  };
}

/** The follower's answer to a verified push body: 400 one that is not a push (which field, why), else `{following}`. */
export function takeRunPush(body: Buffer, apply: ApplyRunPush): { status: 200 | 400; answer: object } {
  const push = parseRunPush(body);
  if (typeof push === "string") return { status: 400, answer: { error: "invalid_request", message: push } };
  return { status: 200, answer: { following: apply(push) } };
}

/**
 * The follower's `POST CLUSTER_RUN_PUSH_PATH`: refusals as for a link request (cluster/peer-auth.ts
 * `readSignedRequest`), then `takeRunPush`. (Over a standing WebSocket instead: cluster/peer-ws.ts.)
 */
export async function handleRunPush(
  req: IncomingMessage,
  res: ServerResponse,
  auth: PeerAuth,
  apply: ApplyRunPush,
): Promise<void> {
  const body = await readSignedRequest(req, res, auth);
  if (body === null) return;
  const { status, answer } = takeRunPush(body, apply);
  auth.answer(req, res, status, answer);
}
