/**
 * How an observer on another instance is woken by a change of a run applied here (design §14, "Wake-ups between
 * instances") — the one place that decides it, for both sides:
 *
 * - The holder (this instance holds the Runner's link): every update the run core applied (runs/updated.ts) is
 *   numbered, pushed to the instances following the run (cluster/run-push.ts: a catch-up's forwarded run.sync
 *   named them, cluster/forwarded.ts), and told on RUN_CHANGES_CHANNEL (cluster/change-notices.ts) — the push is a
 *   shortcut, the notice the safety net. Every change of a record's state is told too, with its commit
 *   (PostgreSQL's pg_notify inside that transaction).
 * - The follower: a push that continues its mirror exactly wakes the observers with no request; a notice of an
 *   update a push already brought is skipped; anything else makes the mirror catch up through the holder (a pulled
 *   run.sync) when someone waits on it (cluster/following.ts).
 */
import type { RunCore } from "../runs/runs.js";
import type { RunUpdated } from "../runs/updated.js";
import type { StateEngine } from "../state/engine.js";
import { ChangeNotices } from "./change-notices.js";
import { RunFollowing } from "./following.js";
import type { PeerInstance } from "./link-request.js";
import type { Post } from "./peer-http.js";
import type { PeerChannels } from "./peer-ws.js";
import { type RunPush, RunPushes } from "./run-push.js";

/**
 * The notification channel of run changes between instances (state/engine.ts `listen`/`notify`): the
 * instance holding a Runner's link notifies `<run_id> <runner_id> <holder instance id> <update number>`
 * after it applied a `run.update`, and every instance `<run_id> <runner_id>` with the commit of any change
 * of a record's state; an instance following that run (observers, a task's listen) syncs its mirror through
 * the holder and wakes them — unless a push (cluster/run-push.ts) already brought it that update.
 */
export const RUN_CHANGES_CHANNEL = "webcodex_run_changes";

/** This instance among its peers, for pushes: its id and the link-request key (cluster/peer-auth.ts clusterKey). */
export interface WakeUpSelf {
  instanceId: string;
  key: Buffer;
  /** Pushes go over these standing channels (cluster/peer-ws.ts), which the caller closes. */
  channels?: PeerChannels;
  /** How pushes reach followers (default: over `channels`, else POSTs). */
  post?: Post;
}

export class WakeUps {
  /** Numbers the `run.update`s applied here, over all runs (a push and its notice name the same number). */
  #updateSeq = 0;
  #notices: ChangeNotices | null = null;
  #unlisten: (() => void) | null = null;
  #unsubscribe: (() => void) | null = null;

  private constructor(
    /** This instance's id among its peers (null: it pushes nothing and takes no push). */
    private readonly self: string | null,
    /** The pushes of this instance's Runners' updates to their followers (null without `self`). */
    private readonly pushes: RunPushes | null,
    private readonly following: RunFollowing,
  ) {}

  /**
   * Several instances on one PostgreSQL state: tell the others of every run change applied here, and follow
   * theirs (RUN_CHANGES_CHANNEL); with `self`, push this instance's Runners' updates to the instances following
   * them and take theirs. Throws when the database cannot be reached.
   */
  static async join(core: RunCore, engine: StateEngine, self?: WakeUpSelf): Promise<WakeUps> {
    const channels = self?.channels;
    const pushes =
      self === undefined
        ? null
        : new RunPushes(self.key, self.instanceId, core.ctx.log, self.post ?? channels?.post, (url) =>
            channels?.prepare(url),
          );
    const following = new RunFollowing(core.ctx, core.observation, self?.instanceId ?? null);
    const wakeUps = new WakeUps(self?.instanceId ?? null, pushes, following);
    wakeUps.#unsubscribe = core.updated.subscribe((u) => wakeUps.#updated(u));
    wakeUps.#unlisten = await engine.listen(RUN_CHANGES_CHANNEL, (payload) => following.onRunChanged(payload));
    wakeUps.#notices = new ChangeNotices(
      (payloads) => engine.notifyAll(RUN_CHANGES_CHANNEL, payloads),
      (runIds, err) =>
        core.ctx.log.warn(
          { run_ids: runIds.slice(0, 8), runs: runIds.length, err: (err as Error).message },
          "run changes not notified to other instances",
        ),
    );
    if (engine.dialect !== "postgres") return wakeUps;
    // A change of a record's state on any instance (a reconciliation's close, a tombstone, a rejection)
    // is told too, delivered when its transaction commits: PostgreSQL's pg_notify inside that transaction.
    core.ctx.store.onStateChange(async (rec, _previous, tx) => {
      await tx.get("SELECT pg_notify(?, ?) AS notified", [RUN_CHANGES_CHANNEL, `${rec.run_id} ${rec.runner_id}`]);
    });
    return wakeUps;
  }

  /** The holder applied an update: push it to the run's followers, and tell every instance. */
  #updated(u: RunUpdated): void {
    const update = ++this.#updateSeq;
    this.pushes?.updated({ ...u, update });
    this.#notices?.tell(u.runId, `${u.runId} ${u.runnerId} ${this.self ?? "-"} ${update}`);
  }

  /** `peer` follows `runId` from now on (its catch-up's run.sync named it, cluster/forwarded.ts). */
  follow(runId: string, peer: PeerInstance): void {
    this.pushes?.follow(runId, peer);
  }

  /** An update of a run linked to another instance, pushed by its holder: whether this instance still follows it. */
  applyPushed(push: RunPush): boolean {
    return this.following.applyPushed(push);
  }

  /** What the wake-up paths did here, for tests (`/__test/cluster-stats`). */
  get counts(): Record<string, number> {
    return { ...this.following.counts, ...this.pushes?.counts };
  }

  /** Stop following and telling (the instance stops). */
  close(): void {
    this.#unsubscribe?.();
    this.#unsubscribe = null;
    this.#unlisten?.();
    this.#unlisten = null;
    this.#notices?.close();
  }
}
