/**
 * `webcodex-runner exec`: one turn, locally, never touching the daemon's state dir; exits like the
 * `webcodex` CLI (`execExitCode`).
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  base32,
  ConfigMap,
  MAX_PROMPT_BYTES,
  MAX_RUN_TIMEOUT_SECS,
  RUN_ID_PREFIX,
  type RunEvent,
  type RunSummary,
  utf8Length,
} from "@webcodex/protocol";
import { ConfigError } from "../config/config.js";
import { LOG_LEVELS } from "../config/schema.js";
import { createLogger } from "../logger.js";
import { sandboxRefusal } from "../process/sandbox.js";
import { flag, type Parsed, requireConfig, UsageError } from "./argv.js";

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

/**
 * Runs one turn locally with a throwaway store in a temp dir and prints its events (a line each, or JSON
 * with --json). Ctrl-C requests a cancel; a second kills the agent and exits 130.
 */
export async function exec(parsed: Parsed): Promise<number> {
  const cfg = await requireConfig(parsed);
  const unsandboxable = sandboxRefusal(cfg);
  if (unsandboxable !== null) throw new ConfigError([unsandboxable]);
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

  const [{ openDispatchStore, storeInUse }, { RunManager }, { worktreesDir }] = await Promise.all([
    import("../store/open.js"),
    import("../runs/manager.js"),
    import("../workspace/worktree.js"),
  ]);
  // The run_as pool users belong to one Runner process (process/user-pool.ts): exec's own pool would sweep them
  // at start and kill the daemon's runs, and could lease a user the daemon has leased.
  const pooled = cfg.acp.agents.filter((a) => a.runAs !== null).map((a) => a.id);
  if (pooled.length > 0 && storeInUse(cfg.runner.stateDir)) {
    process.stderr.write(
      `webcodex-runner: exec: agent${pooled.length === 1 ? "" : "s"} ${pooled.join(", ")} run${pooled.length === 1 ? "s" : ""} ` +
        `under run_as pool users that the Runner daemon on ${cfg.runner.stateDir} is serving; exec would kill that ` +
        "daemon's runs. Stop the daemon first, or start the run through the Server; nothing was started.\n",
    );
    return 2;
  }
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
    workspacesDir: worktreesDir(stateDir),
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
    return execExitCode(done?.state, done?.failure_kind);
  } finally {
    process.off("SIGINT", onSigint);
    await manager.close();
    rmSync(stateDir, { recursive: true, force: true });
  }
}

/** `exec`'s exit code for the run's final state, as the `webcodex` CLI exits (4: the permission deadline, 5: the run's). */
export function execExitCode(
  state: RunSummary["state"] | undefined,
  failureKind?: RunSummary["failure_kind"] | undefined,
): number {
  if (state === "cancelled" && failureKind === "permission_timeout") return 4;
  if (state === "cancelled" && failureKind === "run_timeout") return 5;
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
