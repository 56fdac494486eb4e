/**
 * The run lifecycle (DESIGN §4.2–4.5) behind the RunService seam: admission
 * (fences, capacity — never a queue), then one ACP turn per run:
 *
 *   admit ─▶ env/spawn ─▶ initialize ─▶ session/new ─▶ config sequencing
 *         ─▶ BARRIER (store.markDispatchBarrier, durable) ─▶ session/prompt
 *         ─▶ updates … correlated response ─▶ markTerminal ─▶ projection
 *         ─▶ tree cleanup ─▶ clearChild
 *
 * Failpoints (test-only SIGKILL, see failpoints.ts) sit at: after_admission,
 * before_barrier, after_barrier_before_prompt, after_prompt_write,
 * after_terminal_before_projection.
 *
 * Terminal messages are fixed texts (FAILURE_SUMMARIES + stage); provider
 * text never reaches run state. Cancellation and "unknown outcome" are
 * results, not exceptions.
 */
import { randomBytes } from "node:crypto";
import type {
  RequestPermissionRequest,
  RequestPermissionResponse,
  SessionNotification,
} from "@agentclientprotocol/sdk";
import {
  FAILURE_SUMMARIES,
  type FailureKind,
  MAX_EVENTS_PER_SYNC,
  MAX_EVENTS_PER_UPDATE,
  MAX_INVENTORY_RUNS,
  type RunEvent,
  type RunSummary,
  UPDATE_EVENT_BYTES,
} from "@webcodex/protocol";
import { AcpClientConnection, loggableMethod, type RequestOutcome } from "./acp-session.js";
import type { AgentConfig, ProjectConfig, RunnerConfig } from "./config.js";
import { checkCallerKeys, sequenceConfig } from "./config-sequencing.js";
import type { DispatchStore } from "./dispatch-store-types.js";
import type { EventRing, RingLimits } from "./event-ring.js";
import { EventNormalizer, Redactor } from "./events.js";
import { failpoint as defaultFailpoint, type FailpointName } from "./failpoints.js";
import { type Logger, silentLogger } from "./logger.js";
import { Run, rowToSummary } from "./run-record.js";
import type {
  HelloBody,
  RunCancelResult,
  RunService,
  RunStartOutcome,
  RunStartRequest,
  RunSyncResult,
  RunUpdateListener,
} from "./run-service.js";
import { type AgentChild, resolveChildEnv, SpawnError, spawnAgent } from "./spawn.js";
import {
  type CancelReason,
  cancelledBeforeDispatch,
  lost,
  notStarted,
  type PermissionAnswer,
  promptTerminal,
  type Terminal,
} from "./terminal.js";
import { TextPacer } from "./text-pacer.js";

export { rowToSummary };

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
  /** Crash injection (default: failpoints.ts, armed only by WEBCODEX_FAILPOINT). */
  failpoint?: (name: FailpointName) => void;
  now?: () => Date;
}

/**
 * Durations (ms, consecutive laps from just before the spawn) of the setup
 * stages of one dispatched run, logged once as "run timings" when the prompt
 * has been written: spawn (process start, recording its group, wiring the
 * connection), initialize, session_new, config (sequencing and its record),
 * barrier_commit (the durable dispatch barrier), prompt_write (until the
 * session/prompt request was handed to the child's stdin).
 */
export interface RunTimings {
  spawn: number;
  initialize: number;
  session_new: number;
  config: number;
  barrier_commit: number;
  prompt_write: number;
}

/**
 * Budget of the serialized event bytes held by the rings of retained terminal
 * runs, all together (each ring alone may hold RING_MAX_BYTES, 8 MiB; 64 of
 * them would be 512 MiB). Beyond it the oldest terminal runs leave memory
 * first: their summaries are answered from the store, and an observer behind
 * them is told history_lost (sync returns no events, oldest_seq = last_seq + 1).
 */
export const RETAINED_RINGS_MAX_BYTES = 64 * 1024 * 1024;

/** Streamed text pacing (text-pacer.ts): at once when quiet, up to COALESCE_MS during a flood. */
export { COALESCE_MS, FLOOD_GAP_MS } from "./text-pacer.js";
/**
 * Permission requests a run may have waiting at once. Each holds a waiter, a
 * timer, a ring event and a log line; beyond this bound a request is answered
 * `cancelled` at once, with no event, and only counted (ignored_updates).
 */
export const MAX_PENDING_PERMISSIONS = 16;
/** Faults that close() itself causes by closing connections and killing trees. */
const CUT_BY_SHUTDOWN: ReadonlySet<FailureKind> = new Set(["io_error", "provider_exited", "stdout_closed"]);

function newInstanceId(prefix: string): string {
  return `${prefix}_${randomBytes(16).toString("base64url")}`;
}

type Aborted = { kind: "aborted" };

class AbortedError extends Error {}

export class RunManager implements RunService {
  readonly agentInstanceId: string;
  readonly #config: RunnerConfig;
  readonly #store: DispatchStore;
  readonly #log: Logger;
  readonly #env: NodeJS.ProcessEnv;
  readonly #graceMs: number;
  readonly #maxMessageBytes: number | undefined;
  readonly #ringLimits: Partial<RingLimits> | undefined;
  readonly #maxRetained: number;
  readonly #retainedRingsMaxBytes: number;
  readonly #failpoint: (name: FailpointName) => void;
  readonly #now: () => Date;
  readonly #providerInstanceIds = new Map<string, string>();
  readonly #agents = new Map<string, AgentConfig>();
  readonly #projects = new Map<string, ProjectConfig>();
  readonly #runs = new Map<string, Run>();
  /** Runs holding a capacity slot: from admission until their process tree is gone. */
  readonly #active = new Set<Run>();
  readonly #retained: string[] = [];
  readonly #listeners = new Set<RunUpdateListener>();
  #closing = false;

  constructor(options: RunManagerOptions) {
    this.#config = options.config;
    this.#store = options.store;
    this.#log = options.logger ?? silentLogger();
    this.#env = options.sourceEnv ?? process.env;
    this.#graceMs = options.cleanupGraceMs ?? 2000;
    this.#maxMessageBytes = options.maxMessageBytes;
    this.#ringLimits = options.ringLimits;
    this.#maxRetained = options.maxRetainedRuns ?? 64;
    this.#retainedRingsMaxBytes = options.retainedRingsMaxBytes ?? RETAINED_RINGS_MAX_BYTES;
    this.#failpoint = options.failpoint ?? defaultFailpoint;
    this.#now = options.now ?? (() => new Date());
    this.agentInstanceId = newInstanceId("ai");
    for (const agent of this.#config.acp.agents) {
      this.#agents.set(agent.id, agent);
      this.#providerInstanceIds.set(agent.id, newInstanceId("pi"));
    }
    for (const project of this.#config.projects) this.#projects.set(project.id, project);
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
      })),
      projects: this.#config.projects.map((p) => ({ project_id: p.id, allow_patch: p.allowPatch })),
    };
  }

  onUpdate(listener: RunUpdateListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  // ---- admission --------------------------------------------------------------

  async start(req: RunStartRequest): Promise<RunStartOutcome> {
    if (this.#closing) return { ok: false, code: "internal", message: "The Runner is shutting down." };
    const existing = this.#summaryOf(req.run_id);
    if (existing) {
      if (existing.intent_fingerprint === req.intent_fingerprint) return { ok: true, run: existing, created: false };
      return {
        ok: false,
        code: "idempotency_conflict",
        message: "A run with this id exists with a different intent.",
        run: existing,
      };
    }
    if (req.agent_instance_id !== this.agentInstanceId) {
      return { ok: false, code: "stale_runner", message: "The Runner instance changed; refresh and retry." };
    }
    const agent = this.#agents.get(req.provider_id);
    if (!agent) return { ok: false, code: "unknown_provider", message: "The Runner has no such provider." };
    if (req.provider_instance_id !== this.#providerInstanceIds.get(agent.id)) {
      return { ok: false, code: "stale_provider", message: FAILURE_SUMMARIES.stale_provider };
    }
    const project = this.#projects.get(req.project_id);
    if (!project) return { ok: false, code: "unknown_project", message: "The Runner has no such project." };
    if (!project.allowPatch) {
      return {
        ok: false,
        code: "project_not_writable",
        message: "The project does not allow agent runs (allow_patch).",
      };
    }
    if (this.#active.size >= this.#config.acp.maxConcurrentRuns) {
      return { ok: false, code: "capacity", message: FAILURE_SUMMARIES.capacity };
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
    } catch (error) {
      this.#log.error({ run_id: req.run_id, err_name: (error as Error)?.name }, "admission failed");
      return { ok: false, code: "internal", message: "The Runner could not record the admission." };
    }
    this.#runs.set(run.run_id, run);
    this.#active.add(run);
    this.#log.info({ run_id: run.run_id, project_id: project.id, provider_id: agent.id }, "run admitted");
    this.#failpoint("after_admission");
    void this.#drive(run, req.prompt, req.config);
    return { ok: true, run: run.summary(), created: true };
  }

  // ---- observation --------------------------------------------------------------

  sync(runId: string, afterSeq: number, maxEvents: number): RunSyncResult | null {
    const run = this.#runs.get(runId);
    if (run) {
      run.normalizer?.flushStreamed();
      const { events, hasMore } = run.ring.read(afterSeq, Math.min(maxEvents, MAX_EVENTS_PER_SYNC));
      return { run: run.summary(), events, has_more: hasMore };
    }
    const row = this.#store.get(runId);
    return row ? { run: rowToSummary(row), events: [], has_more: false } : null;
  }

  inventory(): RunSummary[] {
    const out: RunSummary[] = [];
    const seen = new Set<string>();
    for (const run of this.#active) {
      out.push(run.summary());
      seen.add(run.run_id);
    }
    for (const row of this.#store.listForInventory(MAX_INVENTORY_RUNS)) {
      if (out.length >= MAX_INVENTORY_RUNS) break;
      if (seen.has(row.run_id)) continue;
      seen.add(row.run_id);
      out.push(this.#runs.get(row.run_id)?.summary() ?? rowToSummary(row));
    }
    return out.sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0));
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
      const summary = rowToSummary(row);
      const terminal = row.phase === "terminal";
      return { run: summary, cancel_requested: false, already_terminal: terminal };
    }
    if (run.terminal) return { run: run.summary(), cancel_requested: false, already_terminal: true };
    this.#requestCancel(run, "cancel");
    return { run: run.summary(), cancel_requested: true, already_terminal: false };
  }

  /** Idempotent: the first reason sticks; session/cancel is sent at most once. */
  #requestCancel(run: Run, reason: CancelReason): void {
    if (run.terminal || run.cancelReason !== null) return;
    run.cancelReason = reason;
    this.#log.info({ run_id: run.run_id, reason, dispatched: run.dispatched }, "cancel requested");
    if (!run.dispatched) {
      run.setupAbort.abort();
      return;
    }
    // Answer pending permission requests `cancelled` first, then session/cancel.
    for (const wake of [...run.permissionWaiters]) wake(reason);
    run.timer(this.#config.acp.cancelGraceSecs * 1000, run.expireGrace);
    setImmediate(() => {
      const conn = run.conn;
      if (run.terminal || !conn || run.sessionId === null || run.sessionCancelSent) return;
      run.sessionCancelSent = true;
      void conn.cancel(run.sessionId);
    });
  }

  // ---- the turn ------------------------------------------------------------------

  async #drive(run: Run, prompt: string, callerConfig: RunStartRequest["config"]): Promise<void> {
    let terminal: Terminal;
    try {
      terminal = await this.#turn(run, prompt, callerConfig);
    } catch (error) {
      this.#log.error({ run_id: run.run_id, err_name: (error as Error)?.name, stage: run.stage }, "turn failed");
      terminal = run.dispatched ? lost("io_error", FAILURE_SUMMARIES.io_error) : notStarted("io_error", run.stage);
    }
    run.clearTimers();
    // A shutdown (close()) cut the turn: record it as a restart would (recovery.ts), not as an agent fault.
    const cut = terminal.failure_kind !== null && CUT_BY_SHUTDOWN.has(terminal.failure_kind);
    if (this.#closing && cut && terminal.execution_state === "not_started") {
      terminal = notStarted("runner_restarted", run.stage);
    } else if (this.#closing && cut && terminal.state === "lost") {
      terminal = lost("transport_lost", FAILURE_SUMMARIES.transport_lost);
    }
    this.#finish(run, terminal);
    await this.#cleanup(run);
  }

  async #turn(run: Run, prompt: string, callerConfig: RunStartRequest["config"]): Promise<Terminal> {
    const acp = this.#config.acp;
    run.timer(acp.setupTimeoutSecs * 1000, () => {
      if (run.dispatched || run.terminal) return;
      run.setupExpired = true;
      run.setupAbort.abort();
    });

    // Before spawning: input that can never work, and the env mapping.
    const keys = checkCallerKeys(acp.forcedConfig, callerConfig, run.agent.allowedConfigOptions);
    if (!keys.ok) return notStarted(keys.failureKind, "set_config_option", keys.detail, "fix_input");
    const env = resolveChildEnv(run.agent, this.#env);
    if (!env.ok) return notStarted("missing_env", "spawn", `Missing source variable: ${env.missingSource}.`);
    if (run.setupAbort.signal.aborted) return this.#setupAborted(run);

    const redactor = new Redactor(Object.values(env.env), run.project.root);
    // Streamed text enters the ring (and is pushed) at the next setImmediate when the stream is quiet,
    // or after up to COALESCE_MS while a flood is going on (text-pacer.ts).
    const pacer = new TextPacer({
      flush: () => {
        if (!run.terminal) normalizer.flushStreamed();
      },
    });
    const normalizer = new EventNormalizer({
      projectRoot: run.project.root,
      redactor,
      emit: (body) => {
        if (run.terminal) return;
        if (body.kind === "agent_message" || body.kind === "reasoning") pacer.noteFlush();
        run.ring.push(body);
        this.#schedulePush(run);
      },
      onPending: () => pacer.schedule(),
    });
    run.normalizer = normalizer;
    run.textPacer = pacer;

    // Per-stage durations, logged once at dispatch ("run timings"; scripts/bench reads them).
    const timings: RunTimings = {
      spawn: 0,
      initialize: 0,
      session_new: 0,
      config: 0,
      barrier_commit: 0,
      prompt_write: 0,
    };
    let stageStart = performance.now();
    const lap = (stage: keyof RunTimings): void => {
      const now = performance.now();
      timings[stage] = Math.round((now - stageStart) * 100) / 100;
      stageStart = now;
    };

    // Spawn.
    let child: AgentChild;
    try {
      child = await spawnAgent({ agent: run.agent, cwd: run.project.root, env: env.env });
    } catch (error) {
      const code = error instanceof SpawnError ? error.code : "unknown";
      this.#log.warn({ run_id: run.run_id, code }, "agent spawn failed");
      return notStarted("provider_spawn_failed", "spawn");
    }
    run.child = child;
    this.#log.info({ run_id: run.run_id, pgid: child.pgid }, "agent spawned");
    this.#store.markSetup(
      run.run_id,
      child.startTime === null ? null : { pgid: child.pgid, startTime: child.startTime },
    );
    run.phase = "setup";
    this.#touch(run);
    void child.exited.then((exit) => this.#log.info({ run_id: run.run_id, ...exit }, "agent exited"));

    const conn = new AcpClientConnection(
      child,
      {
        onSessionUpdate: (n) => this.#onSessionUpdate(run, n),
        onPermissionRequest: (params, signal) => this.#onPermission(run, params, signal),
        onUnsupportedRequest: (method) =>
          this.#log.info({ run_id: run.run_id, method: loggableMethod(method) }, "refused agent request"),
      },
      this.#maxMessageBytes === undefined ? {} : { maxMessageBytes: this.#maxMessageBytes },
    );
    run.conn = conn;

    // initialize
    lap("spawn");
    run.stage = "initialize";
    const init = await this.#setupStep(run, conn.initialize());
    lap("initialize");
    if (init.kind !== "ok") return this.#setupFailure(run, init);
    if (init.value.protocolVersion !== 1) {
      this.#log.warn({ run_id: run.run_id, protocol_version: Number(init.value.protocolVersion) }, "bad ACP version");
      return notStarted("unsupported_protocol_version", "initialize");
    }

    // session/new
    run.stage = "session_new";
    const session = await this.#setupStep(run, conn.newSession(run.project.root));
    lap("session_new");
    if (session.kind !== "ok") return this.#setupFailure(run, session);
    if (typeof session.value?.sessionId !== "string") return notStarted("protocol_violation", "session_new");
    run.sessionId = session.value.sessionId;

    // config sequencing
    run.stage = "set_config_option";
    const sessionId = run.sessionId;
    let sequenced: Awaited<ReturnType<typeof sequenceConfig>>;
    try {
      sequenced = await sequenceConfig({
        forced: acp.forcedConfig,
        caller: callerConfig,
        allowed: run.agent.allowedConfigOptions,
        initial: session.value.configOptions,
        redact: (text) => redactor.redact(text),
        set: async (id, value) => {
          const outcome = await this.#setupStep(run, conn.setConfigOption(sessionId, id, value));
          if (outcome.kind === "aborted") throw new AbortedError();
          return outcome;
        },
      });
    } catch (error) {
      if (error instanceof AbortedError) return this.#setupAborted(run);
      throw error;
    }
    if (!sequenced.ok) {
      if (sequenced.failureKind === "fault") return this.#setupFailure(run, sequenced.outcome);
      return notStarted(sequenced.failureKind, "set_config_option", sequenced.detail, "fix_input");
    }
    run.effective_config = sequenced.effective;
    this.#store.recordEffectiveConfig(run.run_id, sequenced.effective);
    lap("config");

    // The barrier. Nothing between the durable commit and the prompt write may fail silently.
    if (run.setupAbort.signal.aborted) return this.#setupAborted(run);
    if (this.#closing) return notStarted("runner_restarted", run.stage);
    run.stage = "prompt";
    this.#failpoint("before_barrier");
    try {
      this.#store.markDispatchBarrier(run.run_id);
      lap("barrier_commit");
    } catch (error) {
      this.#log.error({ run_id: run.run_id, err_name: (error as Error)?.name }, "dispatch barrier failed");
      return notStarted("io_error", "prompt");
    }
    run.phase = "dispatch_barrier";
    run.state = "running";
    run.execution_state = "started";
    run.recovery_kind = "wait";
    this.#touch(run);
    // The run deadline bounds the turn from dispatch (setup has its own deadline).
    run.timer(run.timeoutSecs * 1000, () => this.#requestCancel(run, "deadline"));
    this.#failpoint("after_barrier_before_prompt");
    const response = conn.prompt(sessionId, prompt);
    void conn.promptWritten.then(() => {
      lap("prompt_write");
      this.#failpoint("after_prompt_write");
      this.#log.info({ run_id: run.run_id, timings_ms: timings }, "run timings");
    });

    const answered = await Promise.race([response, run.graceExpired.then(() => ({ kind: "grace" as const }))]);
    if (answered.kind === "rpc_error") {
      this.#log.info({ run_id: run.run_id, rpc_code: answered.code }, "prompt answered with an error");
    }
    return promptTerminal(answered, run);
  }

  /** Race a setup request against the setup deadline and cancellation. */
  async #setupStep<T>(run: Run, request: Promise<RequestOutcome<T>>): Promise<RequestOutcome<T> | Aborted> {
    const signal = run.setupAbort.signal;
    if (signal.aborted) return { kind: "aborted" };
    let onAbort!: () => void;
    const aborted = new Promise<Aborted>((resolve) => {
      onAbort = () => resolve({ kind: "aborted" });
      signal.addEventListener("abort", onAbort, { once: true });
    });
    try {
      return await Promise.race([request, aborted]);
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }

  #setupFailure(run: Run, outcome: Exclude<RequestOutcome<unknown>, { kind: "ok" }> | Aborted): Terminal {
    switch (outcome.kind) {
      case "aborted":
        return this.#setupAborted(run);
      case "rpc_error":
        this.#log.info({ run_id: run.run_id, stage: run.stage, rpc_code: outcome.code }, "setup request rejected");
        return notStarted("provider_rejected", run.stage, `JSON-RPC error ${outcome.code}.`);
      case "fault":
        return notStarted(outcome.fault, run.stage);
    }
  }

  #setupAborted(run: Run): Terminal {
    if (run.setupExpired) return notStarted("setup_timeout", run.stage);
    if (run.cancelReason === "deadline") return notStarted("run_timeout", run.stage);
    // close() aborted the setup: recorded as a restart would record it (recovery.ts).
    if (run.cancelReason === null && this.#closing) return notStarted("runner_restarted", run.stage);
    return cancelledBeforeDispatch(run.stage);
  }

  #onSessionUpdate(run: Run, notification: SessionNotification): void {
    const normalizer = run.normalizer;
    if (!normalizer || run.terminal) return;
    if (run.sessionId === null || notification.sessionId !== run.sessionId) {
      normalizer.ignore();
      return;
    }
    normalizer.handle(notification.update);
    this.#schedulePush(run);
  }

  async #onPermission(
    run: Run,
    params: RequestPermissionRequest,
    signal: AbortSignal,
  ): Promise<RequestPermissionResponse> {
    const cancelled: RequestPermissionResponse = { outcome: { outcome: "cancelled" } };
    const normalizer = run.normalizer;
    if (!normalizer || run.terminal || !run.dispatched || params.sessionId !== run.sessionId) return cancelled;
    if (run.cancelReason !== null) {
      run.permissionAnswered ??= run.cancelReason;
      return cancelled;
    }
    if (run.pendingPermissions >= MAX_PENDING_PERMISSIONS) {
      if (run.refusedPermissions++ === 0) {
        this.#log.warn({ run_id: run.run_id, pending: run.pendingPermissions }, "too many pending permission requests");
      }
      normalizer.ignore();
      return cancelled;
    }
    normalizer.emitBody(normalizer.permissionEvent(params));
    run.pendingPermissions++;
    run.state = "waiting_permission";
    this.#touch(run);
    this.#log.info({ run_id: run.run_id }, "permission requested");

    const why = await new Promise<PermissionAnswer | "closed">((resolve) => {
      const timer = setTimeout(() => finish("permission_deadline"), this.#config.acp.permissionTimeoutSecs * 1000);
      const onAbort = () => finish("closed");
      const finish = (w: PermissionAnswer | "closed") => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        run.permissionWaiters.delete(finish);
        resolve(w);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      run.permissionWaiters.add(finish);
    });
    run.pendingPermissions--;
    if (why !== "closed") run.permissionAnswered ??= why;
    if (run.pendingPermissions === 0 && run.state === "waiting_permission") {
      run.state = "running";
      this.#touch(run);
    }
    this.#log.info({ run_id: run.run_id, answered: "cancelled", because: why }, "permission answered");
    return cancelled;
  }

  // ---- terminal, projection, cleanup ---------------------------------------------------

  #finish(run: Run, t: Terminal): void {
    if (run.terminal) return;
    run.normalizer?.flush();
    const ignored = run.normalizer?.ignoredUpdates ?? 0;
    const lastSeq = run.ring.lastSeq + 1; // the terminal event below
    run.unsavedTerminal = {
      state: t.state,
      execution_state: t.execution_state,
      stop_reason: t.stop_reason,
      failure_kind: t.failure_kind,
      recovery_kind: t.recovery_kind,
      message: t.message,
      ignored_updates: ignored,
      last_seq: lastSeq,
    };
    this.#saveTerminal(run);
    this.#failpoint("after_terminal_before_projection");
    run.ring.push({
      kind: "terminal",
      state: t.state,
      execution_state: t.execution_state,
      stop_reason: t.stop_reason,
      failure_kind: t.failure_kind,
      message: t.message,
    });
    run.phase = "terminal";
    run.state = t.state;
    run.execution_state = t.execution_state;
    run.stop_reason = t.stop_reason;
    run.failure_kind = t.failure_kind;
    run.recovery_kind = t.recovery_kind;
    run.message = t.message;
    run.updated_at = this.#now().toISOString();
    run.ring.close();
    this.#log.info(
      {
        run_id: run.run_id,
        state: t.state,
        execution_state: t.execution_state,
        stop_reason: t.stop_reason,
        failure_kind: t.failure_kind,
        ignored_updates: ignored,
        refused_permissions: run.refusedPermissions,
        events: lastSeq,
      },
      "run terminal",
    );
    this.#push(run);
  }

  async #cleanup(run: Run): Promise<void> {
    try {
      run.conn?.close();
      const child = run.child;
      if (child) {
        const result = await child.terminateTree(this.#graceMs);
        this.#log.info(
          {
            run_id: run.run_id,
            escalation: result.escalation,
            survivors: result.survivors,
            exit_code: child.exit?.code ?? null,
            exit_signal: child.exit?.signal ?? null,
            stderr_bytes: child.stderrBytes,
            dropped_responses: run.conn?.droppedResponses ?? 0,
          },
          "agent process tree cleaned up",
        );
        if (result.survivors > 0) {
          // Keep the group's identity in the store: the next start's reaper must still find it.
          this.#log.error({ run_id: run.run_id, survivors: result.survivors }, "agent processes survived SIGKILL");
        } else {
          try {
            this.#store.clearChild(run.run_id);
          } catch (error) {
            this.#log.error({ run_id: run.run_id, err_name: (error as Error)?.name }, "clearing the child failed");
          }
        }
      }
    } finally {
      run.child = null;
      run.conn = null;
      this.#active.delete(run);
      this.#retain(run);
      run.markSettled();
    }
  }

  /**
   * Write the run's terminal state durably. On failure the run keeps it as
   * unsavedTerminal: pinned in memory (the durable row still says non-terminal,
   * so only memory answers right) until a later retry succeeds.
   */
  #saveTerminal(run: Run): boolean {
    const update = run.unsavedTerminal;
    if (!update) return true;
    try {
      this.#store.markTerminal(run.run_id, update);
    } catch (error) {
      this.#log.error(
        { run_id: run.run_id, err_name: (error as Error)?.name },
        "recording the terminal state failed; the run stays pinned in memory and the write is retried",
      );
      return false;
    }
    if (run.phase === "terminal") this.#log.info({ run_id: run.run_id }, "terminal state recorded on retry");
    run.unsavedTerminal = null;
    return true;
  }

  /**
   * Keep a settled run in memory; evict the oldest ones beyond the count bound
   * and while the retained rings exceed their byte budget (never the run just
   * retained, never one whose terminal write failed).
   */
  #retain(run: Run): void {
    this.#retained.push(run.run_id);
    let ringBytes = 0;
    for (const id of this.#retained) ringBytes += this.#runs.get(id)?.ring.bytes ?? 0;
    const pinned: string[] = [];
    while (
      this.#retained.length > this.#maxRetained ||
      (ringBytes > this.#retainedRingsMaxBytes && this.#retained.length > 1)
    ) {
      const evicted = this.#retained.shift();
      if (evicted === undefined) break;
      const old = this.#runs.get(evicted);
      ringBytes -= old?.ring.bytes ?? 0;
      if (old && !this.#saveTerminal(old)) pinned.push(evicted);
      else this.#runs.delete(evicted);
    }
    if (pinned.length > 0) this.#retained.unshift(...pinned);
  }

  /** State changed: push soon (at most one setImmediate later). */
  #touch(run: Run): void {
    run.updated_at = this.#now().toISOString();
    this.#schedulePush(run);
  }

  #schedulePush(run: Run): void {
    if (run.pushScheduled) return;
    run.pushScheduled = true;
    setImmediate(() => {
      run.pushScheduled = false;
      this.#push(run);
    });
  }

  /** Send the summary and every event newer than the last push, in frame-sized batches. */
  #push(run: Run): void {
    const summary = run.summary();
    const { events } = run.ring.read(run.pushedSeq, Number.MAX_SAFE_INTEGER);
    run.pushedSeq = run.ring.lastSeq;
    if (this.#listeners.size === 0) return;
    if (events.length === 0) {
      this.#emit(summary, []);
      return;
    }
    let batch: RunEvent[] = [];
    let bytes = 0;
    for (const event of events) {
      const size = run.ring.sizeOf(event);
      if (batch.length > 0 && (batch.length >= MAX_EVENTS_PER_UPDATE || bytes + size > UPDATE_EVENT_BYTES)) {
        this.#emit(summary, batch);
        batch = [];
        bytes = 0;
      }
      batch.push(event);
      bytes += size;
    }
    this.#emit(summary, batch);
  }

  #emit(summary: RunSummary, events: readonly RunEvent[]): void {
    for (const listener of this.#listeners) {
      try {
        listener(summary, events);
      } catch (error) {
        this.#log.error({ run_id: summary.run_id, err_name: (error as Error)?.name }, "update listener threw");
      }
    }
  }

  #summaryOf(runId: string): RunSummary | null {
    const run = this.#runs.get(runId);
    if (run) return run.summary();
    const row = this.#store.get(runId);
    return row ? rowToSummary(row) : null;
  }

  /** Stop accepting, kill every child tree (no cancel is sent), wait for the runs to settle, close the store. */
  async close(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    const active = [...this.#active];
    for (const run of active) {
      // Setup still running (maybe spawnAgent pending, with no conn or child to close yet): abort it.
      if (!run.dispatched) run.setupAbort.abort();
      run.conn?.close();
      void run.child?.terminateTree(Math.min(this.#graceMs, 500));
    }
    await Promise.all(active.map((run) => run.settled));
    // Last chance for terminal writes that failed earlier (else recovery treats those rows as interrupted).
    for (const run of this.#runs.values()) this.#saveTerminal(run);
    this.#store.close();
  }
}
