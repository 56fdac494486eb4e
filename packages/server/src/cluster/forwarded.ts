/**
 * The holder's side of a link request (cluster/link-request.ts): a request another instance forwarded here is
 * sent over this instance's OWN link only, never forwarded again; `not_sent` when this instance does not hold
 * the Runner's link (any more), or not the lease the caller read (cluster/holder-proof.ts).
 *
 * - A run.sync or run.cancel answered not_found closes a settled `sent` record as never admitted here (the caller
 *   cannot: it does not see the starts in flight on this link).
 * - A forwarded run.start counts as a start in flight here while it is out (a run.sync answered not_found
 *   meanwhile does not close its record as never admitted), and is sent only while its record is still `sent`: a
 *   record settled meanwhile (another instance's re-send was admitted, or it was closed) is answered `closed` —
 *   outcome unknown to the caller, which then answers from the record as it is.
 * - A catch-up's run.sync names its instance a follower of the run (cluster/wake-ups.ts pushes it the run's next
 *   updates), and is answered from this instance's mirror when that holds exactly what the Runner would send.
 */
import { eventBatches, isTerminalState, type RunSyncResultFrame } from "@webcodex/protocol";
import type { RequestOutcome, RunnerRequest } from "../link/hub.js";
import type { LiveRunner } from "../link/registry.js";
import type { RunCore } from "../runs/runs.js";
import type { PeerInstance } from "./link-request.js";

/** The request_id of a run.sync result a holder answers from its mirror (the forwarding side does not read it). */
const HELD_SYNC_REQUEST_ID = "held_sync";

export class ForwardedRequests {
  /** Forwarded run.syncs answered here, for tests (`/__test/cluster-stats`). */
  #forwardedSyncs = 0;

  constructor(
    private readonly core: RunCore,
    /** Names `follower` a follower of `runId` (cluster/wake-ups.ts); null: no pushes from this instance. */
    private readonly follow: ((runId: string, follower: PeerInstance) => void) | null,
  ) {}

  get counts(): { forwarded_syncs: number } {
    return { forwarded_syncs: this.#forwardedSyncs };
  }

  /** Whether this instance's live link of `runnerId` holds the lease `holder` (cluster/holder-proof.ts). */
  holdsLease(runnerId: string, holder: string): boolean {
    const ctx = this.core.ctx;
    const runner = ctx.registry.live(runnerId);
    return runner !== undefined && !ctx.closed && runner.conn.leaseHolderId === holder;
  }

  async execute(
    runnerId: string,
    frame: RunnerRequest,
    timeoutMs: number,
    agentInstanceId?: string,
    follower?: PeerInstance,
    holder?: string,
  ): Promise<RequestOutcome> {
    const ctx = this.core.ctx;
    const runner = ctx.registry.live(runnerId);
    if (!runner || ctx.closed) return { ok: false, reason: "not_sent" };
    // Sent from a view of another lease (cluster/holder-proof.ts): this link is not the one the caller meant.
    if (holder !== undefined && runner.conn.leaseHolderId !== holder) return { ok: false, reason: "not_sent" };
    // A sync asked from a view of another agent instance: its seqs would be read against the wrong ones.
    if (agentInstanceId !== undefined && agentInstanceId !== runner.agentInstanceId) {
      return { ok: false, reason: "not_sent" };
    }
    if (frame.type === "run.sync") {
      this.#forwardedSyncs += 1;
      // Followed from now on: every update applied after this answer is made is pushed to it.
      if (follower !== undefined && frame.max_events > 0) this.follow?.(frame.run_id, follower);
      const held = this.#heldSync(runner, frame);
      if (held !== null) return { ok: true, frame: held };
    }
    if (frame.type !== "run.start") {
      const mark = ctx.startMark();
      const outcome = await runner.conn.request(frame, timeoutMs);
      // not_found over the current link is judged here, where starts in flight to this link are known
      // (RunContext.closeIfNeverAdmitted); the caller never closes a record on a forwarded answer.
      if (outcome.ok && outcome.frame.type === "error" && outcome.frame.code === "not_found") {
        await ctx.closeIfNeverAdmitted(frame.run_id, runner, mark);
      }
      return outcome;
    }
    const runId = frame.run_id;
    let release: () => void = () => undefined;
    if (!ctx.starting.has(runId)) {
      let done: () => void = () => undefined;
      const inFlight = new Promise<void>((resolve) => {
        done = resolve;
      });
      ctx.starting.set(runId, inFlight);
      release = () => {
        if (ctx.starting.get(runId) === inFlight) ctx.starting.delete(runId);
        done();
      };
    }
    try {
      const store = ctx.store;
      // Read FOR UPDATE: a close of this record as never admitted either committed before (seen here) or
      // runs after, and then sees the start in flight.
      const stillSent = await store.transaction(async (tx) => {
        const rec = await store.lock(tx, runId);
        return rec?.admission === "sent" && rec.runner_id === runnerId && !isTerminalState(rec.state);
      });
      if (!stillSent) return { ok: false, reason: "closed" };
      ctx.noteStartSent(runId);
      return await runner.conn.request(frame, timeoutMs);
    } finally {
      release();
    }
  }

  /**
   * A forwarded run.sync answered from this instance's mirror of the run, when the mirror holds exactly what
   * the Runner would send: it is fed by this link's own frames (the same agent instance, synced, not
   * pruned, no catch-up in flight, no update between its record write and the mirror's), it has every
   * event up to the last seq the Runner pushed, and it still holds every event after `after_seq`. Then the other
   * instance's wake-up costs no Runner round trip (design §14); otherwise, null, and the request goes to the
   * Runner. Packed by the Runner's own rule (eventBatches), so the answer fits a frame as the Runner's would.
   */
  #heldSync(runner: LiveRunner, frame: Extract<RunnerRequest, { type: "run.sync" }>): RunSyncResultFrame | null {
    if (this.core.applying(frame.run_id)) return null;
    const mirror = this.core.ctx.mirrors.get(frame.run_id);
    if (!mirror || mirror.instance !== runner.agentInstanceId || !mirror.synced || mirror.pruned) return null;
    const summary = mirror.summary;
    if (mirror.syncing !== null || summary === null || summary.last_seq !== mirror.lastSeq) return null;
    if (frame.after_seq > mirror.lastSeq || frame.after_seq + 1 < mirror.firstSeq) return null;
    const events = mirror.eventsAfter(frame.after_seq);
    const [first = []] = eventBatches(events, {
      maxEvents: Math.max(1, frame.max_events),
      sizeOf: (e) => mirror.sizeOf(e) + 1,
    });
    const sent = frame.max_events === 0 ? [] : first;
    return {
      type: "run.sync.result",
      request_id: HELD_SYNC_REQUEST_ID,
      run: summary,
      events: sent,
      has_more: sent.length < events.length,
    };
  }
}
