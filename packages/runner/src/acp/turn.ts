/**
 * One ACP prompt turn (design §4.3) for an admitted run:
 *
 *   env/spawn ─▶ initialize ─▶ session/new ─▶ config sequencing
 *     ─▶ BARRIER (store.markDispatchBarrier, durable) ─▶ session/prompt
 *     ─▶ updates, permission requests … correlated response
 *
 * It returns the run's Terminal; recording it, the projection and the tree
 * cleanup are the run manager's. Before the barrier every failure is
 * failed/not_started naming the stage; after it only a correlated answer,
 * or lost. Terminal messages are fixed texts (runs/terminal.ts); provider text
 * never reaches run state. Cancellation and "unknown outcome" are results,
 * not exceptions.
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
import type { RunnerConfig } from "../config/config.js";
import { EventNormalizer } from "../events/normalize.js";
import { Redactor } from "../events/redactor.js";
import { TextPacer } from "../events/text-pacer.js";
import type { FailpointName } from "../failpoints.js";
import type { Logger } from "../logger.js";
import { type AgentChild, resolveChildEnv, SpawnError, spawnAgent } from "../process/spawn.js";
import type { Run } from "../runs/record.js";
import type { RunStartRequest } from "../runs/service.js";
import {
  type CancelReason,
  cancelledBeforeDispatch,
  notStarted,
  type PermissionAnswer,
  promptTerminal,
  type Terminal,
} from "../runs/terminal.js";
import type { TimedStage } from "../runs/timings.js";
import type { DispatchStore } from "../store/types.js";
import { checkCallerKeys, sequenceConfig } from "./config-sequencing.js";
import { CONTINUATION_UNSUPPORTED_DETAIL, continueSession } from "./resume.js";
import { AcpClientConnection, loggableMethod, type RequestOutcome } from "./session.js";

/**
 * Permission requests a run may have waiting at once. Each holds a waiter, a
 * timer, a ring event and a log line; beyond this bound a request is answered
 * `cancelled` at once, with no event, and only counted (ignored_updates).
 */
export const MAX_PENDING_PERMISSIONS = 16;

/** What a turn needs from the run manager. */
export interface TurnDeps {
  acp: RunnerConfig["acp"];
  store: DispatchStore;
  log: Logger;
  /** Source of env_from_env values, read at each spawn. */
  sourceEnv: NodeJS.ProcessEnv;
  maxMessageBytes: number | undefined;
  failpoint: (name: FailpointName) => void;
  /** True once the manager is shutting down. */
  closing: () => boolean;
  /** The run's state changed: stamp updated_at and push soon. */
  touch: (run: Run) => void;
  /** New events are in the run's ring: push soon. */
  schedulePush: (run: Run) => void;
  requestCancel: (run: Run, reason: CancelReason) => void;
  /** Spawn seam (default spawnAgent); tests hand in a child made of streams. */
  spawn?: typeof spawnAgent;
}

type Aborted = { kind: "aborted" };

/** A setup step's result: the turn ends with `end`, or goes on with `value`. */
type Step<T> = { end: Terminal; value?: undefined } | { end?: undefined; value: T };

class AbortedError extends Error {}

export class AcpTurn {
  readonly #d: TurnDeps;

  constructor(deps: TurnDeps) {
    this.#d = deps;
  }

  /**
   * Drive one admitted run to its terminal outcome, step by step: prepare (caller keys, env, the event
   * pipeline) → spawn → initialize → session/new → config → barrier → prompt → settle. Each setup step
   * either ends the turn with a not-started Terminal or hands on to the next. `milestone` is told when each
   * setup stage is done (the run-timings line listens; the turn does not time anything itself).
   */
  async turn(
    run: Run,
    prompt: string,
    callerConfig: RunStartRequest["config"],
    milestone: (stage: TimedStage) => void = () => {},
  ): Promise<Terminal> {
    this.#armSetupDeadline(run);
    const prepared = this.#prepare(run, callerConfig);
    if (prepared.end) return prepared.end;
    const { env, redactor } = prepared.value;

    const spawned = await this.#spawn(run, env);
    if (spawned.end) return spawned.end;
    const { child, conn } = spawned.value;
    milestone("spawn");

    const initialized = await this.#initialize(run, conn);
    milestone("initialize");
    if (initialized) return initialized;

    run.stage = "session_new";
    const session =
      run.continueSessionId === null
        ? await this.#newSession(run, conn)
        : await continueSession(conn, run.continueSessionId, run.project.root, {
            step: (request) => this.#setupStep(run, request),
            failure: (outcome) => this.#setupFailure(run, outcome),
            unsupported: () => notStarted("provider_rejected", "session_new", CONTINUATION_UNSUPPORTED_DETAIL),
          });
    milestone("session_new");
    if (session.end) return session.end;
    const { sessionId, configOptions } = session.value;
    run.sessionId = sessionId;
    this.#d.store.recordAcpSession(run.run_id, sessionId);

    const configured = await this.#configure(run, conn, sessionId, configOptions, callerConfig, redactor);
    if (configured) return configured;
    milestone("config");

    const refused = this.#crossBarrier(run, child, conn, milestone);
    if (refused) return refused;
    const response = this.#prompt(run, conn, sessionId, prompt, milestone);
    return this.#settle(run, response);
  }

  /** The setup deadline: past it, a run not yet dispatched has its setup aborted (`setup_timeout`). */
  #armSetupDeadline(run: Run): void {
    run.timer(this.#d.acp.setupTimeoutSecs * 1000, () => {
      if (run.dispatched || run.terminal) return;
      run.setupExpired = true;
      run.setupAbort.abort();
    });
  }

  /**
   * Before spawning: caller config keys that can never work and the env mapping; then the run's redactor
   * and its event pipeline (normalizer → text pacer → ring).
   */
  #prepare(
    run: Run,
    callerConfig: RunStartRequest["config"],
  ): Step<{ env: Record<string, string>; redactor: Redactor }> {
    const keys = checkCallerKeys(run.agent.forcedConfig, callerConfig, run.agent.allowedConfigOptions);
    if (!keys.ok) return { end: notStarted(keys.failureKind, "set_config_option", keys.detail, "fix_input") };
    const env = resolveChildEnv(run.agent, this.#d.sourceEnv);
    if (!env.ok) return { end: notStarted("missing_env", "spawn", `Missing source variable: ${env.missingSource}.`) };
    if (run.setupAbort.signal.aborted) return { end: this.setupAborted(run) };

    const redactor = Redactor.forAgent(run.agent, env.env, run.project.root);
    run.redactor = redactor;
    // Streamed text enters the ring (and is pushed) at the next setImmediate when the stream is quiet,
    // or after up to COALESCE_MS while a flood is going on (events/text-pacer.ts).
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
        this.#d.schedulePush(run);
      },
      onPending: (delayMs) => pacer.schedule(delayMs),
    });
    run.normalizer = normalizer;
    run.textPacer = pacer;
    return { value: { env: env.env, redactor } };
  }

  /**
   * Spawn the agent and open the ACP connection over its stdio. The child's identity is recorded (durably,
   * which also covers the admission) from the spawn's `onStarted`, right after the fork and before anything
   * awaits: the reaper of a restarted Runner can find the group from then on.
   */
  async #spawn(run: Run, env: Record<string, string>): Promise<Step<{ child: AgentChild; conn: AcpClientConnection }>> {
    let recordError: unknown = null;
    const record = (pgid: number, startTime: string | null): void => {
      try {
        this.#d.store.markSetup(run.run_id, startTime === null ? null : { pgid, startTime });
      } catch (error) {
        recordError = error;
      }
    };
    let child: AgentChild;
    try {
      child = await (this.#d.spawn ?? spawnAgent)({
        agent: run.agent,
        runAs: run.runAs,
        cwd: run.project.root,
        env,
        onStarted: record,
      });
    } catch (error) {
      const code = error instanceof SpawnError ? error.code : "unknown";
      this.#d.log.warn({ run_id: run.run_id, code }, "agent spawn failed");
      return { end: notStarted("provider_spawn_failed", "spawn") };
    }
    run.child = child;
    this.#d.log.info({ run_id: run.run_id, pgid: child.pgid }, "agent spawned");
    if (recordError !== null) {
      this.#d.log.error({ run_id: run.run_id, err_name: (recordError as Error)?.name }, "recording the child failed");
      return { end: notStarted("io_error", "spawn") };
    }
    run.phase = "setup";
    this.#d.touch(run);
    void child.exited.then((exit) => this.#d.log.info({ run_id: run.run_id, ...exit }, "agent exited"));

    const conn = new AcpClientConnection(
      child,
      {
        onSessionUpdate: (n) => this.#onSessionUpdate(run, n),
        onPermissionRequest: (params, signal) => this.#onPermission(run, params, signal),
        onUnsupportedRequest: (method) =>
          this.#d.log.info({ run_id: run.run_id, method: loggableMethod(method) }, "refused agent request"),
      },
      this.#d.maxMessageBytes === undefined ? {} : { maxMessageBytes: this.#d.maxMessageBytes },
    );
    run.conn = conn;
    return { value: { child, conn } };
  }

  /** `initialize`: the agent must speak ACP version 1. Null: go on. */
  async #initialize(run: Run, conn: AcpClientConnection): Promise<Terminal | null> {
    run.stage = "initialize";
    const init = await this.#setupStep(run, conn.initialize());
    if (init.kind !== "ok") return this.#setupFailure(run, init);
    if (init.value.protocolVersion !== 1) {
      this.#d.log.warn({ run_id: run.run_id, protocol_version: Number(init.value.protocolVersion) }, "bad ACP version");
      return notStarted("unsupported_protocol_version", "initialize");
    }
    return null;
  }

  /** `session/new` in the project root: the session id (kept on the run) and the live config options. */
  async #newSession(
    run: Run,
    conn: AcpClientConnection,
  ): Promise<Step<{ sessionId: string; configOptions: NewSessionResponse["configOptions"] }>> {
    run.stage = "session_new";
    const session = await this.#setupStep(run, conn.newSession(run.project.root));
    if (session.kind !== "ok") return { end: this.#setupFailure(run, session) };
    if (typeof session.value?.sessionId !== "string") return { end: notStarted("protocol_violation", "session_new") };
    run.sessionId = session.value.sessionId;
    return { value: { sessionId: session.value.sessionId, configOptions: session.value.configOptions } };
  }

  /** Config sequencing (acp/config-sequencing.ts); its redacted snapshot is recorded as the effective config. */
  async #configure(
    run: Run,
    conn: AcpClientConnection,
    sessionId: string,
    initial: NewSessionResponse["configOptions"],
    callerConfig: RunStartRequest["config"],
    redactor: Redactor,
  ): Promise<Terminal | null> {
    run.stage = "set_config_option";
    let sequenced: Awaited<ReturnType<typeof sequenceConfig>>;
    try {
      sequenced = await sequenceConfig({
        forced: run.agent.forcedConfig,
        caller: callerConfig,
        allowed: run.agent.allowedConfigOptions,
        initial,
        redact: (text) => redactor.redact(text),
        set: async (id, value) => {
          const outcome = await this.#setupStep(run, conn.setConfigOption(sessionId, id, value));
          if (outcome.kind === "aborted") throw new AbortedError();
          if (outcome.kind === "rpc_error") this.#logRejected(run, outcome.code);
          return outcome;
        },
      });
    } catch (error) {
      if (error instanceof AbortedError) return this.setupAborted(run);
      throw error;
    }
    if (!sequenced.ok) {
      if (sequenced.failureKind === "fault") return this.#setupFailure(run, sequenced.outcome);
      return notStarted(sequenced.failureKind, "set_config_option", sequenced.detail, "fix_input");
    }
    run.effective_config = sequenced.effective;
    this.#d.store.recordEffectiveConfig(run.run_id, sequenced.effective);
    return null;
  }

  /**
   * The barrier: the durable commit of phase dispatch_barrier (store.markDispatchBarrier), after which the
   * run may have started. Refused (a not-started Terminal) when the setup was aborted, the Runner is
   * closing, or the agent is already gone. Null: crossed, and the prompt must follow with nothing between
   * that may fail silently.
   */
  #crossBarrier(
    run: Run,
    child: AgentChild,
    conn: AcpClientConnection,
    milestone: (stage: TimedStage) => void,
  ): Terminal | null {
    if (run.setupAbort.signal.aborted) return this.setupAborted(run);
    if (this.#d.closing()) return notStarted("runner_restarted", run.stage);
    // An agent already gone (exited, stdout closed, transport down) cannot receive a prompt: the run
    // never started, and crossing the barrier would turn that into "lost".
    const gone =
      child.exit !== null ? "provider_exited" : conn.stdoutEnded ? "stdout_closed" : conn.closed ? "io_error" : null;
    if (gone !== null) return notStarted(gone, "prompt");
    run.stage = "prompt";
    this.#d.failpoint("before_barrier");
    try {
      this.#d.store.markDispatchBarrier(run.run_id);
      milestone("barrier_commit");
    } catch (error) {
      this.#d.log.error({ run_id: run.run_id, err_name: (error as Error)?.name }, "dispatch barrier failed");
      return notStarted("io_error", "prompt");
    }
    run.phase = "dispatch_barrier";
    run.state = "running";
    run.execution_state = "started";
    run.recovery_kind = "wait";
    this.#d.touch(run);
    return null;
  }

  /** Write the prompt (the run deadline bounds the turn from here; setup had its own). Its correlated answer. */
  #prompt(
    run: Run,
    conn: AcpClientConnection,
    sessionId: string,
    prompt: string,
    milestone: (stage: TimedStage) => void,
  ): Promise<RequestOutcome<PromptResponse>> {
    run.timer(run.timeoutSecs * 1000, () => this.#d.requestCancel(run, "deadline"));
    this.#d.failpoint("after_barrier_before_prompt");
    const response = conn.prompt(sessionId, prompt);
    void conn.promptWritten.then(() => {
      milestone("prompt_write");
      this.#d.failpoint("after_prompt_write");
    });
    return response;
  }

  /** The prompt's answer, or the end of the cancel grace without one: the run's Terminal (runs/terminal.ts). */
  async #settle(run: Run, response: Promise<RequestOutcome<PromptResponse>>): Promise<Terminal> {
    const answered = await Promise.race([response, run.graceExpired.then(() => ({ kind: "grace" as const }))]);
    if (answered.kind === "rpc_error") {
      this.#d.log.info({ run_id: run.run_id, rpc_code: answered.code }, "prompt answered with an error");
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
        return this.setupAborted(run);
      case "rpc_error":
        this.#logRejected(run, outcome.code);
        return notStarted("provider_rejected", run.stage);
      case "fault":
        return notStarted(outcome.fault, run.stage);
    }
  }

  /** A setup request the agent answered with a JSON-RPC error: the code stays in the local log (runs/terminal.ts). */
  #logRejected(run: Run, rpcCode: number): void {
    this.#d.log.info({ run_id: run.run_id, stage: run.stage, rpc_code: rpcCode }, "setup request rejected");
  }

  /** The setup was aborted: by its deadline, by close(), or by a cancel (the run deadline is armed only at dispatch). */
  setupAborted(run: Run): Terminal {
    if (run.setupExpired) return notStarted("setup_timeout", run.stage);
    // close() aborted the setup: recorded as a restart would record it (store/recovery.ts).
    if (run.cancelReason === null && this.#d.closing()) return notStarted("runner_restarted", run.stage);
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
    this.#d.schedulePush(run);
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
        this.#d.log.warn(
          { run_id: run.run_id, pending: run.pendingPermissions },
          "too many pending permission requests",
        );
      }
      normalizer.ignore();
      return cancelled;
    }
    normalizer.permissionRequest(params);
    run.pendingPermissions++;
    run.state = "waiting_permission";
    this.#d.touch(run);
    this.#d.log.info({ run_id: run.run_id }, "permission requested");

    const why = await new Promise<PermissionAnswer | "closed">((resolve) => {
      const timer = setTimeout(() => finish("permission_deadline"), this.#d.acp.permissionTimeoutSecs * 1000);
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
      this.#d.touch(run);
    }
    this.#d.log.info({ run_id: run.run_id, answered: "cancelled", because: why }, "permission answered");
    return cancelled;
  }
}
