/**
 * What of the Runner's own secrets other local users — and agents — could
 * reach (design §4.2). The Runner creates its state dir 0700; the operator
 * keeps the config and the token file 0600. `credentialModeWarnings` names
 * each of them that is group- or other-accessible (the daemon logs them at
 * start, `check` prints them); `sameUserAgents` names the agents that run as
 * the Runner's own user and so can read all of it whatever the modes, and a
 * Runner with such agents starts only with the operator's explicit
 * `[acp] agents_share_runner_user = true` (`sharedUserRefusal`).
 */
import { statSync } from "node:fs";
import type { AgentConfig, RunnerConfig } from "./config.js";

export interface ModeWarning {
  /** The config key naming the file ("runner.state_dir", "config file", "server.token_file"). */
  readonly setting: string;
  readonly path: string;
  /** Permission bits, octal (e.g. "0755"). */
  readonly mode: string;
  /** The mode it should have ("0700" for the state dir, "0600" for files). */
  readonly want: string;
}

/** Files of the Runner that are readable (or writable) by group or other users. Missing files are skipped. */
export function credentialModeWarnings(config: RunnerConfig): ModeWarning[] {
  const candidates: { setting: string; path: string; want: string }[] = [
    { setting: "runner.state_dir", path: config.runner.stateDir, want: "0700" },
    { setting: "config file", path: config.file, want: "0600" },
  ];
  if (config.server?.tokenFile) {
    candidates.push({ setting: "server.token_file", path: config.server.tokenFile, want: "0600" });
  }
  const out: ModeWarning[] = [];
  for (const { setting, path, want } of candidates) {
    let mode: number;
    try {
      mode = statSync(path).mode & 0o777;
    } catch {
      continue; // not there (yet): the state dir is created 0700, a missing token is reported elsewhere
    }
    if ((mode & 0o077) !== 0) out.push({ setting, path, mode: `0${mode.toString(8)}`, want });
  }
  return out;
}

/**
 * Whether `agent` runs as the Runner's own user: it has no `run_as` (the config refuses a pool that names the
 * Runner's uid, config/run-as.ts, so this is the whole question). The one place that decides it: the start-up
 * refusal, `check`, `hello` and the persisted resume secret ask here.
 */
export function sharesRunnerUser(agent: AgentConfig): boolean {
  return agent.runAs === null;
}

/** Ids of the agents that run as this process's user (sharesRunnerUser). */
export function sameUserAgents(config: RunnerConfig): string[] {
  return config.acp.agents.filter(sharesRunnerUser).map((a) => a.id);
}

/** What an agent that runs as the Runner's user can do; stated at start (log) and by `check` under the opt-in. */
export const SAME_USER_CONSEQUENCE =
  "can read this Runner's credentials (its environment, config and token file) and stop it, then take over " +
  "its link to the Server with the token and receive the runs meant for this Runner";

/**
 * The start-up refusal (`run` and `check`) of a config whose agents would run as the Runner's own user
 * without `[acp] agents_share_runner_user = true`, or null when it may start.
 */
export function sharedUserRefusal(config: RunnerConfig, uid: number | undefined = process.getuid?.()): string | null {
  const agents = sameUserAgents(config);
  if (agents.length === 0 || config.acp.agentsShareRunnerUser) return null;
  return (
    `${config.file}: acp.agents_share_runner_user: agent${agents.length === 1 ? "" : "s"} ${agents.join(", ")} ` +
    `would run as this Runner's own OS user (uid ${uid ?? "?"}), so such an agent ${SAME_USER_CONSEQUENCE}. ` +
    `Either set run_as (an unprivileged user that is not the Runner's) on ${agents.length === 1 ? "it" : "each of them"}, or, ` +
    "for a single-tenant install whose every caller may see every run, opt in with " +
    "[acp] agents_share_runner_user = true"
  );
}

/** What `[acp] sandbox = "none"` gives up, said at start and by `check` when any agent has run_as. */
export const UNSANDBOXED_CONSEQUENCE =
  "run_as agents share the machine's /tmp, /var/tmp, /dev/shm and System V IPC, and may rewrite a project's git config and hooks: what one caller's run plants there reaches other callers' runs";

/** Whether run_as agents run without the per-run sandbox (the operator's `[acp] sandbox = "none"`). */
export function unsandboxedRunAs(cfg: RunnerConfig): boolean {
  return cfg.acp.sandbox === "none" && cfg.acp.agents.some((a) => a.runAs !== null);
}
