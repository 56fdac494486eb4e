/**
 * What of the Runner's own secrets other local users — and agents — could
 * reach (DESIGN §4.2). The Runner creates its state dir 0700; the operator
 * keeps the config and the token file 0600. `credentialModeWarnings` names
 * each of them that is group- or other-accessible (the daemon logs them at
 * start, `check` prints them); `sameUserAgents` names the agents that run as
 * the Runner's own user and so can read all of it whatever the modes.
 */
import { statSync } from "node:fs";
import { runsAsRunnerUser } from "../process/run-as.js";
import type { RunnerConfig } from "./config.js";

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

/** Ids of the agents that run as this process's user (no run_as: config refuses a pool user of the Runner's uid). */
export function sameUserAgents(config: RunnerConfig): string[] {
  return config.acp.agents.filter(runsAsRunnerUser).map((a) => a.id);
}

/** The line `check` prints for an agent that runs as the Runner's user. */
export const SAME_USER_WARNING =
  "the agent can read this Runner's credentials (its environment, config and token file); use run_as on a shared host";
