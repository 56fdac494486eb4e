/**
 * This instance as a follower of runs whose Runner another instance holds (design §14, "Wake-ups between
 * instances"): the holder's pushes of each update (cluster/run-push.ts), taken when they continue a mirror
 * exactly, and the notices of RUN_CHANGES_CHANNEL, the safety net — a notice of an update a push already
 * brought is skipped, one ahead of its push waits NOTICE_PUSH_GRACE_MS for it, and anything else makes the
 * mirror catch up through the holder when someone waits on it.
 */
import { isTerminalState } from "@webcodex/protocol";
import type { LiveRunner } from "../link/registry.js";
import type { RunContext } from "../runs/context.js";
import type { RunMirror } from "../runs/mirror.js";
import type { Observation } from "../runs/observe.js";
import { FOLLOW_IDLE_MS, MAX_PENDING_PUSH_EVENTS, type RunPush } from "./run-push.js";

/**
 * How long a notice of an update waits for that update's push when its mirror follows the holder's pushes
 * (a notice through the database can overtake the push); past it, the mirror catches up through the holder.
 */
export const NOTICE_PUSH_GRACE_MS = 100;

export class RunFollowing {
  /** What this side did, for tests (`/__test/cluster-stats`). */
  readonly counts = {
    pushes_applied: 0,
    pushes_deferred: 0,
    pushes_stale: 0,
    pushes_caught_up: 0,
    pushes_refused: 0,
    notices_skipped: 0,
  };
  /** Mirrors notified while their catch-up was in flight: synced once more when it ends. */
  readonly #resyncAfter = new Set<string>();
  /** Per run, a push held until its mirror's catch-up in flight ends (`#deferPush`). */
  readonly #deferred = new Map<string, RunPush>();
  /** Per run, the newest update told by a notice ahead of its push (`#awaitPush`). */
  readonly #awaitingPush = new Map<string, { update: number }>();

  constructor(
    private readonly ctx: RunContext,
    private readonly observation: Observation,
    /** This instance's id among its peers: a push meant for another is never taken (null: none is). */
    private readonly self: string | null,
  ) {}

  /** Another instance applied a change of a run (null: notifications may have been lost; resync all). */
  onRunChanged(payload: string | null): void {
    if (this.ctx.closed) return;
    if (payload === null) {
      for (const m of [...this.ctx.mirrors.values()]) {
        m.unsync();
        if (!m.idle) m.touch();
      }
      return;
    }
    const [runId, runnerId, holder, update] = payload.split(" ");
    if (runId === undefined || runnerId === undefined) return;
    // This instance holds the link: its mirrors are fed by the Runner's own frames.
    if (this.ctx.registry.live(runnerId)) return;
    const mirror = this.ctx.mirrors.get(runId);
    if (!mirror) return;
    const pushed = mirror.pushed;
    if (mirror.synced && pushed !== null && pushed.holder === holder && holder !== undefined) {
      // This mirror follows that holder's pushes: that update was taken whole already, or its push is
      // likely still on its way.
      if (pushed.update >= Number(update)) this.counts.notices_skipped += 1;
      else this.#awaitPush(mirror, runnerId, holder, Number(update));
      return;
    }
    this.#followElsewhere(mirror, runnerId);
  }

  /**
   * A notice of update `update` of a run whose mirror follows `holder`'s pushes, ahead of its push: give the
   * push NOTICE_PUSH_GRACE_MS to come (one wait per mirror, for the newest update told), then catch up if it
   * has not — a push that failed is never waited for longer than that.
   */
  #awaitPush(mirror: RunMirror, runnerId: string, holder: string, update: number): void {
    const waiting = this.#awaitingPush.get(mirror.runId);
    if (waiting !== undefined) {
      waiting.update = Math.max(waiting.update, update);
      return;
    }
    const wait = { update };
    this.#awaitingPush.set(mirror.runId, wait);
    setTimeout(() => {
      this.#awaitingPush.delete(mirror.runId);
      if (this.ctx.closed || this.ctx.mirrors.get(mirror.runId) !== mirror) return;
      const pushed = mirror.pushed;
      if (mirror.synced && pushed?.holder === holder && pushed.update >= wait.update) {
        this.counts.notices_skipped += 1;
        return;
      }
      this.#followElsewhere(mirror, runnerId);
    }, NOTICE_PUSH_GRACE_MS).unref();
  }

  /**
   * A mirror of a run linked elsewhere may be behind: unsynced, and caught up now if anybody waits on it
   * (`watched`: waited on before a change that woke its waiters).
   */
  #followElsewhere(mirror: RunMirror, runnerId: string, watched = !mirror.idle): void {
    // Nobody waits: the next observe catches up first.
    mirror.unsync();
    if (!watched) return;
    void this.ctx.registry
      .lookupRecent(runnerId, mirror.instance)
      .then((runner) => {
        if (!runner) {
          mirror.touch(); // its Runner went offline: observers say so
          return;
        }
        if (mirror.instance !== runner.agentInstanceId) mirror.reset(runner.agentInstanceId);
        this.#resync(mirror, runner);
      })
      .catch((err: unknown) =>
        this.ctx.log.warn(
          { run_id: mirror.runId, err: (err as Error).message },
          "following a run changed elsewhere failed",
        ),
      );
  }

  /**
   * An update of a run linked to another instance, pushed by that instance (cluster/run-push.ts): taken into the
   * mirror when it continues it exactly (the same agent instance, synced, no gap); held until the catch-up in
   * flight ends (a push must not overtake it: that catch-up may bring an older summary); ignored when the
   * mirror already holds a newer summary; otherwise the mirror catches up through the holder. Answers whether
   * this instance still follows the run: it has a mirror of it that an observer waits on or waited on within
   * FOLLOW_IDLE_MS, and it has not ended.
   */
  applyPushed(push: RunPush): boolean {
    if (this.ctx.closed || push.to !== this.self || this.ctx.registry.live(push.runnerId)) {
      this.counts.pushes_refused += 1;
      return false;
    }
    const mirror = this.ctx.mirrors.get(push.runId);
    if (!mirror) {
      this.counts.pushes_refused += 1;
      return false;
    }
    const following =
      (!mirror.idle || Date.now() - mirror.lastWaitAt < FOLLOW_IDLE_MS) && !isTerminalState(push.run.state);
    if (mirror.instance === push.agentInstanceId && mirror.syncing !== null) {
      this.#deferPush(mirror, mirror.syncing, push);
      return following;
    }
    if (mirror.instance !== push.agentInstanceId || !mirror.synced) {
      // Another Runner process, or a mirror that may be behind already: catch up (again).
      this.counts.pushes_caught_up += 1;
      this.#followElsewhere(mirror, push.runnerId);
      return following;
    }
    const held = mirror.summary;
    if (
      held !== null &&
      (push.run.last_seq < held.last_seq || (isTerminalState(held.state) && !isTerminalState(push.run.state)))
    ) {
      // Overtaken by a catch-up that answered after this update: it holds all of it.
      this.counts.pushes_stale += 1;
      return following;
    }
    this.counts.pushes_applied += 1;
    const watched = !mirror.idle;
    if (mirror.applyUpdate(push.run, push.events)) this.#followElsewhere(mirror, push.runnerId, watched);
    else mirror.pushed = { holder: push.holder, update: push.update };
    return following;
  }

  /**
   * Hold a push until the mirror's catch-up in flight ends, then take it (`applyPushed`). One held push per
   * mirror: a later one is folded into it (its summary and number, the events appended up to
   * MAX_PENDING_PUSH_EVENTS; beyond, none — the mirror then sees it is behind and catches up).
   */
  #deferPush(mirror: RunMirror, syncing: Promise<void>, push: RunPush): void {
    this.counts.pushes_deferred += 1;
    const held = this.#deferred.get(mirror.runId);
    if (held !== undefined) {
      const fits = held.events.length + push.events.length <= MAX_PENDING_PUSH_EVENTS;
      this.#deferred.set(mirror.runId, { ...push, events: fits ? [...held.events, ...push.events] : [] });
      return;
    }
    this.#deferred.set(mirror.runId, push);
    const release = () => {
      const p = this.#deferred.get(mirror.runId);
      this.#deferred.delete(mirror.runId);
      if (p !== undefined && !this.ctx.closed && this.ctx.mirrors.get(mirror.runId) === mirror) this.applyPushed(p);
    };
    void syncing.then(release, release);
  }

  /** Catch a mirror up now, or right after the catch-up in flight (which may have left before the change). */
  #resync(mirror: RunMirror, runner: LiveRunner): void {
    if (mirror.syncing) {
      this.#resyncAfter.add(mirror.runId);
      return;
    }
    // A catch-up that fails (the state database busy or away) is logged: the mirror keeps what it got, and the
    // next notification or observe catches it up again. Unhandled, the rejection would end the process.
    void this.observation
      .catchUp(mirror, runner)
      .finally(() => {
        if (this.#resyncAfter.delete(mirror.runId) && !this.ctx.closed) this.#resync(mirror, runner);
      })
      .catch((err: unknown) =>
        this.ctx.log.warn(
          { run_id: mirror.runId, err: (err as Error).message },
          "catching up a run changed elsewhere failed",
        ),
      );
  }
}
