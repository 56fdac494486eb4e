/**
 * `webcodex-runner` command line.
 *
 *   webcodex-runner run   --config FILE [--new-store]
 *   webcodex-runner check --config FILE [--probe PROVIDER] [--project ID]
 *   webcodex-runner exec  --config FILE --project ID --provider ID [--json]
 *                         [--config KEY=VALUE]... [--timeout SECS] "prompt"
 *
 * Exit codes: 0 success, 1 failure, 2 invalid config or usage, 3 store
 * refused (run). `exec` exits like the CLI (`execExitCode`): 0 completed,
 * 1 failed, 3 lost, 130 cancelled (and on a second Ctrl-C).
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  base32,
  CONFIG_ID_PATTERN,
  ConfigMap,
  MAX_PROMPT_BYTES,
  MAX_RUN_TIMEOUT_SECS,
  RUN_ID_PATTERN,
  RUN_ID_PREFIX,
  type RunEvent,
  type RunSummary,
  terminalSafe,
  utf8Length,
} from "@webcodex/protocol";
import { ConfigError, loadConfig, type RunnerConfig } from "./config/config.js";
import { credentialModeWarnings, SAME_USER_CONSEQUENCE, sameUserAgents, sharedUserRefusal } from "./config/exposure.js";
import { LOG_LEVELS } from "./config/schema.js";
import { createLogger } from "./logger.js";
import { reserveAgentFdTable } from "./process/fd-table.js";
import { closeInheritedFds } from "./process/inherited-fds.js";
import { diagnosticsDir, readDiagnostics } from "./runs/diagnostics.js";

const USAGE = `usage:
  webcodex-runner run   --config FILE [--new-store]
  webcodex-runner check --config FILE [--probe PROVIDER] [--project ID]
  webcodex-runner exec  --config FILE --project ID --provider ID [--json] [--config KEY=VALUE]... [--timeout SECS] [--log-level LEVEL] "prompt"
  webcodex-runner diagnose --config FILE RUN_ID`;

class UsageError extends Error {}

interface Parsed {
  command: string;
  configFile: string | null;
  options: Record<string, string | boolean>;
  flags: Map<string, string | true>;
  positional: string[];
}

const VALUE_FLAGS = new Set(["--config", "-c", "--probe", "--project", "--provider", "--timeout", "--log-level"]);
const BOOL_FLAGS = new Set(["--new-store", "--json", "--help", "-h"]);
const OPTION_ARG = /^([A-Za-z0-9][A-Za-z0-9_.:/-]{0,127})=(.*)$/s;

/** `--config` is both the file and, in KEY=VALUE form, a caller config option (as `-c KEY=VALUE`). */
function parseArgv(argv: readonly string[]): Parsed {
  const [command = "", ...rest] = argv;
  const parsed: Parsed = { command, configFile: null, options: {}, flags: new Map(), positional: [] };
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i] as string;
    if (arg === "--") {
      parsed.positional.push(...rest.slice(i + 1));
      break;
    }
    const eq = arg.startsWith("--") ? arg.indexOf("=") : -1;
    const name = eq > 0 ? arg.slice(0, eq) : arg;
    if (BOOL_FLAGS.has(name)) {
      parsed.flags.set(name, true);
    } else if (VALUE_FLAGS.has(name)) {
      const value = eq > 0 ? arg.slice(eq + 1) : rest[++i];
      if (value === undefined) throw new UsageError(`${name} needs a value`);
      const option = OPTION_ARG.exec(value);
      if ((name === "--config" || name === "-c") && option) {
        const key = option[1] as string;
        const raw = option[2] as string;
        if (!CONFIG_ID_PATTERN.test(key)) throw new UsageError(`config option id ${JSON.stringify(key)} is not valid`);
        parsed.options[key] = raw === "true" ? true : raw === "false" ? false : raw;
      } else if (name === "--config") {
        if (parsed.configFile !== null) throw new UsageError("--config FILE given twice");
        parsed.configFile = value;
      } else {
        parsed.flags.set(name, value);
      }
    } else if (arg.startsWith("-") && arg !== "-") {
      throw new UsageError(`unknown option ${arg}`);
    } else {
      parsed.positional.push(arg);
    }
  }
  return parsed;
}

function flag(parsed: Parsed, name: string): string | undefined {
  const v = parsed.flags.get(name);
  return typeof v === "string" ? v : undefined;
}

async function config(parsed: Parsed): Promise<RunnerConfig> {
  if (parsed.configFile === null) throw new UsageError("--config FILE is required");
  return loadConfig(parsed.configFile);
}

// ---- diagnose ---------------------------------------------------------------------

/** Print a run's Runner-local diagnostics: state, stage, timings, exit and the redacted agent stderr tail. */
async function diagnose(parsed: Parsed): Promise<number> {
  const cfg = await config(parsed);
  if (parsed.positional.length !== 1) throw new UsageError("diagnose needs exactly one RUN_ID argument");
  const runId = parsed.positional[0] as string;
  if (!RUN_ID_PATTERN.test(runId))
    throw new UsageError("RUN_ID must be wc_agent_run_ followed by 26 base32 characters");
  const dir = diagnosticsDir(cfg.runner.stateDir);
  const d = readDiagnostics(dir, runId);
  if (!d) {
    process.stderr.write(`webcodex-runner: no diagnostics for ${runId} in ${dir} (never run here, or pruned)
`);
    return 1;
  }
  const t = d.timings_ms;
  const lines = [
    `run ${d.run_id}`,
    `  state: ${d.state} / ${d.execution_state}${d.failure_kind ? ` (${d.failure_kind})` : ""}${d.stop_reason ? ` stop_reason ${d.stop_reason}` : ""}`,
    `  stage: ${d.stage}`,
    `  message: ${d.message ?? "-"}`,
    `  timings (ms): spawn ${t.spawn}, initialize ${t.initialize}, session_new ${t.session_new}, config ${t.config}, barrier_commit ${t.barrier_commit}, prompt_write ${t.prompt_write}`,
    `  agent exit: ${d.exit_signal ? `signal ${d.exit_signal}` : `code ${d.exit_code ?? "-"}`}`,
    `  agent stderr: ${d.stderr_bytes} bytes, last ${Buffer.byteLength(d.stderr_tail, "utf8")} shown (redacted)`,
    "---- stderr tail ----",
    d.stderr_tail,
  ];
  // The stderr tail is the agent's own text: terminal-safe before it reaches a terminal.
  process.stdout.write(terminalSafe(`${lines.join("\n")}\n`));
  return 0;
}

// ---- check ------------------------------------------------------------------------

async function check(parsed: Parsed): Promise<number> {
  const cfg = await config(parsed);
  // `run` refuses this config: so does `check`, with the same words.
  const refusal = sharedUserRefusal(cfg);
  if (refusal !== null) throw new ConfigError([refusal]);
  // The probe prints what the agent said about itself (names, versions, option ids): terminal-safe.
  const out = { write: (text: string) => process.stdout.write(terminalSafe(text)) };
  out.write(
    `config OK: ${cfg.file}\n  projects: ${cfg.projects.map((p) => `${p.id}${p.allowPatch ? "" : " (read-only)"}`).join(", ")}\n  agents: ${cfg.acp.agents.map((a) => `${a.id}${a.runAs ? ` (as ${a.runAs.users.map((u) => u.user).join(", ")})` : ""}`).join(", ")}\n  state_dir: ${cfg.runner.stateDir}\n  server: ${cfg.server ? cfg.server.url : "(none: exec/check only)"}\n`,
  );
  for (const id of sameUserAgents(cfg)) {
    out.write(
      `warning: agent ${id} runs as this Runner's user (uid ${process.getuid?.()}; agents_share_runner_user = true): it ${SAME_USER_CONSEQUENCE}\n`,
    );
  }
  for (const a of cfg.acp.agents) {
    const size = a.runAs?.users.length ?? cfg.acp.maxConcurrentRuns;
    if (size >= cfg.acp.maxConcurrentRuns) continue;
    out.write(
      `note: agent ${a.id} runs at most ${size} run${size === 1 ? "" : "s"} at once (one per run_as user; acp.max_concurrent_runs is ${cfg.acp.maxConcurrentRuns})\n`,
    );
  }
  for (const w of credentialModeWarnings(cfg)) {
    out.write(
      `warning: ${w.setting} ${w.path} has mode ${w.mode}: other users can read it; chmod ${w.want.slice(1)} it\n`,
    );
  }
  const providerId = flag(parsed, "--probe");
  if (providerId === undefined) return 0;
  const agent = cfg.acp.agents.find((a) => a.id === providerId);
  if (!agent) throw new UsageError(`--probe: no agent with id ${JSON.stringify(providerId)} in the config`);
  const projectId = flag(parsed, "--project");
  const project = projectId === undefined ? cfg.projects[0] : cfg.projects.find((p) => p.id === projectId);
  if (!project) throw new UsageError(`--project: no project with id ${JSON.stringify(projectId)} in the config`);

  const { probeAgent } = await import("./commands/probe.js");
  out.write(
    `probe ${agent.id}: ${agent.executable} (cwd ${project.root}, env ${Object.keys(agent.envFromEnv).join(", ") || "(empty)"})\n`,
  );
  const result = await probeAgent({ agent, project, timeoutSecs: cfg.acp.setupTimeoutSecs });
  if (!result.ok) {
    process.stderr.write(terminalSafe(`probe ${agent.id} failed at ${result.stage}: ${result.reason}\n`));
    return 1;
  }
  const { initialize: init, session } = result;
  const info = init.agentInfo;
  out.write(
    `  agent: ${info ? `${info.name} ${info.version}${info.title ? ` (${info.title})` : ""}` : "(no agentInfo)"}\n`,
  );
  out.write(`  protocol version: ${init.protocolVersion}\n`);
  out.write(`  capabilities: ${JSON.stringify(init.agentCapabilities ?? {})}\n`);
  out.write(`  auth methods: ${(init.authMethods ?? []).map((m) => m.id).join(", ") || "(none)"}\n`);
  const options = session.configOptions ?? [];
  out.write(`  config options:${options.length === 0 ? " (none)" : ""}\n`);
  for (const option of options) {
    const values =
      option.type === "select"
        ? option.options.flatMap((o) => ("group" in o ? o.options.map((g) => g.value) : [o.value]))
        : ["true", "false"];
    const allowed = agent.allowedConfigOptions.includes(option.id)
      ? " [allowed]"
      : Object.hasOwn(agent.forcedConfig, option.id)
        ? " [forced]"
        : "";
    out.write(`    ${option.id} (${option.type}) = ${String(option.currentValue)}  {${values.join(", ")}}${allowed}\n`);
  }
  if (session.modes) {
    out.write(
      `  modes: ${session.modes.availableModes.map((m) => m.id).join(", ")} (current ${session.modes.currentModeId})\n`,
    );
  }
  const forcedKeys = Object.keys(agent.forcedConfig);
  out.write(`  forced config:${forcedKeys.length === 0 ? " (none)" : ""}\n`);
  for (const key of forcedKeys) {
    const source = agent.ownForcedKeys.includes(key) ? "agent" : "[acp.forced_config]";
    out.write(`    ${key} = ${JSON.stringify(agent.forcedConfig[key])}  (${source})\n`);
  }
  if (forcedKeys.length > 0) {
    out.write(
      result.forced.ok
        ? "    applied and verified on the live session, as a run would\n"
        : `    NOT satisfiable: ${result.forced.detail}\n`,
    );
  }
  const { formatVerdict, probeVerdict } = await import("./commands/probe-verdict.js");
  out.write(formatVerdict(probeVerdict({ agent, initialize: init, session, forced: result.forced })));
  return result.forced.ok ? 0 : 1;
}

// ---- exec -------------------------------------------------------------------------

function formatEvent(e: RunEvent): string {
  const head = `[${e.seq}] ${e.kind}`;
  switch (e.kind) {
    case "agent_message":
    case "reasoning":
      return `${head}: ${e.text}${e.truncated ? " …(truncated)" : ""}`;
    case "plan":
      return `${head}:\n${e.entries.map((p) => `    [${p.status}] (${p.priority}) ${p.content}`).join("\n")}`;
    case "tool_activity":
      return `${head}: ${e.tool_kind} "${e.title}" ${e.status} (${e.tool_call_id})`;
    case "file_change":
      return `${head}: ${e.path} (${e.tool_call_id})`;
    case "terminal_activity":
      return `${head}: terminal ${e.terminal_id} (${e.tool_call_id})`;
    case "usage":
      return `${head}: ${e.used_tokens ?? "?"} / ${e.context_size ?? "?"} tokens${e.cost_amount === null ? "" : `, ${e.cost_amount} ${e.cost_currency ?? ""}`}`;
    case "permission_request":
      return `${head}: "${e.title}" (${e.tool_call_id}) options ${e.options.map((o) => o.kind).join(", ")} — never allowed; answered cancelled on deadline or cancel`;
    case "agent_state":
      return `${head}: ${describeAgentState(e)}`;
    case "terminal":
      return `${head}: ${e.state} / ${e.execution_state}${e.stop_reason ? ` (${e.stop_reason})` : ""}${e.failure_kind ? ` [${e.failure_kind}]` : ""} — ${e.message}`;
  }
}

/** One line for an agent_state event: `mode plan`, `config mode=acceptEdits model=opus`, … */
function describeAgentState(e: Extract<RunEvent, { kind: "agent_state" }>): string {
  const more = e.truncated ? " …" : "";
  switch (e.change) {
    case "mode":
      return `mode ${e.mode_id ?? "?"}`;
    case "config_options":
      return `config ${(e.config_options ?? []).map((o) => `${o.id}=${String(o.value)}`).join(" ")}${more}`;
    case "commands":
      return `${(e.commands ?? []).length} commands available${more}`;
    case "session_info":
      return `session title ${e.title === null || e.title === undefined ? "(cleared)" : JSON.stringify(e.title)}`;
  }
}

async function exec(parsed: Parsed): Promise<number> {
  const cfg = await config(parsed);
  const projectId = flag(parsed, "--project");
  const providerId = flag(parsed, "--provider");
  if (!projectId || !providerId) throw new UsageError("exec needs --project ID and --provider ID");
  if (parsed.positional.length !== 1) throw new UsageError('exec needs exactly one "prompt" argument');
  const prompt = parsed.positional[0] as string;
  if (prompt === "" || utf8Length(prompt) > MAX_PROMPT_BYTES) {
    throw new UsageError(`the prompt must be 1..${MAX_PROMPT_BYTES} bytes`);
  }
  const callerConfig = ConfigMap.safeParse(parsed.options);
  if (!callerConfig.success) throw new UsageError("invalid --config KEY=VALUE options");
  const timeoutRaw = flag(parsed, "--timeout");
  const timeout = timeoutRaw === undefined ? null : Number(timeoutRaw);
  if (timeout !== null && (!Number.isInteger(timeout) || timeout < 1 || timeout > MAX_RUN_TIMEOUT_SECS)) {
    throw new UsageError(`--timeout must be an integer 1..${MAX_RUN_TIMEOUT_SECS}`);
  }
  const json = parsed.flags.has("--json");

  const [{ openDispatchStore }, { RunManager }] = await Promise.all([
    import("./store/open.js"),
    import("./runs/manager.js"),
  ]);
  // A throwaway store: exec never touches the daemon's state dir.
  const stateDir = mkdtempSync(join(tmpdir(), "webcodex-exec-"));
  // exec is interactive: the run log is quiet unless asked for (--log-level info|debug|…).
  const logLevel = flag(parsed, "--log-level") ?? (cfg.runner.logLevel === "info" ? "warn" : cfg.runner.logLevel);
  if (!(LOG_LEVELS as readonly string[]).includes(logLevel))
    throw new UsageError(`--log-level must be one of ${LOG_LEVELS.join(", ")}`);
  const manager = new RunManager({
    config: cfg,
    store: openDispatchStore({ stateDir }).store,
    logger: createLogger(logLevel),
  });
  const runId = `${RUN_ID_PREFIX}${base32(randomBytes(20)).slice(0, 26)}`;
  const note = (text: string) => {
    if (!json) process.stderr.write(`${text}\n`);
  };

  let final: RunSummary | null = null;
  manager.onUpdate((run, events) => {
    if (run.run_id !== runId) return;
    for (const event of events) process.stdout.write(`${json ? JSON.stringify(event) : formatEvent(event)}\n`);
    if (run.phase === "terminal") final = run;
  });

  let interrupts = 0;
  const onSigint = () => {
    interrupts++;
    if (interrupts === 1) {
      note("cancel requested (Ctrl-C again to kill the agent and exit)");
      void manager.cancel(runId);
    } else {
      void manager.close().finally(() => process.exit(130));
    }
  };
  process.on("SIGINT", onSigint);

  try {
    const started = await manager.start({
      run_id: runId,
      intent_fingerprint: createHash("sha256")
        .update(JSON.stringify([projectId, providerId, prompt, callerConfig.data, timeout]))
        .digest("hex"),
      project_id: projectId,
      provider_id: providerId,
      agent_instance_id: manager.agentInstanceId,
      provider_instance_id: manager.providerInstanceId(providerId) ?? "unknown_provider__",
      prompt,
      config: callerConfig.data,
      timeout_secs: timeout,
    });
    if (!started.ok) {
      process.stderr.write(`webcodex-runner: run rejected: ${started.code}: ${started.message}\n`);
      return started.code === "unknown_project" || started.code === "unknown_provider" ? 2 : 1;
    }
    note(`run ${runId} started (${projectId} / ${providerId})`);
    await manager.whenSettled(runId);
    final ??= manager.sync(runId, 0, 0)?.run ?? null;
    const done = final as RunSummary | null;
    return execExitCode(done?.state);
  } finally {
    process.off("SIGINT", onSigint);
    await manager.close();
    rmSync(stateDir, { recursive: true, force: true });
  }
}

// ---- run --------------------------------------------------------------------------

async function run(parsed: Parsed): Promise<number> {
  if (parsed.configFile === null) throw new UsageError("--config FILE is required");
  const { startDaemon } = await import("./commands/daemon.js");
  const handle = await startDaemon({ configPath: parsed.configFile, newStore: parsed.flags.has("--new-store") });
  await handle.closed;
  return 0;
}

/** `exec`'s exit code for the run's final state, as the `webcodex` CLI exits. */
export function execExitCode(state: RunSummary["state"] | undefined): number {
  switch (state) {
    case "completed":
      return 0;
    case "lost":
      return 3;
    case "cancelled":
      return 130;
    default:
      return 1;
  }
}

async function main(argv: readonly string[]): Promise<number> {
  let parsed: Parsed;
  try {
    parsed = parseArgv(argv);
    if (parsed.flags.has("--help") || parsed.flags.has("-h") || parsed.command === "") {
      process.stdout.write(`${USAGE}\n`);
      return parsed.command === "" ? 2 : 0;
    }
    switch (parsed.command) {
      case "run":
        return await run(parsed);
      case "check":
        return await check(parsed);
      case "exec":
        return await exec(parsed);
      case "diagnose":
        return await diagnose(parsed);
      default:
        throw new UsageError(`unknown command ${JSON.stringify(parsed.command)}`);
    }
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`webcodex-runner: ${error.message}\n`);
      return error.exitCode;
    }
    if (error instanceof UsageError) {
      process.stderr.write(`webcodex-runner: ${error.message}\n${USAGE}\n`);
      return 2;
    }
    throw error;
  }
}

// Descriptors inherited without close-on-exec would reach every agent: close them first (process/inherited-fds.ts).
closeInheritedFds();
// Then size every agent's descriptor table before the first spawn (process/fd-table.ts).
reserveAgentFdTable();

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    process.stderr.write(`webcodex-runner: unexpected error: ${error instanceof Error ? error.name : "unknown"}\n`);
    process.exitCode = 1;
  },
);
