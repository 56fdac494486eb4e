/**
 * Shared helpers: a temp project + config pointing at the built fake agent,
 * a RunManager over a store, and helpers to run one turn to its end and
 * prove that no process of the run survived.
 */
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { base32, type RunEvent, RunEvent as RunEventSchema, type RunSummary } from "@webcodex/protocol";
import { FAKE_AGENT_BIN, RUNNER_BIN } from "../../../../scripts/test-support/index.js";
import { parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { listGroupMembers } from "../../src/process/proc-identity.js";
import { RunManager, type RunManagerOptions } from "../../src/runs/manager.js";
import type { RunStartRequest } from "../../src/runs/service.js";
import { openDispatchStore } from "../../src/store/open.js";
import type { DispatchStore } from "../../src/store/types.js";

/** Arguments after `node` for `webcodex-runner exec` of `prompt` in a workspace's config (project demo, provider fake). */
export function execArgs(ws: Pick<Workspace, "dir">, prompt: string): string[] {
  return [
    RUNNER_BIN,
    "exec",
    "--config",
    join(ws.dir, "runner.toml"),
    "--project",
    "demo",
    "--provider",
    "fake",
    prompt,
  ];
}

export interface Workspace {
  dir: string;
  projectRoot: string;
  ledger: string;
  envNames: string;
  cleanup(): void;
}

export function makeWorkspace(): Workspace {
  const dir = mkdtempSync(join(tmpdir(), "wc-runner-test-"));
  const projectRoot = join(dir, "project");
  mkdirSync(join(projectRoot, "src"), { recursive: true });
  writeFileSync(join(projectRoot, "src", "math.js"), "export const add = (a, b) => a - b;\n");
  return {
    dir,
    projectRoot,
    ledger: join(dir, "ledger.jsonl"),
    envNames: join(dir, "env-names.txt"),
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export interface AgentSpec {
  id?: string;
  executable?: string;
  args?: string[];
  allowed?: string[];
  env?: Record<string, string>;
}

export interface ConfigSpec {
  agents?: AgentSpec[];
  forced?: Record<string, string | boolean>;
  acp?: Record<string, number>;
  allowPatch?: boolean;
}

const toml = (v: unknown) => JSON.stringify(v);

export function writeConfig(ws: Workspace, spec: ConfigSpec = {}): RunnerConfig {
  const acp = {
    max_concurrent_runs: 4,
    setup_timeout_secs: 10,
    permission_timeout_secs: 30,
    cancel_grace_secs: 5,
    default_run_timeout_secs: 60,
    max_run_timeout_secs: 600,
    ...spec.acp,
  };
  const lines = [
    "[runner]",
    `state_dir = ${toml(join(ws.dir, "state"))}`,
    "[[projects]]",
    'id = "demo"',
    `root = ${toml(ws.projectRoot)}`,
    `allow_patch = ${spec.allowPatch ?? true}`,
    "[acp]",
    "agents_share_runner_user = true",
    ...Object.entries(acp).map(([k, v]) => `${k} = ${v}`),
    "[acp.forced_config]",
    ...Object.entries(spec.forced ?? {}).map(([k, v]) => `${toml(k)} = ${toml(v)}`),
  ];
  for (const agent of spec.agents ?? [{}]) {
    lines.push(
      "[[acp.agents]]",
      `id = ${toml(agent.id ?? "fake")}`,
      `executable = ${toml(agent.executable ?? FAKE_AGENT_BIN)}`,
      `args = ${toml(agent.args ?? ["--ledger", ws.ledger])}`,
      `allowed_config_options = ${toml(agent.allowed ?? [])}`,
      "[acp.agents.env_from_env]",
      ...Object.entries(agent.env ?? { PATH: "PATH" }).map(([k, v]) => `${k} = ${toml(v)}`),
    );
  }
  const file = join(ws.dir, "runner.toml");
  writeFileSync(file, `${lines.join("\n")}\n`);
  return parseConfig(readFileSync(file, "utf8"), file);
}

/** A RunManager over the real SQLite dispatch store in a fresh temp state dir (removed with the workspace's OS temp). */
export function newManager(config: RunnerConfig, extra: Partial<RunManagerOptions> & { store?: DispatchStore } = {}) {
  const store = extra.store ?? openDispatchStore({ stateDir: mkdtempSync(join(tmpdir(), "wc-runner-store-")) }).store;
  const manager = new RunManager({ cleanupGraceMs: 300, failpoint: () => {}, ...extra, config, store });
  return { manager, store };
}

export function newRunId(): string {
  return `wc_agent_run_${base32(randomBytes(20)).slice(0, 26)}`;
}

export function startRequest(
  manager: RunManager,
  prompt: string,
  overrides: Partial<RunStartRequest> = {},
): RunStartRequest {
  const provider = overrides.provider_id ?? "fake";
  return {
    run_id: newRunId(),
    intent_fingerprint: createHash("sha256").update(prompt).update(randomBytes(8)).digest("hex"),
    project_id: "demo",
    provider_id: provider,
    agent_instance_id: manager.agentInstanceId,
    provider_instance_id: manager.providerInstanceId(provider) ?? "unknown_provider_id",
    prompt,
    config: {},
    timeout_secs: null,
    ...overrides,
  };
}

export interface Finished {
  run: RunSummary;
  events: RunEvent[];
}

/** Start a run, wait until it is terminal and its tree is cleaned up; return the final summary and all events. */
export async function runToEnd(
  manager: RunManager,
  prompt: string,
  overrides: Partial<RunStartRequest> = {},
  during?: (runId: string) => void | Promise<void>,
): Promise<Finished> {
  const request = startRequest(manager, prompt, overrides);
  const started = await manager.start(request);
  if (!started.ok) throw new Error(`start rejected: ${started.code}`);
  if (during) await during(request.run_id);
  await manager.whenSettled(request.run_id);
  const synced = manager.sync(request.run_id, 0, 1000);
  if (!synced) throw new Error("run vanished");
  for (const event of synced.events) RunEventSchema.parse(event);
  return { run: synced.run, events: synced.events };
}

/**
 * Ends running run `runId` of a `scenario: hang` agent, which ignores both the cancel and stdin EOF: cancelled, it
 * ends `lost` after the cancel grace, then keeps its slot and pool user through the cleanup's EOF grace until
 * SIGTERM. Resolves once it is `lost`, with whether it has settled since (its agent gone, slot and user freed).
 */
export async function endHangingRun(manager: RunManager, runId: string): Promise<() => boolean> {
  await waitForState(manager, runId, "running");
  let settled = false;
  void manager.whenSettled(runId).then(() => (settled = true));
  await manager.cancel(runId);
  await waitForState(manager, runId, "lost");
  return () => settled;
}

/** Resolve once the run reaches `state` (via onUpdate pushes, no polling). */
export function waitForState(manager: RunManager, runId: string, state: RunSummary["state"]): Promise<RunSummary> {
  return new Promise((resolveState) => {
    const current = manager.sync(runId, 0, 0)?.run;
    if (current?.state === state) return resolveState(current);
    const off = manager.onUpdate((run) => {
      if (run.run_id === runId && run.state === state) {
        off();
        resolveState(run);
      }
    });
  });
}

/** Live, non-zombie processes whose process group is `pgid` (read from /proc/<pid>/stat). */
export function groupMembers(pgid: number): number[] {
  return listGroupMembers(pgid)
    .filter((stat) => stat.state !== "X")
    .map((stat) => stat.pid);
}

/** A launcher shell script that runs the fake agent as its child without exec or signal forwarding. */
export function writeLauncher(ws: Workspace): string {
  const file = join(ws.dir, "launcher.sh");
  writeFileSync(
    file,
    `#!/bin/sh\n# Like an npm/npx shim: the agent is a child, signals are not forwarded.\n"${process.execPath}" "${FAKE_AGENT_BIN}" "$@"\nexit $?\n`,
  );
  chmodSync(file, 0o755);
  return file;
}

export function kinds(events: readonly RunEvent[]): string[] {
  return [...new Set(events.map((e) => e.kind))].sort();
}
