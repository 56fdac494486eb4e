/**
 * The Server's run core, wired together: `Runs` implements the RunsApi by
 * delegating to admission (`runs/admission.ts`), observation (`runs/observe.ts`) and
 * cancellation (`runs/cancel.ts`), which share one `RunContext`; it lists the
 * caller's projects, and it listens to the Runner hub (hello → registry +
 * reconciliation + re-forwarded cancels, run.update → records + mirrors,
 * disconnect → registry).
 */
import type {
  ApplyToolInput,
  ChangesToolInput,
  HelloFrame,
  RecoveryKind,
  RunApply,
  RunChanges,
  RunUpdateFrame,
} from "@webcodex/protocol";
import type { Logger } from "pino";
import type { HubListener, RunnerConnection } from "../link/hub.js";
import type { LiveRunner, Registry } from "../link/registry.js";
import type { Principal } from "../principals/principal.js";
import { StateBusyError, StateUnavailableError } from "../state/engine.js";
import type { StateStore } from "../state/store.js";
import { Admission } from "./admission.js";
import type {
  AdmissionRequest,
  ApiResult,
  CancelOutput,
  ObserveInput,
  ObserveOutput,
  ProjectView,
  RunAdmission,
  RunsApi,
  StartCallHooks,
  StartInput,
  StartOutput,
} from "./api.js";
import { ChangeApplier } from "./apply.js";
import { Cancellation } from "./cancel.js";
import { ChangesReader } from "./changes.js";
import { fail, RunContext } from "./context.js";
import type { MirrorSet, ToolStep } from "./mirror.js";
import { Observation, withTimeout } from "./observe.js";
import type { ObservationTokens } from "./observe-token.js";
import { type ReconcileDeps, reconcileRecord, reconcileRunner } from "./reconcile.js";
import { RunUpdates } from "./updated.js";

/**
 * `run.update` frames of one Runner waiting for the state database. Frames of a Runner are applied in
 * the order they arrived, one at a time; beyond this many waiting, its link is closed (1013): the Runner
 * reconnects, and its hello's reconciliation and the observers' catch-ups take up what was dropped.
 */
export const MAX_PENDING_RUNNER_FRAMES = 1_000;

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

/**
 * What the cluster (cluster/) reaches of the run core: it follows runs linked elsewhere, answers the link
 * requests of other instances and wakes their observers. The run core never imports cluster/.
 */
export interface RunCore {
  readonly ctx: RunContext;
  readonly observation: Observation;
  /** Every run.update applied here, once its record and mirror took it. */
  readonly updated: RunUpdates;
  /** Whether a run.update of `runId` is being applied here: its record written, its mirror not yet. */
  applying(runId: string): boolean;
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
  readonly #applier: ChangeApplier;
  /** Per runner id: the last queued frame's work and how many wait (see MAX_PENDING_RUNNER_FRAMES). */
  readonly #frames = new Map<string, { tail: Promise<void>; pending: number }>();
  /** Runs whose update is being applied here: its record written, its mirror not yet (cluster/forwarded.ts). */
  readonly #applying = new Map<string, number>();
  readonly #updated = new RunUpdates();

  constructor(opts: RunsOptions) {
    this.#ctx = new RunContext(opts.store, opts.registry, opts.logger);
    this.#observation = new Observation(this.#ctx);
    this.#cancellation = new Cancellation(this.#ctx);
    this.#changes = new ChangesReader(this.#ctx);
    this.#applier = new ChangeApplier(this.#ctx);
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

  /** The run core as cluster/ reaches it. */
  get core(): RunCore {
    return {
      ctx: this.#ctx,
      observation: this.#observation,
      updated: this.#updated,
      applying: (runId) => this.#applying.has(runId),
    };
  }

  close(): void {
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

  start(principal: Principal, input: StartInput, hooks?: StartCallHooks): Promise<ApiResult<StartOutput>> {
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

  /** The operator console's read of a run's changed files, without the diff (ChangesReader.filesForOperator). */
  changedFilesForOperator(runId: string, timeoutMs: number): Promise<ApiResult<Omit<RunChanges, "diff">>> {
    return this.#changes.filesForOperator(runId, timeoutMs).catch((err: unknown) => stateRefusal(err, "retry_same"));
  }

  apply(principal: Principal, input: ApplyToolInput): Promise<ApiResult<RunApply>> {
    return this.#applier.apply(principal, input).catch((err: unknown) => stateRefusal(err, "retry_same"));
  }

  lastToolStep(runId: string): ToolStep | null {
    return this.#ctx.mirrors.get(runId)?.lastToolStep ?? null;
  }

  /**
   * Single-record reconciliation over the runner's current connection (run.sync decides). With the link on
   * another instance, a forwarded run.sync: its answer is taken into the record here, and a not_found is
   * judged by the holder (cluster/forwarded.ts).
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
      linkHeld: (tx) => this.#ctx.linkHeld(tx, conn),
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
    this.#updated.emit({
      runId,
      runnerId: conn.runnerId,
      agentInstanceId: runner.agentInstanceId,
      run: frame.run,
      events: frame.events,
    });
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
