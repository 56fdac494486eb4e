/**
 * The Runner daemon's start-up order (design §4.4), one step after another,
 * nothing accepting work until the last one:
 *
 *   1. load and validate the config                       (exit 2 on error; also when agents would run as
 *                                                          the Runner's user without agents_share_runner_user)
 *   2. open and verify the dispatch store + marker        (exit 3 on refusal)
 *   3. recover rows left by a previous process            (failed/not_started, lost/outcome_unknown)
 *   4. reap surviving agent process groups of those rows  (start-time checked)
 *   5. prune old terminal rows (retention; again every RETENTION_INTERVAL_MS while up)
 *   6. build the run manager (new agent_instance_id, new provider instances) and
 *      wait for its sweep of the run_as pool users (process/user-pool.ts: leftovers of
 *      an earlier Runner's runs are killed, bounded by SWEEP_TIMEOUT_MS)
 *   7. connect to the Server (link/link.ts); `run` requires [server] and a token (checked first, exit 2).
 *      With no agent under the Runner's user, the link's resume secret is kept in the state dir
 *      (link/resume.ts), so a restart after a crash takes the link back at once
 *
 * SIGINT/SIGTERM: close the run manager while the link still carries updates
 * (stop accepting; abandon runs still in setup; send session/cancel to every
 * dispatched run and wait up to cancel_grace_secs for its correlated answer —
 * cancelled, else lost — then kill every child tree), then stop the link,
 * close the store, exit 0. A second signal exits at once with 130/143.
 */
import { readFileSync } from "node:fs";
import { isAvailable, sessionUpdateValidators } from "../acp/session-update-validator.js";
import type { RunnerConfig } from "../config/config.js";
import { ConfigError, loadConfig } from "../config/config.js";
import {
  credentialModeWarnings,
  SAME_USER_CONSEQUENCE,
  sameUserAgents,
  sharedUserRefusal,
  UNSANDBOXED_CONSEQUENCE,
  unsandboxedRunAs,
} from "../config/exposure.js";
import { activeFailpoint, FAILPOINT_ENV, invalidFailpointValue } from "../failpoints.js";
import { type LinkHandle, startLink } from "../link/link.js";
import { removeResumeSecret, resumeSecretStore } from "../link/resume.js";
import { createLogger, type Logger } from "../logger.js";
import { poolHomeRefusals } from "../process/pool-homes.js";
import { procIdentitySupported } from "../process/proc-identity.js";
import { type ReapResult, reapAll } from "../process/reaper.js";
import { sandboxRefusal } from "../process/sandbox.js";
import { BindingsFileError, FilePoolBindings } from "../process/user-bindings.js";
import { diagnosticsDir, removeDiagnostics } from "../runs/diagnostics.js";
import { RunManager } from "../runs/manager.js";
import { FileProjectCallers, ProjectCallersFileError } from "../runs/project-callers.js";
import type { RunService } from "../runs/service.js";
import type { SqliteDispatchStore } from "../store/dispatch-store.js";
import { openDispatchStore, STORE_REFUSAL_EXIT_CODE, StoreRefusedError } from "../store/open.js";
import { type RecoveredRun, recoverStore } from "../store/recovery.js";

export interface StartDaemonOptions {
  configPath: string;
  /** Operator flag --new-store: move the old store aside and start a new store_id. */
  newStore: boolean;
  logger?: Logger;
  /** Install SIGINT/SIGTERM handlers and exit the process when stopped (default true). */
  handleSignals?: boolean;
  /** On a start-up refusal, print the operator message and exit with its code (default true); else throw. */
  exitOnFatal?: boolean;
}

export interface DaemonHandle {
  readonly storeId: string;
  readonly agentInstanceId: string;
  readonly service: RunService;
  readonly recovered: readonly RecoveredRun[];
  readonly reaped: readonly ReapResult[];
  /** Graceful stop (idempotent). */
  stop(reason?: string): Promise<void>;
  /** Resolves once the daemon stopped. */
  readonly closed: Promise<void>;
}

/** Start-up failure with an exit code: 2 config, 3 store refusal, 1 anything else. */
export class DaemonStartError extends Error {
  override readonly name = "DaemonStartError";
  constructor(
    readonly exitCode: number,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

interface Retention {
  retainDays: number;
  retainMax: number;
}

/** How often retention runs while the Runner is up (it also runs at start-up). */
export const RETENTION_INTERVAL_MS = 60 * 60 * 1000;

/**
 * Prune terminal rows every `intervalMs` (unref'd: never keeps the process
 * alive). A failing prune is logged and retried at the next tick. Returns the stop function.
 */
export function scheduleRetention(
  store: Pick<SqliteDispatchStore, "prune">,
  retention: Retention,
  logger: Logger,
  intervalMs: number = RETENTION_INTERVAL_MS,
  diagnostics?: string,
): () => void {
  const timer = setInterval(() => {
    try {
      pruneOnce(store, retention, logger, diagnostics);
    } catch (error) {
      logger.error({ err_name: (error as Error)?.name }, "periodic retention failed");
    }
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}

/** One retention pass: prune rows (tombstones stay), then the diagnostics files of the pruned runs. */
function pruneOnce(
  store: Pick<SqliteDispatchStore, "prune">,
  retention: Retention,
  logger: Logger,
  diagnostics: string | undefined,
): void {
  const pruned = store.prune(retention);
  if (diagnostics !== undefined) removeDiagnostics(diagnostics, pruned.runIds);
  if (pruned.byAge + pruned.byCount > 0) {
    logger.info({ byAge: pruned.byAge, byCount: pruned.byCount }, "pruned terminal runs");
  }
}

/** Retention settings from `[runner]` retain_terminal_days / retain_terminal_max. */
export function retentionOf(config: RunnerConfig): Retention {
  return { retainDays: config.runner.retainTerminalDays, retainMax: config.runner.retainTerminalMax };
}

async function readToken(config: RunnerConfig): Promise<string | null> {
  const server = config.server;
  if (!server) return null;
  if (server.tokenEnv) {
    const value = process.env[server.tokenEnv];
    if (value) return value;
  }
  if (server.tokenFile) {
    const { readFile } = await import("node:fs/promises");
    try {
      const text = (await readFile(server.tokenFile, "utf8")).trim();
      if (text) return text;
    } catch {
      // reported below without the path's content
    }
  }
  return null;
}

function defaultLogger(config: RunnerConfig): Logger {
  return createLogger(config.runner.logLevel);
}

/**
 * Open the store, recover, reap and prune — the part of start-up that runs
 * before any work is accepted. Exported for tests and for `check`.
 */
export async function prepareStore(options: {
  stateDir: string;
  newStore: boolean;
  retention: Retention;
  logger: Logger;
}): Promise<{ store: SqliteDispatchStore; recovered: RecoveredRun[]; reaped: ReapResult[] }> {
  const { logger } = options;
  const opened = openDispatchStore({ stateDir: options.stateDir, newStore: options.newStore });
  const { store } = opened;
  try {
    if (opened.movedAside.length > 0) {
      logger.warn({ moved_aside: opened.movedAside, store_id: store.storeId }, "--new-store: old store moved aside");
    }
    logger.info({ store_id: store.storeId, created: opened.created }, "dispatch store open");

    const recovered = recoverStore(store);
    for (const run of recovered) {
      logger.warn({ run_id: run.run_id, from_phase: run.from_phase, state: run.state }, "recovered run");
    }

    const targets = store
      .listWithChild()
      .filter((row) => row.child_pgid !== null && row.child_start_time !== null)
      .map((row) => ({ run_id: row.run_id, pgid: row.child_pgid!, startTime: row.child_start_time! }));
    let reaped: ReapResult[] = [];
    if (targets.length > 0) {
      if (!procIdentitySupported()) {
        logger.warn({ groups: targets.length }, "cannot verify process identity on this platform; not reaping");
      } else {
        reaped = await reapAll(targets, { logger });
      }
    }
    for (const result of reaped) {
      if (result.outcome !== "survived") store.clearChild(result.run_id);
    }

    pruneOnce(store, options.retention, logger, diagnosticsDir(options.stateDir));
    return { store, recovered, reaped };
  } catch (error) {
    store.close();
    throw error;
  }
}

/** The project bindings of the state dir, read now: an untrustworthy file stops the start (exit 3). */
function loadedProjectCallers(stateDir: string): FileProjectCallers {
  const callers = new FileProjectCallers(stateDir);
  callers.load();
  return callers;
}

/** Turn any start-up failure into a DaemonStartError with its exit code. */
function toStartError(error: unknown): DaemonStartError {
  if (error instanceof DaemonStartError) return error;
  if (error instanceof StoreRefusedError) return new DaemonStartError(error.exitCode, error.message, { cause: error });
  if (error instanceof ConfigError) return new DaemonStartError(error.exitCode, error.message, { cause: error });
  if (error instanceof BindingsFileError) {
    return new DaemonStartError(
      STORE_REFUSAL_EXIT_CODE,
      `${error.message}. It says which caller each run_as user serves; the Runner does not guess. Clean every ` +
        "pool user's home and temp files, then remove the file, or restore it from a backup",
      { cause: error },
    );
  }
  if (error instanceof ProjectCallersFileError) {
    return new DaemonStartError(
      STORE_REFUSAL_EXIT_CODE,
      `${error.message}. It says which caller each project serves; the Runner does not guess. Check each ` +
        "project's tree, then remove the file, or restore it from a backup",
      { cause: error },
    );
  }
  const message = error instanceof Error ? error.message : String(error);
  return new DaemonStartError(1, `the Runner failed to start: ${message}`, { cause: error });
}

export async function startDaemon(options: StartDaemonOptions): Promise<DaemonHandle> {
  const exitOnFatal = options.exitOnFatal ?? true;
  let logger = options.logger ?? null;
  try {
    return await start(options, (l) => {
      logger = l;
    });
  } catch (error) {
    const startError = toStartError(error);
    if (!exitOnFatal) throw startError;
    logger?.fatal({ exit_code: startError.exitCode }, "the Runner refused to start");
    process.stderr.write(`webcodex-runner: ${startError.message}\n`);
    process.exit(startError.exitCode);
  }
}

async function start(options: StartDaemonOptions, setLogger: (l: Logger) => void): Promise<DaemonHandle> {
  const config = await loadConfig(options.configPath);
  const logger = options.logger ?? defaultLogger(config);
  setLogger(logger);

  for (const w of credentialModeWarnings(config)) {
    logger.warn(
      { setting: w.setting, mode: w.mode, want: w.want },
      "a Runner credential file is accessible to other users; chmod it",
    );
  }
  const refusal = sharedUserRefusal(config) ?? sandboxRefusal(config);
  if (refusal !== null) throw new DaemonStartError(2, refusal);
  // Pool users' HOMEs and the projects' group access (process/pool-homes.ts): the same words as `check`.
  const homes = poolHomeRefusals(config);
  if (homes.length > 0) throw new DaemonStartError(2, homes.map((h) => `${config.file}: ${h}`).join("\n"));
  const sameUser = sameUserAgents(config);
  if (sameUser.length > 0) {
    logger.warn(
      { agents: sameUser },
      `agents_share_runner_user = true: these agents run as the Runner's own user, and each ${SAME_USER_CONSEQUENCE}; ` +
        "set run_as on them unless every caller of this Runner may see every run",
    );
  }

  if (unsandboxedRunAs(config)) logger.warn(`[acp] sandbox = "none": ${UNSANDBOXED_CONSEQUENCE}`);

  const armed = activeFailpoint();
  if (armed) logger.warn({ failpoint: armed }, `${FAILPOINT_ENV} is set: this Runner will SIGKILL itself there`);
  const invalid = invalidFailpointValue();
  if (invalid) logger.warn({ value_length: invalid.length }, `${FAILPOINT_ENV} names no failpoint; ignored`);
  const validators = await sessionUpdateValidators;
  if (!isAvailable(validators)) {
    logger.warn(
      { reason: validators.reason },
      "session/update validators unavailable (build with `npm run build`): every update takes the ACP SDK's slower path",
    );
  }

  // `run` needs a Server to work for; check it before touching the store.
  const server = config.server;
  if (!server) {
    throw new DaemonStartError(
      2,
      `${config.file}: server: \`run\` needs a [server] table (url, token_env or token_file)`,
    );
  }
  const token = await readToken(config);
  if (token === null) {
    throw new DaemonStartError(
      2,
      `${config.file}: server: no Runner token found (set the variable named by server.token_env or the file named by server.token_file)`,
    );
  }

  const { store, recovered, reaped } = await prepareStore({
    stateDir: config.runner.stateDir,
    newStore: options.newStore,
    retention: retentionOf(config),
    logger,
  });

  // The resume secret outlives a crash only where no agent can read the state dir (link/resume.ts).
  if (sameUser.length > 0) removeResumeSecret(config.runner.stateDir);

  let service: RunService;
  try {
    const manager = new RunManager({
      config,
      store,
      logger,
      diagnosticsDir: diagnosticsDir(config.runner.stateDir),
      poolBindings: new FilePoolBindings(config.runner.stateDir),
      projectCallers: loadedProjectCallers(config.runner.stateDir),
    });
    await manager.usersReady;
    // Before any run is admitted: changes a previous process left unrecorded, leftover worktrees (workspace/).
    await manager.recoverWorkspaces();
    service = manager;
  } catch (error) {
    store.close();
    throw error;
  }

  const stopRetention = scheduleRetention(
    store,
    retentionOf(config),
    logger,
    RETENTION_INTERVAL_MS,
    diagnosticsDir(config.runner.stateDir),
  );

  let link: LinkHandle;
  try {
    link = startLink({
      url: server.url,
      token,
      service,
      logger,
      agentsShareRunnerUser: sameUser.length > 0,
      ...(sameUser.length === 0 ? { resumeStore: resumeSecretStore(config.runner.stateDir, logger) } : {}),
      allowInsecureTransport: server.allowInsecureTransport,
      ...(server.caFile ? { ca: readFileSync(server.caFile, "utf8") } : {}),
    });
  } catch (error) {
    stopRetention();
    await service.close();
    store.close();
    throw error;
  }
  logger.info(
    {
      store_id: service.storeId,
      agent_instance_id: service.agentInstanceId,
      recovered: recovered.length,
      reaped: reaped.filter((r) => r.outcome === "reaped").length,
    },
    "runner started",
  );

  let stopping: Promise<void> | undefined;
  let resolveClosed: () => void = () => {};
  const closed = new Promise<void>((resolve) => {
    resolveClosed = resolve;
  });
  const stop = (reason = "stop"): Promise<void> => {
    stopping ??= (async () => {
      logger.info({ reason }, "runner stopping");
      stopRetention();
      try {
        // Runs first, while the link still carries their terminal states to the Server.
        await service.close();
      } finally {
        try {
          await link.close();
        } catch (error) {
          logger.warn({ err_name: (error as Error)?.name }, "closing the Server link failed");
        }
        store.close();
        logger.info("runner stopped");
        resolveClosed();
      }
    })();
    return stopping;
  };

  if (options.handleSignals ?? true) {
    let signals = 0;
    const onSignal = (signal: NodeJS.Signals) => {
      signals++;
      if (signals > 1) process.exit(signal === "SIGINT" ? 130 : 143);
      stop(signal).then(
        () => process.exit(0),
        (error: unknown) => {
          logger.error({ err_name: (error as Error)?.name }, "graceful stop failed");
          process.exit(1);
        },
      );
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
  }

  return {
    storeId: store.storeId,
    agentInstanceId: service.agentInstanceId,
    service,
    recovered,
    reaped,
    stop,
    closed,
  };
}
