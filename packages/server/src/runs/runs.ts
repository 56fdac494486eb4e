/**
 * The Server's run core, wired together: `Runs` implements the RunsApi by
 * delegating to admission (`runs/admission.ts`), observation (`runs/observe.ts`) and
 * cancellation (`runs/cancel.ts`), which share one `RunContext`; it lists the
 * caller's projects, and it listens to the Runner hub (hello → registry +
 * reconciliation + re-forwarded cancels, run.update → records + mirrors,
 * disconnect → registry).
 */
import {
  type ChangesToolInput,
  eventBatches,
  type HelloFrame,
  isTerminalState,
  type RecoveryKind,
  type RunChanges,
  type RunSyncResultFrame,
  type RunUpdateFrame,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import type { PeerInstance } from "../link/cluster.js";
import type { HubListener, RequestOutcome, RunnerConnection, RunnerRequest } from "../link/hub.js";
import type { PeerAuthCounts } from "../link/peer-auth.js";
import type { Post } from "../link/peer-http.js";
import type { PeerChannelCounts, PeerChannels } from "../link/peer-ws.js";
import type { LiveRunner, Registry } from "../link/registry.js";
import { type RunPush, RunPushes } from "../link/run-push.js";
import type { Principal } from "../principals/principal.js";
import { StateBusyError, type StateEngine, StateUnavailableError } from "../state/engine.js";
import type { StateStore } from "../state/store.js";
import { Admission } from "./admission.js";
import type {
  AdmissionHooks,
  AdmissionRequest,
  ApiResult,
  CancelOutput,
  ObserveInput,
  ObserveOutput,
  ProjectView,
  RunAdmission,
  RunsApi,
  StartInput,
  StartOutput,
} from "./api.js";
import { Cancellation } from "./cancel.js";
import { ChangeNotices } from "./change-notices.js";
import { ChangesReader } from "./changes.js";
import { fail, RunContext } from "./context.js";
import { RunFollowing } from "./following.js";
import type { MirrorSet, ToolStep } from "./mirror.js";
import { Observation, withTimeout } from "./observe.js";
import type { ObservationTokens } from "./observe-token.js";
import { type ReconcileDeps, reconcileRecord, reconcileRunner } from "./reconcile.js";

/**
 * `run.update` frames of one Runner waiting for the state database. Frames of a Runner are applied in
 * the order they arrived, one at a time; beyond this many waiting, its link is closed (1013): the Runner
 * reconnects, and its hello's reconciliation and the observers' catch-ups take up what was dropped.
 */
export const MAX_PENDING_RUNNER_FRAMES = 1_000;

/**
 * The notification channel of run changes between instances (state/engine.ts `listen`/`notify`): the
 * instance holding a Runner's link notifies `<run_id> <runner_id> <holder instance id> <update number>`
 * after it applied a `run.update`, and every instance `<run_id> <runner_id>` with the commit of any change
 * of a record's state; an instance following that run (observers, a task's listen) syncs its mirror through
 * the holder and wakes them — unless a push (link/run-push.ts) already brought it that update.
 */
export const RUN_CHANGES_CHANNEL = "webcodex_run_changes";
/** The request_id of a run.sync result a holder answers from its mirror (the forwarding side does not read it). */
const HELD_SYNC_REQUEST_ID = "held_sync";

/**
 * A call the state database refused (state/engine.ts): answered with its code, never as `internal`.
 * A transaction cut off keeps nothing, except that a COMMIT lost in flight may have kept its write — a
 * same-key retry of a start then meets that record (absence is never proof, design §6.1). The engine's
 * own message is not passed on: it may name the database.
 */
function stateRefusal<T>(err: unknown, recovery: RecoveryKind): ApiResult<T> {
  if (err instanceof StateBusyError) {
    return fail("state_busy", "The Server's state database is busy; nothing was changed. Retry shortly.", recovery);
  }
  if (err instanceof StateUnavailableError) {
    const written = err.commitOutcomeUnknown
      ? "the last write may or may not have been kept (a retry of the same call finds out)"
      : "nothing was changed";
    return fail(
      "state_unavailable",
      `The Server's state database cannot be reached right now; ${written}. Retry the same call shortly.`,
      recovery,
    );
  }
  throw err;
}

export interface RunsOptions {
  store: StateStore;
  registry: Registry;
  logger: Logger;
  /** Test-only: pause between resolve and run.start (WEBCODEX_TEST_HOOK_DELAY_AFTER_RESOLVE_MS). */
  testDelayAfterResolveMs?: number;
  startTimeoutMs?: number;
}

export class Runs implements RunsApi, RunAdmission, HubListener {
  readonly #ctx: RunContext;
  readonly #admission: Admission;
  readonly #observation: Observation;
  readonly #cancellation: Cancellation;
  readonly #changes: ChangesReader;
  /** Per runner id: the last queued frame's work and how many wait (see MAX_PENDING_RUNNER_FRAMES). */
  readonly #frames = new Map<string, { tail: Promise<void>; pending: number }>();
  #unlisten: (() => void) | null = null;
  /** Notices of runs changed here to the other instances (null until `joinCluster`). */
  #notices: ChangeNotices | null = null;
  /** Runs whose pushed update is being applied here: its record written, its mirror not yet (see #heldSync). */
  readonly #applying = new Map<string, number>();
  /** This instance's id among its peers, and the pushes of its Runners' updates to them (null until `joinCluster`). */
  #self: string | null = null;
  #pushes: RunPushes | null = null;
  /** What went over the instance's channels and as POSTs (link/peer-ws.ts), for `clusterCounts`. */
  #channelCounts: PeerChannelCounts | null = null;
  #authCounts: PeerAuthCounts | null = null;
  /** Numbers the `run.update`s applied here, over all runs (a push and its notice name the same number). */
  #updateSeq = 0;
  /** Forwarded run.syncs answered here, for tests (`/__test/cluster-stats`). */
  #forwardedSyncs = 0;
  /** This instance's side as a follower of runs linked elsewhere (null until `joinCluster`). */
  #following: RunFollowing | null = null;

  constructor(opts: RunsOptions) {
    this.#ctx = new RunContext(opts.store, opts.registry, opts.logger);
    this.#observation = new Observation(this.#ctx);
    this.#cancellation = new Cancellation(this.#ctx);
    this.#changes = new ChangesReader(this.#ctx);
    this.#admission = new Admission(this.#ctx, this.#observation, {
      settle: (runId) => void this.#reconcileOne(runId),
      ...(opts.testDelayAfterResolveMs !== undefined ? { testDelayAfterResolveMs: opts.testDelayAfterResolveMs } : {}),
      ...(opts.startTimeoutMs !== undefined ? { startTimeoutMs: opts.startTimeoutMs } : {}),
    });
  }

  get tokens(): ObservationTokens {
    return this.#ctx.tokens;
  }

  get mirrors(): MirrorSet {
    return this.#ctx.mirrors;
  }

  close(): void {
    this.#unlisten?.();
    this.#unlisten = null;
    this.#notices?.close();
    this.#ctx.close();
  }

  /**
   * Bring this instance's mirror of `runId` up to its Runner's ring, wherever the Runner is linked (through
   * the instance holding its link on a PostgreSQL state), waiting at most `timeoutMs`: the operator
   * console's event view reads the mirror, so it shows a run's events on any instance.
   */
  async followEvents(runId: string, timeoutMs: number): Promise<void> {
    const rec = await this.#ctx.store.get(runId);
    if (!rec || (rec.admission !== "admitted" && rec.admission !== "sent")) return;
    const runner = await this.#ctx.registry.lookup(rec.runner_id);
    if (!runner) return;
    const mirror = this.#ctx.mirrors.getOrCreate(runId);
    if (mirror.instance !== runner.agentInstanceId) mirror.reset(runner.agentInstanceId);
    await withTimeout(this.#observation.catchUp(mirror, runner), timeoutMs);
  }

  /** What the cluster paths did on this instance: forwarded syncs answered, pushes sent and taken, notices skipped. */
  clusterCounts(): Record<string, number> {
    return {
      forwarded_syncs: this.#forwardedSyncs,
      ...this.#following?.counts,
      ...this.#pushes?.counts,
      ...this.#channelCounts,
      ...this.#authCounts,
    };
  }

  /**
   * Several instances on one PostgreSQL state: tell the others of every run change applied here, and
   * follow theirs (RUN_CHANGES_CHANNEL); with `self` (this instance's id and the link-request key), push
   * this instance's Runners' updates to the instances following them (link/run-push.ts; over `channels`,
   * link/peer-ws.ts, when given, which the caller closes) and take theirs.
   * Throws when the database cannot be reached.
   */
  async joinCluster(
    engine: StateEngine,
    self?: {
      instanceId: string;
      key: Buffer;
      channels?: PeerChannels;
      /** How pushes reach followers (default: over `channels`, else POSTs). */
      post?: Post;
      /** The checks of the peers' requests here (link/peer-auth.ts), for `clusterCounts`. */
      authCounts?: PeerAuthCounts;
    },
  ): Promise<void> {
    if (self !== undefined) {
      this.#self = self.instanceId;
      const channels = self.channels;
      this.#channelCounts = channels?.counts ?? null;
      this.#authCounts = self.authCounts ?? null;
      this.#pushes = new RunPushes(self.key, self.instanceId, this.#ctx.log, self.post ?? channels?.post, (url) =>
        channels?.prepare(url),
      );
    }
    const following = new RunFollowing(this.#ctx, this.#observation, this.#self);
    this.#following = following;
    this.#unlisten = await engine.listen(RUN_CHANGES_CHANNEL, (payload) => following.onRunChanged(payload));
    this.#notices = new ChangeNotices(
      (payloads) => engine.notifyAll(RUN_CHANGES_CHANNEL, payloads),
      (runIds, err) =>
        this.#ctx.log.warn(
          { run_ids: runIds.slice(0, 8), runs: runIds.length, err: (err as Error).message },
          "run changes not notified to other instances",
        ),
    );
    if (engine.dialect !== "postgres") return;
    // A change of a record's state on any instance (a reconciliation's close, a tombstone, a rejection)
    // is told too, delivered when its transaction commits: PostgreSQL's pg_notify inside that transaction.
    this.#ctx.store.onStateChange(async (rec, _previous, tx) => {
      await tx.get("SELECT pg_notify(?, ?) AS notified", [RUN_CHANGES_CHANNEL, `${rec.run_id} ${rec.runner_id}`]);
    });
  }

  /** An update of a run linked to another instance, pushed by its holder (runs/following.ts). */
  applyPushed(push: RunPush): boolean {
    return this.#following?.applyPushed(push) ?? false;
  }

  /**
   * A link request another instance forwarded here (link/cluster.ts): sent over this instance's OWN link
   * only, never forwarded again; `not_sent` when this instance does not hold the Runner's link (any more).
   * A run.sync or run.cancel answered not_found closes a settled `sent` record as never admitted here (the
   * caller cannot: it does not see the starts in flight on this link). A forwarded run.start counts as a
   * start in flight here while it is out (a run.sync answered not_found
   * meanwhile does not close its record as never admitted), and is sent only while its record is still
   * `sent`: a record settled meanwhile (another instance's re-send was admitted, or it was closed) is
   * answered `closed` — outcome unknown to the caller, which then answers from the record as it is.
   */
  /** Whether this instance's live link of `runnerId` holds the lease `holder` (link/holder-proof.ts). */
  holdsLease(runnerId: string, holder: string): boolean {
    const runner = this.#ctx.registry.live(runnerId);
    return runner !== undefined && !this.#ctx.closed && runner.conn.leaseHolderId === holder;
  }

  async executeForwarded(
    runnerId: string,
    frame: RunnerRequest,
    timeoutMs: number,
    agentInstanceId?: string,
    follower?: PeerInstance,
    holder?: string,
  ): Promise<RequestOutcome> {
    const runner = this.#ctx.registry.live(runnerId);
    if (!runner || this.#ctx.closed) return { ok: false, reason: "not_sent" };
    // Sent from a view of another lease (link/holder-proof.ts): this link is not the one the caller meant.
    if (holder !== undefined && runner.conn.leaseHolderId !== holder) return { ok: false, reason: "not_sent" };
    // A sync asked from a view of another agent instance: its seqs would be read against the wrong ones.
    if (agentInstanceId !== undefined && agentInstanceId !== runner.agentInstanceId) {
      return { ok: false, reason: "not_sent" };
    }
    if (frame.type === "run.sync") {
      this.#forwardedSyncs += 1;
      // Followed from now on: every update applied after this answer is made is pushed to it.
      if (follower !== undefined && frame.max_events > 0) this.#pushes?.follow(frame.run_id, follower);
      const held = this.#heldSync(runner, frame);
      if (held !== null) return { ok: true, frame: held };
    }
    if (frame.type !== "run.start") {
      const mark = this.#ctx.startMark();
      const outcome = await runner.conn.request(frame, timeoutMs);
      // not_found over the current link is judged here, where starts in flight to this link are known
      // (RunContext.closeIfNeverAdmitted); the caller never closes a record on a forwarded answer.
      if (outcome.ok && outcome.frame.type === "error" && outcome.frame.code === "not_found") {
        await this.#ctx.closeIfNeverAdmitted(frame.run_id, runner, mark);
      }
      return outcome;
    }
    const runId = frame.run_id;
    let release: () => void = () => undefined;
    if (!this.#ctx.starting.has(runId)) {
      let done: () => void = () => undefined;
      const inFlight = new Promise<void>((resolve) => {
        done = resolve;
      });
      this.#ctx.starting.set(runId, inFlight);
      release = () => {
        if (this.#ctx.starting.get(runId) === inFlight) this.#ctx.starting.delete(runId);
        done();
      };
    }
    try {
      const store = this.#ctx.store;
      // Read FOR UPDATE: a close of this record as never admitted either committed before (seen here) or
      // runs after, and then sees the start in flight.
      const stillSent = await store.transaction(async (tx) => {
        const rec = await store.lock(tx, runId);
        return rec?.admission === "sent" && rec.runner_id === runnerId && !isTerminalState(rec.state);
      });
      if (!stillSent) return { ok: false, reason: "closed" };
      this.#ctx.noteStartSent(runId);
      return await runner.conn.request(frame, timeoutMs);
    } finally {
      release();
    }
  }

  start(principal: Principal, input: StartInput, hooks?: AdmissionHooks): Promise<ApiResult<StartOutput>> {
    return this.#admission.start(principal, input, hooks).catch((err: unknown) => stateRefusal(err, "retry_same"));
  }

  admit(principal: Principal, request: AdmissionRequest): Promise<ApiResult<StartOutput>> {
    return this.#admission.admit(principal, request).catch((err: unknown) => stateRefusal(err, "retry_same"));
  }

  observe(principal: Principal, input: ObserveInput, signal?: AbortSignal): Promise<ApiResult<ObserveOutput>> {
    return this.#observation.observe(principal, input, signal).catch((err: unknown) => stateRefusal(err, "reobserve"));
  }

  cancel(principal: Principal, input: { run_id: string }): Promise<ApiResult<CancelOutput>> {
    return this.#cancellation.cancel(principal, input).catch((err: unknown) => stateRefusal(err, "retry_same"));
  }

  changes(principal: Principal, input: ChangesToolInput): Promise<ApiResult<RunChanges>> {
    return this.#changes.changes(principal, input).catch((err: unknown) => stateRefusal(err, "retry_same"));
  }

  lastToolStep(runId: string): ToolStep | null {
    return this.#ctx.mirrors.get(runId)?.lastToolStep ?? null;
  }

  /**
   * Single-record reconciliation over the runner's current connection (run.sync decides). With the link on
   * another instance, a forwarded run.sync: its answer is taken into the record here, and a not_found is
   * judged by the holder (`executeForwarded`).
   */
  async #reconcileOne(runId: string): Promise<void> {
    try {
      const rec = await this.#ctx.store.get(runId);
      if (!rec || this.#ctx.closed) return;
      const runner = this.#ctx.registry.live(rec.runner_id);
      if (!runner) {
        await this.#reconcileRemote(runId, rec.runner_id);
        return;
      }
      const hello = runner.conn.hello;
      if (!hello) return; // offline: the next hello reconciles it
      // An empty inventory forces a fresh run.sync query instead of trusting the hello's snapshot.
      await reconcileRecord(rec, { ...hello, inventory: [] }, this.#reconcileDeps(runner.conn, runner));
    } catch (err) {
      this.#ctx.log.error({ run_id: runId, err: (err as Error).message }, "single-run reconciliation failed");
    }
  }

  async #reconcileRemote(runId: string, runnerId: string): Promise<void> {
    const runner = await this.#ctx.registry.lookup(runnerId);
    if (!runner || this.#ctx.closed) return; // offline everywhere: its next hello reconciles it
    const res = await runner.conn.request({ type: "run.sync", run_id: runId, after_seq: 0, max_events: 0 });
    if (!res.ok) return;
    if (res.frame.type === "run.sync.result") await this.#ctx.persist(runId, res.frame.run);
    else if (res.frame.type === "error" && res.frame.tombstone)
      await this.#ctx.applyTombstone(runId, res.frame.tombstone);
    this.#ctx.mirrors.get(runId)?.touch();
  }

  /** The caller's projects, with their Runners wherever they are linked (`registry.lookup`, once per Runner). */
  async listProjects(principal: Principal): Promise<ProjectView[]> {
    if (!principal.scopes.has("project:read") && !principal.scopes.has("coding_agent:run")) return [];
    const out: ProjectView[] = [];
    const runners = new Map<string, LiveRunner | undefined>();
    for (const projectId of [...principal.projects].sort()) {
      const runnerId = this.#ctx.registry.runnerForProject(projectId);
      if (runnerId === undefined) continue;
      if (!runners.has(runnerId)) runners.set(runnerId, await this.#ctx.registry.lookup(runnerId));
      const runner = runners.get(runnerId);
      const advert = runner?.projects.find((p) => p.project_id === projectId);
      out.push({
        project_id: projectId,
        runner_online: runner !== undefined && advert !== undefined,
        allow_patch: advert?.allow_patch ?? false,
        agents_share_runner_user: runner && advert ? runner.agentsShareRunnerUser : null,
        providers:
          runner && advert
            ? runner.providers.map((p) => ({
                provider_id: p.provider_id,
                name: p.name,
                allowed_config_options: [...p.allowed_config_options],
              }))
            : [],
      });
    }
    return out;
  }

  // ---- hub listener -----------------------------------------------------------
  // The hub calls these synchronously; the registry changes at once, and what reads or writes the
  // state database runs in arrival order per runner (`#inOrder`).

  /** Queue `work` behind this runner's earlier frames; false (nothing queued) beyond the bound. */
  #inOrder(runnerId: string, what: string, work: () => Promise<void>, bounded = false): boolean {
    let queue = this.#frames.get(runnerId);
    if (queue === undefined) {
      queue = { tail: Promise.resolve(), pending: 0 };
      this.#frames.set(runnerId, queue);
    }
    if (bounded && queue.pending >= MAX_PENDING_RUNNER_FRAMES) return false;
    const q = queue;
    q.pending += 1;
    q.tail = q.tail
      .then(work)
      .catch((err: unknown) =>
        this.#ctx.log.error({ runner_id: runnerId, err: (err as Error).message }, `${what} not applied`),
      )
      .finally(() => {
        q.pending -= 1;
        if (q.pending === 0 && this.#frames.get(runnerId) === q) this.#frames.delete(runnerId);
      });
    return true;
  }

  onHello(conn: RunnerConnection, hello: HelloFrame): void {
    if (this.#ctx.closed) return;
    const runner = this.#ctx.registry.connected(conn, hello);
    this.#inOrder(conn.runnerId, "hello", async () => {
      for (const m of [...this.#ctx.mirrors.values()]) {
        // Whose run it is never changes: a copy tells (StateStore.peek), not a read per mirror and hello.
        if (m.instance !== null && (await this.#ctx.store.peek(m.runId))?.runner_id === conn.runnerId) {
          if (m.instance !== hello.agent_instance_id) m.reset(hello.agent_instance_id);
          else m.unsync(); // updates may have been missed while disconnected
          m.touch();
        }
      }
      void reconcileRunner(conn.runnerId, hello, this.#reconcileDeps(conn, runner))
        .catch((err: unknown) => this.#ctx.log.error({ err: (err as Error).message }, "reconciliation failed"))
        .then(async () => {
          if (!this.#ctx.closed) await this.#cancellation.reforward(conn);
        })
        .catch((err: unknown) => this.#ctx.log.error({ err: (err as Error).message }, "re-forwarding cancels failed"));
    });
  }

  #reconcileDeps(conn: RunnerConnection, runner: LiveRunner): ReconcileDeps {
    return {
      store: this.#ctx.store,
      logger: this.#ctx.log,
      isBusy: (runId) => this.#ctx.starting.has(runId),
      startMark: () => this.#ctx.startMark(),
      startSentSince: (runId, mark) => this.#ctx.startSentSince(runId, mark),
      query: async (runId) => {
        const res = await conn.request({ type: "run.sync", run_id: runId, after_seq: 0, max_events: 0 });
        if (!res.ok) return "unavailable";
        if (res.frame.type === "run.sync.result") return { kind: "run", summary: res.frame.run };
        if (res.frame.type === "error" && res.frame.code === "not_found") return null;
        if (res.frame.type === "error" && res.frame.tombstone)
          return { kind: "pruned", tombstone: res.frame.tombstone };
        return "unavailable";
      },
      apply: async (record, summary) => {
        await this.#ctx.persist(record.run_id, summary);
        const m = this.#ctx.mirrors.get(record.run_id);
        if (m) {
          if (m.instance !== runner.agentInstanceId) m.reset(runner.agentInstanceId);
          if (m.applyUpdate(summary, [])) void this.#observation.catchUp(m, runner);
        }
      },
      closed: (record) => this.#ctx.mirrors.get(record.run_id)?.touch(),
    };
  }

  onUpdate(conn: RunnerConnection, frame: RunUpdateFrame): void {
    if (this.#ctx.closed) return;
    if (!this.#inOrder(conn.runnerId, "run.update", () => this.#applyUpdate(conn, frame), true)) {
      this.#ctx.log.warn(
        { runner_id: conn.runnerId, pending: MAX_PENDING_RUNNER_FRAMES },
        "too many run.update frames wait for the state database; closing the link (the Runner reconnects)",
      );
      conn.close(1013, "server state busy");
    }
  }

  async #applyUpdate(conn: RunnerConnection, frame: RunUpdateFrame): Promise<void> {
    if (this.#ctx.closed) return;
    const runId = frame.run.run_id;
    // A copy is enough to tell whose run it is (runner_id never changes, a refusal is final); persist
    // checks a terminal summary against the database itself.
    const rec = await this.#ctx.store.peek(runId);
    const runner = this.#ctx.registry.live(conn.runnerId);
    if (!rec || rec.runner_id !== conn.runnerId || !runner || runner.conn !== conn) {
      this.#ctx.log.debug(
        { run_id: runId, runner_id: conn.runnerId },
        "run.update for a run this runner does not hold; ignored",
      );
      return;
    }
    if (rec.admission === "rejected_pre_admission") return;
    // Between the record's write and the mirror's, the record is ahead: no run.sync answered from the mirror.
    this.#applying.set(runId, (this.#applying.get(runId) ?? 0) + 1);
    try {
      await this.#ctx.persist(runId, frame.run, rec);
    } finally {
      const left = (this.#applying.get(runId) ?? 1) - 1;
      if (left > 0) this.#applying.set(runId, left);
      else this.#applying.delete(runId);
    }
    const mirror = this.#ctx.mirrors.getOrCreate(runId);
    if (mirror.instance !== runner.agentInstanceId) mirror.reset(runner.agentInstanceId);
    if (mirror.applyUpdate(frame.run, frame.events)) void this.#observation.catchUp(mirror, runner);
    const update = ++this.#updateSeq;
    this.#pushes?.updated({
      runId,
      runnerId: conn.runnerId,
      update,
      agentInstanceId: runner.agentInstanceId,
      run: frame.run,
      events: frame.events,
    });
    this.#notices?.tell(runId, `${runId} ${conn.runnerId} ${this.#self ?? "-"} ${update}`);
  }

  /**
   * A forwarded run.sync answered from this instance's mirror of the run, when the mirror holds exactly what
   * the Runner would send: it is fed by this link's own frames (the same agent instance, synced, not
   * pruned, no catch-up in flight, no pushed update between its record write and the mirror), it has every
   * event up to the last seq the Runner pushed, and it still holds every event after `after_seq`. Then the other instance's wake-up costs no Runner round trip
   * (design §14); otherwise, null, and the request goes to the Runner. Packed by the Runner's own rule
   * (eventBatches), so the answer fits a frame as the Runner's would.
   */
  #heldSync(runner: LiveRunner, frame: Extract<RunnerRequest, { type: "run.sync" }>): RunSyncResultFrame | null {
    if (this.#applying.has(frame.run_id)) return null;
    const mirror = this.#ctx.mirrors.get(frame.run_id);
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

  onDisconnect(conn: RunnerConnection): void {
    if (this.#ctx.closed) return;
    this.#ctx.registry.disconnected(conn);
    this.#inOrder(conn.runnerId, "disconnect", async () => {
      for (const m of [...this.#ctx.mirrors.values()]) {
        if ((await this.#ctx.store.peek(m.runId))?.runner_id === conn.runnerId) m.touch();
      }
    });
  }
}
