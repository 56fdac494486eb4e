/**
 * One ACP prompt turn (design §4.3) for an admitted run:
 *
 *   env/spawn ─▶ initialize ─▶ session/new ─▶ config sequencing
 *     ─▶ BARRIER (store.markDispatchBarrier, durable) ─▶ session/prompt
 *     ─▶ updates, permission requests … correlated response
 *
 * A follow-up handed its parent's kept agent (`TurnRun.warm`, runs/kept-agents.ts) adopts that process,
 * connection and session in place of spawn, initialize and session/resume|load, then goes on from config.
 *
 * A turn is an async generator (`AcpTurn.events()`): it yields what the run must record as it happens
 * (the agent's process and connection, the phases, the effective config, permission waits, new events,
 * the setup milestones) and returns the run's Terminal. The run manager (runs/) consumes it and writes
 * the run's record, timings and terminal; recording the terminal, the projection and the tree cleanup are
 * its. The turn keeps the durable points of its own steps (the child's identity, the effective config,
 * the barrier) in the order it crosses them, and its event bodies enter the run's bounded ring (handed in)
 * as they are normalized, so a read of the ring is never behind the turn. Before the barrier every failure
 * is failed/not_started naming the stage; after it only a correlated answer, or lost. Terminal messages
 * are fixed texts (acp/terminal.ts); provider text never reaches run state. Cancellation (`cancel`) and
 * "unknown outcome" are results, not exceptions. The agent's permission requests wait at the turn's gate
 * (acp/permissions.ts) and are answered `cancelled`.
 *
 * Failpoints (test-only SIGKILL, failpoints.ts) here: before_barrier,
 * after_barrier_before_prompt, after_prompt_write.
 */
import type {
  NewSessionResponse,
  PromptResponse,
  RequestPermissionRequest,
  RequestPermissionResponse,
  SessionNotification,
} from "@agentclientprotocol/sdk";
import type { ConfigMap, SetupStage } from "@webcodex/protocol";
import type { AgentConfig, ProjectConfig, RunnerConfig } from "../config/config.js";
import type { RunAs } from "../config/run-as.js";
import { EventNormalizer } from "../events/normalize.js";
import { Redactor } from "../events/redactor.js";
import type { EventRing } from "../events/ring.js";
import { TextPacer } from "../events/text-pacer.js";
import type { FailpointName } from "../failpoints.js";
import type { Logger } from "../logger.js";
import { type AgentChild, resolveChildEnv, SpawnError, spawnAgent } from "../process/spawn.js";
import type { DispatchStore } from "../store/types.js";
import { checkCallerKeys, sequenceConfig } from "./config-sequencing.js";
import { PermissionGate } from "./permissions.js";
import { CONTINUATION_UNSUPPORTED_DETAIL, continueSession } from "./resume.js";
import { AcpClientConnection, loggableMethod, type RequestOutcome } from "./session.js";
import { type CancelReason, cancelledBeforeDispatch, notStarted, promptTerminal, type Terminal } from "./terminal.js";
import { type TimedStage, type TurnEvent, TurnEventQueue } from "./turn-events.js";

/** The Runner's side of every turn: its settings and the store the turn's durable points go to. */
export interface TurnOptions {
  acp: RunnerConfig["acp"];
  store: DispatchStore;
  log: Logger;
  /** Source of env_from_env values, read at each spawn. */
  sourceEnv: NodeJS.ProcessEnv;
  maxMessageBytes: number | undefined;
  failpoint: (name: FailpointName) => void;
  /** Spawn seam (default spawnAgent); tests hand in a child made of streams. */
  spawn?: typeof spawnAgent;
}

/** A live agent a follow-up turn adopts (its parent's, kept alive: runs/kept-agents.ts). */
export interface WarmAgent {
  /** The run whose agent it was: its dispatch row records the process group until this turn's row does. */
  readonly runId: string;
  readonly child: AgentChild;
  readonly conn: AcpClientConnection;
  readonly sessionId: string;
  readonly configOptions: NewSessionResponse["configOptions"];
}

/** The admitted run one turn drives. */
export interface TurnRun {
  readonly runId: string;
  readonly project: ProjectConfig;
  /** Where the agent works: the project root, or the run's own worktree (design §16). */
  readonly cwd: string;
  /** The parent run's ACP session this run continues (design §17, acp/resume.ts); null: a fresh session. */
  readonly continueSessionId: string | null;
  /** The parent's live agent to prompt again (a warm follow-up), or null: spawn one. */
  readonly warm?: WarmAgent | null;
  readonly agent: AgentConfig;
  /** The run_as pool user the run holds, or null: the Runner's own user. */
  readonly runAs: RunAs | null;
  readonly timeoutSecs: number;
  readonly prompt: string;
  readonly callerConfig: ConfigMap;
  /** The run's event ring: the turn's normalized events enter it in order, as they are made. */
  readonly ring: EventRing;
}

type Settled = { terminal: Terminal } | { error: unknown };

type Aborted = { kind: "aborted" };

/** A setup step's result: the turn ends with `end`, or goes on with `value`. */
type Step<T> = { end: Terminal; value?: undefined } | { end?: undefined; value: T };

class AbortedError extends Error {}

export class AcpTurn {
  readonly #o: TurnOptions;
  readonly #run: Omit<TurnRun, "prompt" | "callerConfig">;
  /** The prompt and caller config, held until the turn ends (a run kept in memory afterwards holds neither). */
  #input: Pick<TurnRun, "prompt" | "callerConfig"> | null;
  #stage: SetupStage = "spawn";
  #dispatched = false;
  /** The turn has returned its Terminal: later updates, permission requests and flushes are ignored. */
  #ended = false;
  /** The Runner is stopping: no barrier is crossed, an aborted setup is recorded as a restart would. */
  #stopping = false;
  #normalizer: EventNormalizer | null = null;
  #pacer: TextPacer | null = null;
  #redactor: Redactor | null = null;
  #conn: AcpClientConnection | null = null;
  #sessionId: string | null = null;
  /** The session's config options as last announced (kept with the agent for a warm follow-up). */
  #configOptions: NewSessionResponse["configOptions"] = null;

  #cancelReason: CancelReason | null = null;
  #setupExpired = false;
  readonly #setupAbort = new AbortController();
  #sessionCancelSent = false;
  /** Resolves when the cancel grace (armed by a cancel or the deadline) has run out. */
  readonly #graceExpired: Promise<void>;
  #expireGrace!: () => void;
  /** The agent's permission requests: each waits, then is answered `cancelled` (acp/permissions.ts). */
  readonly #permissions: PermissionGate;
  readonly #timers = new Set<NodeJS.Timeout>();

  readonly #events = new TurnEventQueue();
  #started = false;
  /** How the turn's steps ended: its Terminal, or what they threw. */
  #settled: Settled | null = null;

  constructor(options: TurnOptions, run: TurnRun) {
    this.#o = options;
    const { prompt, callerConfig, ...rest } = run;
    this.#run = rest;
    this.#input = { prompt, callerConfig };
    this.#graceExpired = new Promise<void>((resolve) => {
      this.#expireGrace = resolve;
    });
    this.#permissions = new PermissionGate({
      runId: run.runId,
      log: options.log,
      timeoutMs: options.acp.permissionTimeoutSecs * 1000,
      state: (state) => this.#tell({ kind: "state", state }),
      ended: () => this.#ended,
    });
  }

  /** The setup stage the turn is in (`prompt` once it reached the barrier). */
  get stage(): SetupStage {
    return this.#stage;
  }

  /** The run's event pipeline once the env is resolved: its ignored-updates count and usage are the run's. */
  get normalizer(): EventNormalizer | null {
    return this.#normalizer;
  }

  /** The run's redactor once its env is resolved (event text, and the stderr tail of its diagnostics). */
  get redactor(): Redactor | null {
    return this.#redactor;
  }

  get refusedPermissions(): number {
    return this.#permissions.refused;
  }

  /** The run's ACP session once it has one, and its config options as last announced (runs/kept-agents.ts). */
  get session(): { sessionId: string; configOptions: NewSessionResponse["configOptions"] } | null {
    return this.#sessionId === null ? null : { sessionId: this.#sessionId, configOptions: this.#configOptions };
  }

  /**
   * Drive the run to its terminal outcome, yielding what the run records as it happens; returns the
   * Terminal. The spawn (and the durable record of the child) happens synchronously in the first `next()`,
   * before anything awaits. Call it once; the turn ends (timers stopped, the last streamed text flushed
   * into the ring) before the Terminal is returned.
   */
  async *events(): AsyncGenerator<TurnEvent, Terminal, undefined> {
    if (this.#started) throw new Error("a turn is driven once");
    this.#started = true;
    void this.#drive().then(
      (terminal) => this.#settle({ terminal }),
      (error: unknown) => this.#settle({ error }),
    );
    yield* this.#events.drain(() => this.#settled !== null);
    const outcome = this.#settled;
    if (outcome === null || "error" in outcome) throw outcome?.error;
    return outcome.terminal;
  }

  /**
   * Cancel the run: idempotent, the first reason sticks, session/cancel is sent at most once. Before the
   * barrier the setup is aborted; after it pending permission requests are answered `cancelled` first, then
   * session/cancel, and the prompt's answer is awaited for cancel_grace_secs.
   */
  cancel(reason: CancelReason): void {
    if (this.#ended || this.#cancelReason !== null) return;
    this.#cancelReason = reason;
    this.#o.log.info({ run_id: this.#run.runId, reason, dispatched: this.#dispatched }, "cancel requested");
    if (!this.#dispatched) {
      this.#setupAbort.abort();
      return;
    }
    this.#permissions.cancel(reason);
    this.#timer(this.#o.acp.cancelGraceSecs * 1000, this.#expireGrace);
    setImmediate(() => {
      const conn = this.#conn;
      if (this.#ended || !conn || this.#sessionId === null || this.#sessionCancelSent) return;
      this.#sessionCancelSent = true;
      void conn.cancel(this.#sessionId);
    });
  }

  /** Abort the setup (nothing is dispatched from now on); a no-op once the barrier is crossed. */
  abortSetup(): void {
    if (!this.#dispatched) this.#setupAbort.abort();
  }

  /** The Runner is stopping: a setup still running is abandoned and ends as a restart would record it. */
  stopping(): void {
    this.#stopping = true;
    this.abortSetup();
  }

  /** The turn's steps: prepare → spawn → initialize → session/new → config → barrier → prompt → settle. */
  async #drive(): Promise<Terminal> {
    const { prompt, callerConfig } = this.#input as Pick<TurnRun, "prompt" | "callerConfig">;
    this.#armSetupDeadline();
    const prepared = this.#prepare(callerConfig);
    if (prepared.end) return prepared.end;

    const warm = this.#run.warm ?? null;
    const spawned = warm === null ? await this.#spawn(prepared.value) : this.#adopt(warm);
    if (spawned.end) return spawned.end;
    const { child, conn } = spawned.value;
    this.#milestone("spawn");

    const initialized = warm === null ? await this.#initialize(conn) : null;
    this.#milestone("initialize");
    if (initialized) return initialized;

    const session =
      warm !== null
        ? this.#warmSession(warm)
        : this.#run.continueSessionId === null
          ? await this.#newSession(conn)
          : await this.#continueSession(conn, this.#run.continueSessionId);
    this.#milestone("session_new");
    if (session.end) return session.end;
    const { sessionId, configOptions } = session.value;
    this.#configOptions = configOptions;
    // Kept so a later run can continue this session (design §17); durable with the barrier's commit.
    this.#o.store.recordAcpSession(this.#run.runId, sessionId);

    const configured = await this.#configure(conn, sessionId, configOptions, callerConfig);
    if (configured) return configured;
    this.#milestone("config");

    const refused = this.#crossBarrier(child, conn);
    if (refused) return refused;
    const response = this.#prompt(conn, sessionId, prompt);
    return this.#settleTurn(response);
  }

  /** Tell the run something it records; `then` runs once it has (or at once when the turn is over). */
  #tell(event: TurnEvent, then?: () => void): void {
    this.#events.tell(event, then);
  }

  #milestone(stage: TimedStage, then?: () => void): void {
    this.#tell({ kind: "milestone", stage, at: performance.now() }, then);
  }

  /** The flow settled: the turn ends (timers, pacer, last flush into the ring), then the generator returns. */
  #settle(outcome: Settled): void {
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    this.#pacer?.stop();
    this.#normalizer?.flush();
    this.#ended = true;
    this.#conn = null;
    this.#input = null;
    this.#settled = outcome;
    this.#events.wake();
  }

  #timer(ms: number, fn: () => void): void {
    const t = setTimeout(() => {
      this.#timers.delete(t);
      fn();
    }, ms);
    this.#timers.add(t);
  }

  /** The setup deadline: past it, a run not yet dispatched has its setup aborted (`setup_timeout`). */
  #armSetupDeadline(): void {
    this.#timer(this.#o.acp.setupTimeoutSecs * 1000, () => {
      if (this.#dispatched || this.#ended) return;
      this.#setupExpired = true;
      this.#setupAbort.abort();
    });
  }

  /**
   * Before spawning: caller config keys that can never work and the env mapping; then the run's redactor
   * and its event pipeline (normalizer → text pacer → the run's ring).
   */
  #prepare(callerConfig: ConfigMap): Step<Record<string, string>> {
    const { agent, cwd, ring } = this.#run;
    const keys = checkCallerKeys(agent.forcedConfig, callerConfig, agent.allowedConfigOptions);
    if (!keys.ok) return { end: notStarted(keys.failureKind, "set_config_option", keys.detail, "fix_input") };
    const env = resolveChildEnv(agent, this.#o.sourceEnv);
    if (!env.ok) return { end: notStarted("missing_env", "spawn", `Missing source variable: ${env.missingSource}.`) };
    if (this.#setupAbort.signal.aborted) return { end: this.#setupAborted() };

    const redactor = Redactor.forAgent(agent, env.env, cwd);
    this.#redactor = redactor;
    // Streamed text enters the ring (and is pushed) at the next setImmediate when the stream is quiet,
    // or after up to COALESCE_MS while a flood is going on (events/text-pacer.ts).
    const pacer = new TextPacer({
      flush: () => {
        if (!this.#ended) normalizer.flushStreamed();
      },
    });
    const normalizer = new EventNormalizer({
      projectRoot: cwd,
      redactor,
      emit: (body) => {
        if (this.#ended) return;
        if (body.kind === "agent_message" || body.kind === "reasoning") pacer.noteFlush();
        ring.push(body);
        this.#tell({ kind: "events" });
      },
      onPending: (delayMs) => pacer.schedule(delayMs),
    });
    this.#normalizer = normalizer;
    this.#pacer = pacer;
    return { value: env.env };
  }

  /**
   * Spawn the agent and open the ACP connection over its stdio. The child's identity is recorded (durably,
   * which also covers the admission) from the spawn's `onStarted`, right after the fork and before anything
   * awaits: the reaper of a restarted Runner can find the group from then on.
   */
  async #spawn(env: Record<string, string>): Promise<Step<{ child: AgentChild; conn: AcpClientConnection }>> {
    const { runId } = this.#run;
    let recordError: unknown = null;
    const record = (pgid: number, startTime: string | null): void => {
      try {
        this.#o.store.markSetup(runId, startTime === null ? null : { pgid, startTime });
      } catch (error) {
        recordError = error;
      }
    };
    let child: AgentChild;
    try {
      child = await (this.#o.spawn ?? spawnAgent)({
        agent: this.#run.agent,
        runAs: this.#run.runAs,
        cwd: this.#run.cwd,
        env,
        onStarted: record,
      });
    } catch (error) {
      const code = error instanceof SpawnError ? error.code : "unknown";
      this.#o.log.warn({ run_id: runId, code }, "agent spawn failed");
      return { end: notStarted("provider_spawn_failed", "spawn") };
    }
    this.#tell({ kind: "spawned", child });
    this.#o.log.info({ run_id: runId, pgid: child.pgid }, "agent spawned");
    if (recordError !== null) {
      this.#o.log.error({ run_id: runId, err_name: (recordError as Error)?.name }, "recording the child failed");
      return { end: notStarted("io_error", "spawn") };
    }
    void child.exited.then((exit) => this.#o.log.info({ run_id: runId, ...exit }, "agent exited"));

    const conn = new AcpClientConnection(
      child,
      this.#hooks(),
      this.#o.maxMessageBytes === undefined ? {} : { maxMessageBytes: this.#o.maxMessageBytes },
    );
    this.#conn = conn;
    this.#tell({ kind: "setup", conn });
    return { value: { child, conn } };
  }

  /** What the agent's requests and updates reach: this turn. */
  #hooks(): ConstructorParameters<typeof AcpClientConnection>[1] {
    return {
      onSessionUpdate: (n) => this.#onSessionUpdate(n),
      onPermissionRequest: (params, signal) => this.#onPermission(params, signal),
      onUnsupportedRequest: (method) =>
        this.#o.log.info({ run_id: this.#run.runId, method: loggableMethod(method) }, "refused agent request"),
    };
  }

  /**
   * A warm follow-up: the parent's kept agent becomes this run's. Its process group is recorded on this run's
   * row first, then cleared from the parent's, so a restart's reaper always finds it; from then on the
   * connection's requests and updates are this turn's.
   */
  #adopt(warm: WarmAgent): Step<{ child: AgentChild; conn: AcpClientConnection }> {
    const { runId } = this.#run;
    const { child, conn } = warm;
    this.#tell({ kind: "spawned", child });
    this.#conn = conn;
    conn.rebind(this.#hooks());
    this.#tell({ kind: "setup", conn });
    try {
      this.#o.store.markSetup(
        runId,
        child.startTime === null ? null : { pgid: child.pgid, startTime: child.startTime },
      );
    } catch (error) {
      this.#o.log.error({ run_id: runId, err_name: (error as Error)?.name }, "recording the child failed");
      return { end: notStarted("io_error", "spawn") };
    }
    try {
      this.#o.store.clearChild(warm.runId);
    } catch (error) {
      // The parent's row still names the group: a restart's reaper checks its start time, nothing is lost.
      this.#o.log.warn(
        { run_id: warm.runId, err_name: (error as Error)?.name },
        "clearing the kept agent's old row failed",
      );
    }
    this.#o.log.info({ run_id: runId, pgid: child.pgid, parent_run_id: warm.runId }, "kept agent adopted");
    return { value: { child, conn } };
  }

  /** A warm follow-up's session: the parent's, still open in the agent (no session/resume or session/load). */
  #warmSession(warm: WarmAgent): Step<{ sessionId: string; configOptions: NewSessionResponse["configOptions"] }> {
    this.#stage = "session_new";
    this.#sessionId = warm.sessionId;
    return { value: { sessionId: warm.sessionId, configOptions: warm.configOptions } };
  }

  /** `initialize`: the agent must speak ACP version 1. Null: go on. */
  async #initialize(conn: AcpClientConnection): Promise<Terminal | null> {
    this.#stage = "initialize";
    const init = await this.#setupStep(conn.initialize());
    if (init.kind !== "ok") return this.#setupFailure(init);
    if (init.value.protocolVersion !== 1) {
      this.#o.log.warn(
        { run_id: this.#run.runId, protocol_version: Number(init.value.protocolVersion) },
        "bad ACP version",
      );
      return notStarted("unsupported_protocol_version", "initialize");
    }
    return null;
  }

  /** `session/new` in the run's cwd (the project root, or its worktree): the session id (kept by the turn) and the live config options. */
  async #newSession(
    conn: AcpClientConnection,
  ): Promise<Step<{ sessionId: string; configOptions: NewSessionResponse["configOptions"] }>> {
    this.#stage = "session_new";
    const session = await this.#setupStep(conn.newSession(this.#run.cwd));
    if (session.kind !== "ok") return { end: this.#setupFailure(session) };
    if (typeof session.value?.sessionId !== "string") return { end: notStarted("protocol_violation", "session_new") };
    this.#sessionId = session.value.sessionId;
    return { value: { sessionId: session.value.sessionId, configOptions: session.value.configOptions } };
  }

  /** Continuation (design §17): the parent run's ACP session taken up in place of `session/new` (acp/resume.ts). */
  async #continueSession(
    conn: AcpClientConnection,
    parentSessionId: string,
  ): Promise<Step<{ sessionId: string; configOptions: NewSessionResponse["configOptions"] }>> {
    this.#stage = "session_new";
    const session = await continueSession(conn, parentSessionId, this.#run.cwd, {
      step: (request) => this.#setupStep(request),
      failure: (outcome) => this.#setupFailure(outcome),
      unsupported: () => notStarted("provider_rejected", "session_new", CONTINUATION_UNSUPPORTED_DETAIL),
    });
    if (session.end) return { end: session.end };
    this.#sessionId = session.value.sessionId;
    return { value: session.value };
  }

  /** Config sequencing (acp/config-sequencing.ts); its redacted snapshot is recorded as the effective config. */
  async #configure(
    conn: AcpClientConnection,
    sessionId: string,
    initial: NewSessionResponse["configOptions"],
    callerConfig: ConfigMap,
  ): Promise<Terminal | null> {
    this.#stage = "set_config_option";
    const { agent } = this.#run;
    const redactor = this.#redactor as Redactor;
    let sequenced: Awaited<ReturnType<typeof sequenceConfig>>;
    try {
      sequenced = await sequenceConfig({
        forced: agent.forcedConfig,
        caller: callerConfig,
        allowed: agent.allowedConfigOptions,
        initial,
        redact: (text) => redactor.redact(text),
        set: async (id, value) => {
          const outcome = await this.#setupStep(conn.setConfigOption(sessionId, id, value));
          if (outcome.kind === "aborted") throw new AbortedError();
          if (outcome.kind === "rpc_error") this.#logRejected(outcome.code);
          return outcome;
        },
      });
    } catch (error) {
      if (error instanceof AbortedError) return this.#setupAborted();
      throw error;
    }
    if (!sequenced.ok) {
      if (sequenced.failureKind === "fault") return this.#setupFailure(sequenced.outcome);
      return notStarted(sequenced.failureKind, "set_config_option", sequenced.detail, "fix_input");
    }
    this.#configOptions = [...sequenced.live];
    this.#tell({ kind: "configured", effective: sequenced.effective });
    this.#o.store.recordEffectiveConfig(this.#run.runId, sequenced.effective);
    return null;
  }

  /**
   * The barrier: the durable commit of phase dispatch_barrier (store.markDispatchBarrier), after which the
   * run may have started. Refused (a not-started Terminal) when the setup was aborted, the Runner is
   * stopping, or the agent is already gone. Null: crossed, and the prompt must follow with nothing between
   * that may fail silently.
   */
  #crossBarrier(child: AgentChild, conn: AcpClientConnection): Terminal | null {
    if (this.#setupAbort.signal.aborted) return this.#setupAborted();
    if (this.#stopping) return notStarted("runner_restarted", this.#stage);
    // An agent already gone (exited, stdout closed, transport down) cannot receive a prompt: the run
    // never started, and crossing the barrier would turn that into "lost".
    const gone =
      child.exit !== null ? "provider_exited" : conn.stdoutEnded ? "stdout_closed" : conn.closed ? "io_error" : null;
    if (gone !== null) return notStarted(gone, "prompt");
    this.#stage = "prompt";
    this.#o.failpoint("before_barrier");
    try {
      this.#o.store.markDispatchBarrier(this.#run.runId);
      this.#milestone("barrier_commit");
    } catch (error) {
      this.#o.log.error({ run_id: this.#run.runId, err_name: (error as Error)?.name }, "dispatch barrier failed");
      return notStarted("io_error", "prompt");
    }
    this.#dispatched = true;
    this.#tell({ kind: "dispatched" });
    return null;
  }

  /** Write the prompt (the run deadline bounds the turn from here; setup had its own). Its correlated answer. */
  #prompt(conn: AcpClientConnection, sessionId: string, prompt: string): Promise<RequestOutcome<PromptResponse>> {
    this.#timer(this.#run.timeoutSecs * 1000, () => this.cancel("deadline"));
    this.#o.failpoint("after_barrier_before_prompt");
    // Read before the prompt is sent: this prompt's write (a kept agent's connection has had earlier ones).
    const written = conn.promptWritten;
    const response = conn.prompt(sessionId, prompt);
    void written.then(() => this.#milestone("prompt_write", () => this.#o.failpoint("after_prompt_write")));
    return response;
  }

  /** The prompt's answer, or the end of the cancel grace without one: the run's Terminal (acp/terminal.ts). */
  async #settleTurn(response: Promise<RequestOutcome<PromptResponse>>): Promise<Terminal> {
    const answered = await Promise.race([response, this.#graceExpired.then(() => ({ kind: "grace" as const }))]);
    if (answered.kind === "rpc_error") {
      this.#o.log.info({ run_id: this.#run.runId, rpc_code: answered.code }, "prompt answered with an error");
    }
    return promptTerminal(answered, {
      cancelReason: this.#cancelReason,
      permissionAnswered: this.#permissions.answered,
    });
  }

  /** Race a setup request against the setup deadline and cancellation. */
  async #setupStep<T>(request: Promise<RequestOutcome<T>>): Promise<RequestOutcome<T> | Aborted> {
    const signal = this.#setupAbort.signal;
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

  #setupFailure(outcome: Exclude<RequestOutcome<unknown>, { kind: "ok" }> | Aborted): Terminal {
    switch (outcome.kind) {
      case "aborted":
        return this.#setupAborted();
      case "rpc_error":
        this.#logRejected(outcome.code);
        return notStarted("provider_rejected", this.#stage);
      case "fault":
        return notStarted(outcome.fault, this.#stage);
    }
  }

  /** A setup request the agent answered with a JSON-RPC error: the code stays in the local log (acp/terminal.ts). */
  #logRejected(rpcCode: number): void {
    this.#o.log.info({ run_id: this.#run.runId, stage: this.#stage, rpc_code: rpcCode }, "setup request rejected");
  }

  /** The setup was aborted: by its deadline, by the Runner stopping, or by a cancel (the run deadline is armed only at dispatch). */
  #setupAborted(): Terminal {
    if (this.#setupExpired) return notStarted("setup_timeout", this.#stage);
    // The Runner is stopping: recorded as a restart would record it (store/recovery.ts).
    if (this.#cancelReason === null && this.#stopping) return notStarted("runner_restarted", this.#stage);
    return cancelledBeforeDispatch(this.#stage);
  }

  #onSessionUpdate(notification: SessionNotification): void {
    const normalizer = this.#normalizer;
    if (!normalizer || this.#ended) return;
    if (this.#sessionId === null || notification.sessionId !== this.#sessionId) {
      normalizer.ignore();
      return;
    }
    normalizer.handle(notification.update);
    this.#tell({ kind: "events" });
  }

  /** A permission request of this run's session after the barrier waits at the gate; any other is refused. */
  #onPermission(params: RequestPermissionRequest, signal: AbortSignal): Promise<RequestPermissionResponse> {
    const normalizer = this.#normalizer;
    if (!normalizer || this.#ended || !this.#dispatched || params.sessionId !== this.#sessionId) {
      return Promise.resolve({ outcome: { outcome: "cancelled" } });
    }
    return this.#permissions.answer(params, signal, normalizer, this.#cancelReason);
  }
}
