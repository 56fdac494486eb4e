/**
 * `webcodex-runner check`: validates the config, refuses what `run` refuses, prints the projects, agents
 * and warnings; with `--probe PROVIDER` probes that agent (commands/probe.ts) and prints its verdict
 * (commands/probe-verdict.ts). Exit 1 when the probe fails or the forced config cannot hold.
 */
import type { InitializeResponse } from "@agentclientprotocol/sdk";
import { terminalSafe } from "@webcodex/protocol";
import { ConfigError } from "../config/config.js";
import {
  credentialModeWarnings,
  SAME_USER_CONSEQUENCE,
  sameUserAgents,
  sharedUserRefusal,
  UNSANDBOXED_CONSEQUENCE,
  unsandboxedRunAs,
} from "../config/exposure.js";
import { poolHomeRefusals } from "../process/pool-homes.js";
import { sandboxRefusal } from "../process/sandbox.js";
import { flag, type Parsed, requireConfig, UsageError } from "./argv.js";

function writeInitialize(out: { write: (text: string) => void }, init: InitializeResponse): void {
  const info = init.agentInfo;
  out.write(
    `  agent: ${info ? `${info.name} ${info.version}${info.title ? ` (${info.title})` : ""}` : "(no agentInfo)"}\n`,
  );
  out.write(`  protocol version: ${init.protocolVersion}\n`);
  out.write(`  capabilities: ${JSON.stringify(init.agentCapabilities ?? {})}\n`);
  out.write(`  auth methods: ${(init.authMethods ?? []).map((m) => m.id).join(", ") || "(none)"}\n`);
}

export async function check(parsed: Parsed): Promise<number> {
  const cfg = await requireConfig(parsed);
  // `run` refuses this config: so does `check`, with the same words.
  const refusal = sharedUserRefusal(cfg);
  if (refusal !== null) throw new ConfigError([refusal]);
  const unsandboxable = sandboxRefusal(cfg);
  if (unsandboxable !== null) throw new ConfigError([unsandboxable]);
  const homes = poolHomeRefusals(cfg);
  if (homes.length > 0) throw new ConfigError(homes.map((h) => `${cfg.file}: ${h}`));
  // The probe prints what the agent said about itself (names, versions, option ids): terminal-safe.
  const out = { write: (text: string) => process.stdout.write(terminalSafe(text)) };
  out.write(
    `config OK: ${cfg.file}\n  projects: ${cfg.projects.map((p) => `${p.id}${p.allowPatch ? "" : " (read-only)"}${p.workspace === "worktree" ? " (a worktree per run)" : ""}`).join(", ")}\n  agents: ${cfg.acp.agents.map((a) => `${a.id}${a.runAs ? ` (as ${a.runAs.users.map((u) => u.user).join(", ")})` : ""}`).join(", ")}\n  state_dir: ${cfg.runner.stateDir}\n  server: ${cfg.server ? cfg.server.url : "(none: exec/check only)"}\n`,
  );
  for (const id of sameUserAgents(cfg)) {
    out.write(
      `warning: agent ${id} runs as this Runner's user (uid ${process.getuid?.()}; agents_share_runner_user = true): it ${SAME_USER_CONSEQUENCE}\n`,
    );
  }
  if (cfg.acp.agents.some((a) => a.runAs !== null) && cfg.acp.sandbox === "namespaces") {
    out.write(
      "  sandbox: namespaces (each run_as agent: its own /tmp, /var/tmp, /dev/shm and IPC; .git config read-only)\n",
    );
  }
  if (unsandboxedRunAs(cfg)) out.write(`warning: [acp] sandbox = "none": ${UNSANDBOXED_CONSEQUENCE}\n`);
  for (const a of cfg.acp.agents) {
    const size = a.runAs?.users.length ?? cfg.acp.maxConcurrentRuns;
    if (size >= cfg.acp.maxConcurrentRuns) continue;
    out.write(
      `note: agent ${a.id} runs at most ${size} run${size === 1 ? "" : "s"} at once (one per run_as user; acp.max_concurrent_runs is ${cfg.acp.maxConcurrentRuns})\n`,
    );
  }
  if (!cfg.acp.singleTenant && cfg.acp.homeTemplate === null && cfg.acp.agents.some((a) => a.runAs !== null)) {
    out.write(
      `note: a run_as pool user its caller leaves unused for ${cfg.acp.bindingIdleDays} days (acp.binding_idle_days) may be recycled for another caller with an empty HOME; set acp.home_template to a directory with what agents need there (their logins)\n`,
    );
  }
  for (const w of credentialModeWarnings(cfg)) {
    out.write(
      `warning: ${w.setting} ${w.path} has mode ${w.mode}: other users can read it; chmod ${w.want.slice(1)} it\n`,
    );
  }
  // An unset source fails every run of the agent with missing_env: say so now, by name (never a value).
  for (const a of cfg.acp.agents) {
    for (const [child, source] of Object.entries(a.envFromEnv)) {
      if (process.env[source] !== undefined) continue;
      out.write(
        `warning: agent ${a.id}: env_from_env ${child} = "${source}": ${source} is not set in this environment; its runs fail missing_env until the Runner starts with it set\n`,
      );
    }
  }
  const providerId = flag(parsed, "--probe");
  if (providerId === undefined) return 0;
  const agent = cfg.acp.agents.find((a) => a.id === providerId);
  if (!agent) throw new UsageError(`--probe: no agent with id ${JSON.stringify(providerId)} in the config`);
  const projectId = flag(parsed, "--project");
  const project = projectId === undefined ? cfg.projects[0] : cfg.projects.find((p) => p.id === projectId);
  if (!project) throw new UsageError(`--project: no project with id ${JSON.stringify(projectId)} in the config`);

  const { probeAgent } = await import("./probe.js");
  out.write(
    `probe ${agent.id}: ${agent.executable} (cwd ${project.root}, env ${Object.keys(agent.envFromEnv).join(", ") || "(empty)"})\n`,
  );
  const result = await probeAgent({ agent, project, timeoutSecs: cfg.acp.setupTimeoutSecs });
  if (!result.ok) {
    // Past initialize, what the agent advertised still helps (its auth methods, above all).
    if (result.initialize !== undefined) writeInitialize(out, result.initialize);
    process.stderr.write(terminalSafe(`probe ${agent.id} failed at ${result.stage}: ${result.reason}\n`));
    return 1;
  }
  const { initialize: init, session } = result;
  writeInitialize(out, init);
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
  const { formatVerdict, probeVerdict } = await import("./probe-verdict.js");
  out.write(formatVerdict(probeVerdict({ agent, initialize: init, session, forced: result.forced })));
  return result.forced.ok ? 0 : 1;
}
