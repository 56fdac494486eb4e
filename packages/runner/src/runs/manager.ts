/**
 * The run lifecycle (design §4.2–4.5) behind the RunService seam: admission
 * (fences, capacity — never a queue), then per run:
 *
 *   admit (checks: runs/admission.ts; + a run_as pool user, process/user-pool.ts)
 *         ─▶ its worktree (runs/workspace.ts) ─▶ the ACP turn (acp/turn.ts) ─▶ its change recorded
 *         ─▶ markTerminal ─▶ projection ─▶ tree cleanup ─▶ clearChild
 *         ─▶ sweep of the pool user ─▶ retention (the run's end: runs/settle.ts)
 *
 * With `[acp] keep_agent_alive_secs` a run that completed keeps its agent instead (tree, connection, pool user)
 * for a follow-up of it, which adopts it (runs/kept-agents.ts); the tree cleanup and sweep come when it is stopped.
 *
 * From admission on a run is driven by runs/drive.ts: its worktree, its turn (an async generator of what the run
 * records, acp/turn.ts `TurnEvent`, consumed into the record, the timings and the terminal state), its end.
 * Pushes to the link go through runs/updates.ts (the one batching rule, @webcodex/protocol batches.ts).
 *
 * Failpoints (test-only SIGKILL, see failpoints.ts) here: after_admission (runs/settle.ts has
 * after_terminal_before_projection, the turn the others).
 */
import { randomBytes } from "node:crypto";
import type { RunSummary, RunTombstone } from "@webcodex/protocol";
import type { AgentConfig, ProjectConfig, RunnerConfig } from "../config/config.js";
import { sameUserAgents } from "../config/exposure.js";
import type { EventRing, RingLimits } from "../events/ring.js";
import { failpoint as defaultFailpoint, type FailpointName } from "../failpoints.js";
import { type Logger, silentLogger } from "../logger.js";
import { homeGuard, recycleHome } from "../process/pool-homes.js";
import type { PoolBindings } from "../process/user-bindings.js";
import { type Lease, UserPool } from "../process/user-pool.js";
import type { DispatchStore } from "../store/types.js";
import type { ApplyOutcome } from "../workspace/applies.js";
import type { ChangesOutcome } from "../workspace/changes.js";
import { worktreesDir } from "../workspace/worktree.js";
import {
  capacityRefusal,
  readyInTime,
  recycledInTime,
  SETTLE_WAIT_MS,
  StartChecks,
  UNRECORDED_REFUSAL,
} from "./admission.js";
import { RunDriver, requestCancel } from "./drive.js";
import { KeptAgents } from "./kept-agents.js";
import { MemoryProjectCallers, type ProjectCallers } from "./project-callers.js";
import { Run } from "./record.js";
import { RunRetention } from "./retention.js";
import type {
  HelloBody,
  RunCancelResult,
  RunService,
  RunStartOutcome,
  RunStartRequest,
  RunSyncResult,
  RunUpdateListener,
} from "./service.js";
import { RunSettler, saveTerminal } from "./settle.js";
import { RunUpdates } from "./updates.js";
import { RunViews } from "./views.js";
import { RunWorkspaces } from "./workspace.js";

export interface RunManagerOptions {
  config: RunnerConfig;
  store: DispatchStore;
  logger?: Logger;
  /** Source of env_from_env values (default: process.env). Read at each spawn. */
  sourceEnv?: NodeJS.ProcessEnv;
  /** Grace of each cleanup step: stdin EOF → SIGTERM → SIGKILL (default 2000 ms). */
  cleanupGraceMs?: number;
  /** Largest line accepted from an agent's stdout (default 8 MiB). */
  maxMessageBytes?: number;
  ringLimits?: Partial<RingLimits>;
  /** Terminal runs kept in memory with their event rings (default 64). */
  maxRetainedRuns?: number;
  /** Byte budget of the event rings of all retained terminal runs (default RETAINED_RINGS_MAX_BYTES). */
  retainedRingsMaxBytes?: number;
  /** Where each run's diagnostics file goes (runs/diagnostics.ts); none written when unset (exec, tests). */
  diagnosticsDir?: string;
  /** Longest a run_as pool user's sweep may take before the user is quarantined (default SWEEP_TIMEOUT_MS). */
  sweepTimeoutMs?: number;
  /** Which caller each run_as pool user serves (process/user-bindings.ts); null or absent: users serve any caller. */
  poolBindings?: PoolBindings | null;
  /** Which caller each shared project serves under run_as (runs/project-callers.ts); default: in memory. */
  projectCallers?: ProjectCallers;
  /** Where worktree runs get their worktrees (default: `<state_dir>/workspaces`; workspace/). */
  workspacesDir?: string;
  /** Crash injection (default: failpoints.ts, armed only by WEBCODEX_FAILPOINT). */
  failpoint?: (name: FailpointName) => void;
  now?: () => Date;
}

/** What a start has waited for so far (RunManager.#start), each wait bounded. */
interface StartWaits {
  /** It waited for a pool user recycled for its caller (once: RECYCLE_WAIT_MS). */
  recycled: boolean;
  /** When its waits for runs that have ended to settle give up (SETTLE_WAIT_MS after the first); null: none yet. */
  settleBy: number | null;
}
const NO_WAITS: StartWaits = { recycled: false, settleBy: null };

function newInstanceId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString("base64url")}`;
}

export class RunManager implements RunService {
  readonly agentInstanceId: string;
  readonly #config: RunnerConfig;
  readonly #store: DispatchStore;
  readonly #log: Logger;
  readonly #graceMs: number;
  readonly #ringLimits: Partial<RingLimits> | undefined;
  readonly #failpoint: (name: FailpointName) => void;
  readonly #now: () => Date;
  readonly #providerInstanceIds = new Map<string, string>();
  readonly #agents = new Map<string, AgentConfig>();
  readonly #projects = new Map<string, ProjectConfig>();
  readonly #runs = new Map<string, Run>();
  /** Runs holding a capacity slot: from admission until their process tree is gone. */
  readonly #active = new Set<Run>();
  readonly #retention: RunRetention;
  /** The run_as users: one per live run, swept before reuse. Sweeps every pool user once, here at construction. */
  readonly #users: UserPool;
  /** The checks a start passes before anything of it is recorded (runs/admission.ts). */
  readonly #checks: StartChecks;
  /** The run's summary and events, pushed to whoever listens (runs/updates.ts). */
  readonly #updates: RunUpdates;
  /** The worktrees of `worktree` projects' runs and their recorded changes (design §16). */
  readonly #workspaces: RunWorkspaces;
  /** How a run ends: its terminal, then its cleanup (runs/settle.ts). */
  readonly #settler: RunSettler;
  /** What observers read of the runs: summaries, sync pages, tombstones, the inventory (runs/views.ts). */
  readonly #views: RunViews;
  /** How a run goes from admission to its end: workspace, turn, settling (runs/drive.ts). */
  readonly #driver: RunDriver;
  /** Agents of completed runs kept for a follow-up (`[acp] keep_agent_alive_secs`, runs/kept-agents.ts). */
  readonly #kept: KeptAgents;
  #closing = false;

  constructor(options: RunManagerOptions) {
    this.#config = options.config;
    this.#store = options.store;
    this.#log = options.logger ?? silentLogger();
    this.#graceMs = options.cleanupGraceMs ?? 2000;
    this.#ringLimits = options.ringLimits;
    this.#failpoint = options.failpoint ?? defaultFailpoint;
    this.#now = options.now ?? (() => new Date());
    this.agentInstanceId = newInstanceId("ai");
    this.#updates = new RunUpdates({ logger: this.#log, now: this.#now });
    this.#retention = new RunRetention({
      runs: this.#runs,
      ...(options.maxRetainedRuns === undefined ? {} : { maxRuns: options.maxRetainedRuns }),
      ...(options.retainedRingsMaxBytes === undefined ? {} : { maxRingBytes: options.retainedRingsMaxBytes }),
      persist: (run) => saveTerminal(run, this.#store, this.#log),
    });
    for (const agent of this.#config.acp.agents) {
      this.#agents.set(agent.id, agent);
      this.#providerInstanceIds.set(agent.id, newInstanceId("pi"));
    }
    for (const project of this.#config.projects) this.#projects.set(project.id, project);
    this.#workspaces = new RunWorkspaces({
      dir: options.workspacesDir ?? this.#config.runner.workspacesDir ?? worktreesDir(this.#config.runner.stateDir),
      store: this.#store,
      logger: this.#log,
      keepMs: this.#config.runner.workspaceKeepSecs * 1000,
      // Only a run without run_as takes a spare (a run_as run's workspace is its pool user's repository).
      spares: this.#config.acp.agents.some((a) => a.runAs === null) ? this.#config.runner.worktreeSpares : 0,
      runs: this.#runs,
      projects: this.#projects,
      graceMs: this.#graceMs,
      now: this.#now,
    });
    const guard = homeGuard(this.#config);
    this.#users = new UserPool(this.#config.acp.agents, {
      logger: this.#log,
      ...(options.sweepTimeoutMs === undefined ? {} : { sweepTimeoutMs: options.sweepTimeoutMs }),
      bindings: this.#config.acp.singleTenant ? null : (options.poolBindings ?? null),
      now: this.#now,
      maxUsersPerCaller: this.#config.acp.maxUsersPerCaller,
      bindingIdleDays: this.#config.acp.bindingIdleDays,
      recycleHome: (user) => recycleHome(user, guard),
    });
    this.#checks = new StartChecks({
      store: this.#store,
      logger: this.#log,
      agentInstanceId: this.agentInstanceId,
      agents: this.#agents,
      providerInstanceIds: this.#providerInstanceIds,
      projects: this.#projects,
      maxConcurrentRuns: this.#config.acp.maxConcurrentRuns,
      projectCallers: this.#config.acp.singleTenant ? null : (options.projectCallers ?? new MemoryProjectCallers()),
      now: this.#now,
    });
    this.#views = new RunViews({
      store: this.#store,
      runs: this.#runs,
      active: this.#active,
      workspaces: this.#workspaces,
    });
    this.#settler = new RunSettler({
      store: this.#store,
      logger: this.#log,
      graceMs: this.#graceMs,
      diagnosticsDir: options.diagnosticsDir,
      updates: this.#updates,
      users: this.#users,
      active: this.#active,
      retention: this.#retention,
      failpoint: this.#failpoint,
      now: this.#now,
    });
    this.#kept = new KeptAgents({
      keepMs: this.#config.acp.keepAgentAliveSecs * 1000,
      logger: this.#log,
      stop: (kept) => this.#settler.stopKept(kept),
    });
    this.#settler.kept = this.#kept;
    this.#driver = new RunDriver({
      turnOptions: {
        acp: this.#config.acp,
        store: this.#store,
        log: this.#log,
        sourceEnv: options.sourceEnv ?? process.env,
        maxMessageBytes: options.maxMessageBytes,
        failpoint: this.#failpoint,
      },
      workspaces: this.#workspaces,
      updates: this.#updates,
      settler: this.#settler,
      logger: this.#log,
      closing: () => this.#closing,
    });
  }

  /** Resolves once the start-up sweep of the run_as pool users is done (a user still being swept is not leased). */
  get usersReady(): Promise<void> {
    return this.#users.ready;
  }

  get storeId(): string {
    return this.#store.storeId;
  }

  /** The current provider_instance_id of a configured agent (fence for run.start). */
  providerInstanceId(providerId: string): string | undefined {
    return this.#providerInstanceIds.get(providerId);
  }

  helloBody(): HelloBody {
    return {
      agent_instance_id: this.agentInstanceId,
      store_id: this.#store.storeId,
      capabilities: { coding_agent_run: { max_concurrent_runs: this.#config.acp.maxConcurrentRuns } },
      providers: this.#config.acp.agents.map((a) => ({
        provider_id: a.id,
        provider_instance_id: this.#providerInstanceIds.get(a.id) as string,
        name: a.name,
        allowed_config_options: [...a.allowedConfigOptions],
        continuation: a.continuation,
      })),
      projects: this.#config.projects.map((p) => ({ project_id: p.id, allow_patch: p.allowPatch })),
      agents_share_runner_user: sameUserAgents(this.#config).length > 0,
    };
  }

  onUpdate(listener: RunUpdateListener): () => void {
    return this.#updates.onUpdate(listener);
  }

  // ---- admission --------------------------------------------------------------

  start(req: RunStartRequest): Promise<RunStartOutcome> {
    return this.#start(req, NO_WAITS);
  }

  /**
   * `waits`: what this start has already waited for — a pool user recycled for its caller, slots freed by runs
   * that have ended; after each wait it is admitted from the top again.
   */
  async #start(req: RunStartRequest, waits: StartWaits): Promise<RunStartOutcome> {
    if (this.#closing) return { ok: false, code: "internal", message: "The Runner is shutting down." };
    const checked = this.#checks.check(req, this.#views.summaryOf(req.run_id), this.#active.size);
    if (checked.kind === "answer") {
      // Full, but a run holding a slot has ended and its agent is being stopped: its caller was told it ended, so
      // a start now must not be refused for it. Wait for such a run to settle (bounded), then admit from the top.
      if (!checked.outcome.ok && checked.outcome.capacity_reason === "runner_full") {
        const next = await this.#afterEndedRunSettles(waits, () => true);
        if (next) return this.#start(req, next);
      }
      return checked.outcome;
    }
    // Kept agents hold no slot a caller sees: one that would take this run's slot is stopped — only for a run
    // that is admitted (a retry or a refusal answered above needs no room, and must not cost a warm follow-up).
    this.#kept.makeRoom(this.#active.size, this.#config.acp.maxConcurrentRuns, req.continue_run_id);
    const { agent, project, continueSessionId, ended } = checked;
    // A follow-up of a run whose agent is kept, in the project's own tree: that agent, and its pool user.
    const warm = ended ? null : this.#kept.forFollowUp(req, agent, project, continueSessionId);
    // A run_as user of the agent's pool for this caller (process/user-pool.ts), or why there is none.
    const lease: Lease =
      warm !== null
        ? { ok: true, user: warm.runAs }
        : ended
          ? { ok: true, user: null }
          : this.#users.acquire(agent, req.tenant);
    if (!lease.ok) {
      if (lease.reason === "unrecorded") return { ok: false, code: "internal", message: UNRECORDED_REFUSAL };
      // Likewise a pool user still held by a run that has ended (its user is released once its agent is gone).
      if (lease.reason === "pool_busy" || lease.reason === "caller_limit") {
        const next = await this.#afterEndedRunSettles(waits, (run) => run.runAs !== null);
        if (next) return this.#start(req, next);
      }
      if (lease.reason !== "recycling") return capacityRefusal(lease.reason);
      // An idle user is being recycled for this caller: wait for it (bounded), then admit from the top once.
      if (waits.recycled) return capacityRefusal("pool_recycling");
      return (await recycledInTime(lease.ready))
        ? this.#start(req, { ...waits, recycled: true })
        : capacityRefusal("pool_recycling");
    }

    const acp = this.#config.acp;
    const timeoutSecs = Math.min(req.timeout_secs ?? acp.defaultRunTimeoutSecs, acp.maxRunTimeoutSecs);
    const createdAt = this.#now().toISOString();
    const run = new Run(
      req.run_id,
      req.intent_fingerprint,
      project,
      agent,
      req.provider_instance_id,
      this.agentInstanceId,
      createdAt,
      timeoutSecs,
      this.#ringLimits,
      this.#now,
    );
    run.runAs = lease.user;
    run.warm = warm;
    run.tenant = req.tenant;
    run.continueSessionId = continueSessionId;
    run.continueRunId = continueSessionId === null ? null : (req.continue_run_id ?? null);
    try {
      this.#store.admit({
        run_id: run.run_id,
        intent_fingerprint: run.intent_fingerprint,
        project_id: project.id,
        provider_id: agent.id,
        provider_instance_id: run.provider_instance_id,
        agent_instance_id: run.agent_instance_id,
        created_at: createdAt,
      });
      // A continuation's session is its parent's from admission on (made durable with it below), so a child that
      // never got past setup (a crash, a fault) can itself be continued: the conversation is not cut there.
      if (continueSessionId !== null) this.#store.recordAcpSession(run.run_id, continueSessionId);
    } catch (error) {
      this.#log.error({ run_id: req.run_id, err_name: (error as Error)?.name }, "admission failed");
      if (warm !== null) void this.#settler.stopKept(warm);
      else if (lease.user) void this.#users.release(lease.user, run.run_id);
      return { ok: false, code: "internal", message: "The Runner could not record the admission." };
    }
    this.#runs.set(run.run_id, run);
    this.#active.add(run);
    this.#log.info({ run_id: run.run_id, project_id: project.id, provider_id: agent.id }, "run admitted");
    this.#failpoint("after_admission");
    // The turn forks the agent and records it durably before its first await; the admission row (committed
    // without an fsync of its own) is durable by then, or is made so here, before run.start is answered.
    void (ended
      ? this.#driver.endBeforeSpawn(run, ended)
      : this.#driver.drive(run, { prompt: req.prompt, callerConfig: req.config, baseRef: req.base_ref }));
    try {
      this.#store.ensureDurable(run.run_id);
    } catch (error) {
      this.#log.error({ run_id: run.run_id, err_name: (error as Error)?.name }, "admission not durable");
      run.turn?.abortSetup();
      return { ok: false, code: "internal", message: "The Runner could not record the admission." };
    }
    return { ok: true, run: run.summary(), created: true };
  }

  /**
   * Waits for one run that holds a slot (`which` of them) and has ended — its agent being stopped, its pool user not
   * yet released — to settle. Resolves to the start's waits for its next check, or null (refuse now) when no such
   * run is settling or none settles by SETTLE_WAIT_MS after the start's first wait. A start waits for one run at a
   * time and is checked again, so starts racing for the freed slots are each answered within that bound.
   */
  async #afterEndedRunSettles(waits: StartWaits, which: (run: Run) => boolean): Promise<StartWaits | null> {
    const settleBy = waits.settleBy ?? Date.now() + SETTLE_WAIT_MS;
    const ending = [...this.#active].filter((run) => run.terminal && which(run)).map((run) => run.settled);
    const left = settleBy - Date.now();
    if (ending.length === 0 || left <= 0) return null;
    return (await readyInTime(Promise.race(ending), left)) ? { ...waits, settleBy } : null;
  }

  // ---- observation --------------------------------------------------------------

  sync(runId: string, afterSeq: number, maxEvents: number): RunSyncResult | null {
    return this.#views.sync(runId, afterSeq, maxEvents);
  }

  tombstone(runId: string): RunTombstone | null {
    return this.#views.tombstone(runId);
  }

  inventory(): RunSummary[] {
    return this.#views.inventory();
  }

  /** Resolves once the run is terminal and its process tree is gone (immediately for unknown/evicted runs). */
  whenSettled(runId: string): Promise<void> {
    return this.#runs.get(runId)?.settled ?? Promise.resolve();
  }

  /** The run's event ring while it is held in memory (local readers: exec, tests). */
  ring(runId: string): EventRing | undefined {
    return this.#runs.get(runId)?.ring;
  }

  // ---- cancel ---------------------------------------------------------------------

  async cancel(runId: string): Promise<RunCancelResult | null> {
    const run = this.#runs.get(runId);
    if (!run) {
      const row = this.#store.get(runId);
      if (!row) return null;
      const summary = this.#views.rowSummary(row);
      const terminal = row.phase === "terminal";
      return { run: summary, cancel_requested: false, already_terminal: terminal };
    }
    if (run.terminal) return { run: run.summary(), cancel_requested: false, already_terminal: true };
    requestCancel(run, "cancel");
    return { run: run.summary(), cancel_requested: true, already_terminal: false };
  }

  // ---- workspaces -----------------------------------------------------------------

  changes(runId: string, offset: number, maxBytes: number): Promise<ChangesOutcome | null> {
    return this.#workspaces.changes(runId, offset, maxBytes);
  }

  /** Remove the kept worktrees whose keep time has passed (runs on a timer; tests call it after moving the clock). */
  sweepWorkspaces(): Promise<number> {
    return this.#workspaces.sweep();
  }

  apply(runId: string, target: string, keyHash: string): Promise<ApplyOutcome | null> {
    return this.#workspaces.apply(runId, target, keyHash);
  }

  /** Delete the branches of runs past retention (runs hourly and at start-up; tests call it after pruning). */
  pruneBranches(): Promise<number> {
    return this.#workspaces.pruneBranches();
  }

  /**
   * Start-up, before the link: record every change a previous process left unrecorded, remove leftover worktrees.
   */
  recoverWorkspaces(): Promise<{ recorded: number; removed: number; pending: number }> {
    return this.#workspaces.recover(this.#config.projects);
  }

  /**
   * Graceful stop: stop accepting; a run still in setup is abandoned (its tree killed, failed/not_started
   * runner_restarted — no barrier is crossed once closing); every dispatched run gets session/cancel and up to
   * cancel_grace_secs for its correlated answer (confirmed → cancelled, else lost, then its tree is killed).
   * Waits for every run to settle, then closes the store.
   */
  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    // Kept agents first: nothing is kept from now on, and each is stopped and its pool user swept.
    const keptStopped = this.#kept.close();
    const active = [...this.#active];
    for (const run of active) {
      if (run.dispatched && !run.terminal) {
        // A run already being cancelled keeps its own reason and grace.
        requestCancel(run, "shutdown");
        continue;
      }
      // Setup still running (maybe spawnAgent pending, with no conn or child to close yet): abort it.
      if (!run.dispatched) run.turn?.stopping();
      run.conn?.close();
      void run.child?.terminateTree(Math.min(this.#graceMs, 500));
    }
    await Promise.all(active.map((run) => run.settled));
    await keptStopped;
    await this.#workspaces.close();
    // Last chance for terminal writes that failed earlier (else recovery treats those rows as interrupted).
    for (const run of this.#runs.values()) saveTerminal(run, this.#store, this.#log);
    this.#store.close();
  }
}
