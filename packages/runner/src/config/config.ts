/**
 * The Runner's TOML configuration (design §4.1): parsed with smol-toml,
 * validated with zod, then checked against the filesystem (project roots
 * exist and are placed apart from the Runner's own files: config/placement.ts;
 * executables exist and are executable). Startup-owned: restart to
 * change. Every problem is reported at once, each naming the file, the TOML
 * key path and the rule, so an operator can fix a config in one pass.
 */
import { accessSync, constants, lstatSync, realpathSync, statSync } from "node:fs";
import { dirname, isAbsolute, resolve } from "node:path";
import { isLoopbackHost, MAX_CONFIG_ENTRIES, type WorkspaceMode } from "@webcodex/protocol";
import { parse as parseToml, TomlError } from "smol-toml";
import {
  checkProjectRoot,
  checkRootPlacement,
  checkWorkspacesDirPlacement,
  type PlacedRoot,
  type Report,
  realpathLoose,
  resolveFrom,
  within,
} from "./placement.js";
import { type RunAsPool, resolveRunAs, type SandboxTools, type SwitchSupport, switchUserSupport } from "./run-as.js";
import { findSandboxTools, PRIVATE_TREES, SANDBOX_OPT_OUT, type SandboxMode } from "./sandbox-tools.js";
import { ConfigSchema, describeIssues, type LogLevel, type RawConfig, WORKSPACE_AUTHOR_PATTERN } from "./schema.js";
import { worktreeRootProblem } from "./workspace-check.js";

export interface ProjectConfig {
  readonly id: string;
  /** Real absolute path (symlinks resolved), checked to be a directory at load time. */
  readonly root: string;
  readonly allowPatch: boolean;
  /** `shared_between_callers`: run_as runs of different callers may share this tree (runs/project-callers.ts). */
  readonly sharedBetweenCallers: boolean;
  /** `workspace`: `shared` (runs work in the root) or `worktree` (a git worktree per run, workspace/). */
  readonly workspace: WorkspaceMode;
  /** Who the Runner commits a worktree run's leftovers as: the project's `workspace_author`, else `[acp]`'s. */
  readonly workspaceAuthor: WorkspaceAuthor;
}

export interface WorkspaceAuthor {
  readonly name: string;
  readonly email: string;
}

function parseAuthor(text: string): WorkspaceAuthor {
  const m = WORKSPACE_AUTHOR_PATTERN.exec(text);
  return Object.freeze({ name: m?.[1] ?? "WebCodex Runner", email: m?.[2] ?? "runner@webcodex.invalid" });
}

export interface AgentConfig {
  readonly id: string;
  readonly name: string;
  /** Absolute path, checked to exist and be executable at load time. Never searched on PATH. */
  readonly executable: string;
  readonly args: readonly string[];
  readonly allowedConfigOptions: readonly string[];
  /**
   * The forced config this agent's runs apply and verify: `[acp.forced_config]`
   * overridden key by key by the agent's own `[acp.agents.forced_config]`.
   */
  readonly forcedConfig: Readonly<Record<string, string | boolean>>;
  /** The keys of forcedConfig that come from the agent's own table (for `check --probe`). */
  readonly ownForcedKeys: readonly string[];
  /** CHILD_NAME → RUNNER_SOURCE_NAME. Resolved from the Runner's env immediately before each spawn. */
  readonly envFromEnv: Readonly<Record<string, string>>;
  /**
   * `run_as` / `run_as_group`, resolved and checked at load time: the pool of users this agent's runs take
   * (one per concurrent run, process/user-pool.ts); null: the agent runs as the Runner's user (`sharesRunnerUser`, config/exposure.ts).
   */
  readonly runAs: RunAsPool | null;
  /**
   * Which ACP continuation methods the operator says this agent has (design §17), advertised to the Server;
   * each continuing run still checks the agent's `initialize` answer. `none`: runs cannot be continued.
   */
  readonly continuation: "none" | "load" | "resume" | "both";
}

export interface AcpConfig {
  readonly maxConcurrentRuns: number;
  readonly setupTimeoutSecs: number;
  readonly permissionTimeoutSecs: number;
  readonly cancelGraceSecs: number;
  /** `[acp] keep_agent_alive_secs`: a completed run's agent waits this long for a follow-up; 0: it never does. */
  readonly keepAgentAliveSecs: number;
  readonly defaultRunTimeoutSecs: number;
  readonly maxRunTimeoutSecs: number;
  /** The Runner-wide `[acp.forced_config]` (each agent's effective table is AgentConfig.forcedConfig). */
  readonly forcedConfig: Readonly<Record<string, string | boolean>>;
  /** `[acp] agents_share_runner_user`: the operator accepts agents running as the Runner's own user. */
  readonly agentsShareRunnerUser: boolean;
  /** `[acp] single_tenant`: run_as pool users serve any caller, not only the one they first served. */
  readonly singleTenant: boolean;
  /** `[acp] sandbox`: whether run_as agents start in a mount and IPC namespace of their own (process/sandbox.ts). */
  readonly sandbox: SandboxMode;
  /** `[acp] max_users_per_caller`, or null: half of each agent's pool, at least 1 (process/user-pool.ts). */
  readonly maxUsersPerCaller: number | null;
  /** `[acp] binding_idle_days`: a pool user its caller left unused this long may be recycled for another. */
  readonly bindingIdleDays: number;
  /** `[acp] home_template` as an absolute path, or null: a recycled user's HOME starts empty. */
  readonly homeTemplate: string | null;
  readonly agents: readonly AgentConfig[];
}

export interface ServerConfig {
  readonly url: string;
  /** Name of the env var holding the Runner's bearer token (never the token itself). */
  readonly tokenEnv: string | null;
  /** Absolute path of a file holding the token. */
  readonly tokenFile: string | null;
  /** Absolute path of a PEM CA bundle trusted for wss:// besides the system CAs. */
  readonly caFile: string | null;
  /** ws:// to a non-loopback host was explicitly allowed (`allow_insecure_transport = true`). */
  readonly allowInsecureTransport: boolean;
}

export interface RunnerConfig {
  /** Absolute path of the file this config was read from. */
  readonly file: string;
  readonly runner: {
    readonly stateDir: string;
    readonly logLevel: LogLevel;
    /** Retention of terminal dispatch rows (active and lost rows are never pruned). */
    readonly retainTerminalDays: number;
    readonly retainTerminalMax: number;
    /** How long a worktree stays after its run's change is recorded (`workspace_keep_secs`; 0: removed at once). */
    readonly workspaceKeepSecs: number;
    /** Spare worktrees kept per `worktree` project (`worktree_spares`; 0: none; workspace/spares.ts). */
    readonly worktreeSpares: number;
    /** `workspaces_dir`, absolute, or null: `<state_dir>/workspaces` (workspace/worktree.ts worktreesDir). */
    readonly workspacesDir: string | null;
  };
  /** Absent when the file has no [server] table (fine for `check` and `exec`; `run` requires it). */
  readonly server: ServerConfig | null;
  readonly projects: readonly ProjectConfig[];
  readonly acp: AcpConfig;
}

/** Thrown by loadConfig; `errors` lists every problem, one line each. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
  /** Exit code of a Runner that refuses to start on an invalid config. */
  readonly exitCode = 2;
  constructor(readonly errors: readonly string[]) {
    super(`invalid Runner config:\n${errors.map((e) => `  ${e}`).join("\n")}`);
  }
}

// ---- loading --------------------------------------------------------------------

/** The host of a ws:// URL that is not loopback (the link would run without TLS over a network), else null. */
export function insecureTransport(url: string): string | null {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return null; // the url rule reports it
  }
  return u.protocol === "ws:" && !isLoopbackHost(u.hostname) ? u.hostname : null;
}

/** `[acp] home_template` as a real absolute path: an existing directory (not a symlink), or reported. */
function checkHomeTemplate(base: string, template: string | undefined, err: Report): string | null {
  if (template === undefined) return null;
  const abs = resolveFrom(base, template);
  try {
    if (!lstatSync(abs).isDirectory()) err("acp.home_template", `${abs} is not a directory (nor may it be a symlink)`);
    return realpathSync(abs);
  } catch {
    err("acp.home_template", `${abs} does not exist`);
    return abs;
  }
}

/** The absolute executable path, reporting bare names, missing files and missing execute permission. */
function checkExecutable(base: string, executable: string, path: string, err: Report): string {
  if (!isAbsolute(executable) && !executable.includes("/")) {
    err(
      path,
      "must be an absolute path or a path relative to the config file (bare command names are not searched on PATH)",
    );
    return executable;
  }
  const abs = resolveFrom(base, executable);
  try {
    if (!statSync(abs).isFile()) err(path, `${abs} is not a file`);
    else accessSync(abs, constants.X_OK);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    err(path, code === "ENOENT" ? `${abs} does not exist` : `${abs} is not executable`);
  }
  return abs;
}

/**
 * When the schema already failed, still run the filesystem checks on every
 * project root and executable that is at least a string, so one pass lists
 * every problem.
 */
function checkFilesystemLeniently(file: string, raw: unknown, errors: string[]): void {
  const base = dirname(file);
  const err: Report = (path, rule) => errors.push(`${file}: ${path}: ${rule}`);
  const record = (v: unknown) => (v !== null && typeof v === "object" ? (v as Record<string, unknown>) : {});
  const projects = record(raw).projects;
  if (Array.isArray(projects)) {
    projects.forEach((p, i) => {
      const root = record(p).root;
      if (typeof root === "string" && root !== "") checkProjectRoot(base, root, `projects[${i}].root`, err);
    });
  }
  const agents = record(record(raw).acp).agents;
  if (Array.isArray(agents)) {
    agents.forEach((a, i) => {
      const exe = record(a).executable;
      if (typeof exe === "string" && exe !== "") checkExecutable(base, exe, `acp.agents[${i}].executable`, err);
    });
  }
}

/**
 * `[acp] sandbox = "namespaces"` with run_as agents: the tools exist, and nothing an agent needs lies in a tree
 * it gets private and empty. The tools, or null after reporting why not. Whether this Runner can make the
 * namespaces is asked at start (`sandboxRefusal`, process/sandbox.ts), not here: loading spawns nothing.
 */
function checkSandbox(
  projects: readonly ProjectConfig[],
  agents: readonly AgentConfig[],
  err: Report,
): SandboxTools | null {
  const hidden = (path: string) => PRIVATE_TREES.find((t) => within(path, t) || within(realpathLoose(path), t));
  const inTree = (tree: string) =>
    `is in ${tree}, which every run_as agent gets private and empty ([acp] sandbox = "namespaces"): the agent would not see it; move it out of ${PRIVATE_TREES.join(", ")}`;
  projects.forEach((p, i) => {
    const tree = hidden(p.root);
    if (tree !== undefined) err(`projects[${i}].root`, `${p.root} ${inTree(tree)}`);
  });
  agents.forEach((a, i) => {
    const tree = a.runAs === null ? undefined : hidden(a.executable);
    if (tree !== undefined) err(`acp.agents[${i}].executable`, `${a.executable} ${inTree(tree)}`);
  });
  const found = findSandboxTools();
  if (!found.ok) {
    err(
      "acp.sandbox",
      `"namespaces" (the default with run_as) ${found.reason}; install util-linux, ${SANDBOX_OPT_OUT}`,
    );
    return null;
  }
  return found.tools;
}

function withSandbox(agent: AgentConfig, sandbox: SandboxTools): AgentConfig {
  if (agent.runAs === null) return agent;
  const users = agent.runAs.users.map((u) => Object.freeze({ ...u, sandbox }));
  return Object.freeze({ ...agent, runAs: Object.freeze({ users: Object.freeze(users) }) });
}

/**
 * Why a run_as agent may not map `HOME` in env_from_env, or null without run_as. The Runner sets a pool
 * user's HOME to its own passwd HOME (process/run-as.ts runAsEnv), the one start-up checks owner-only and a
 * recycle wipes. A pool of several users refuses a mapped HOME because one HOME shared by every pool user is
 * read by every caller's runs; a pool of one refuses it too, so that one rule holds for every run_as agent
 * and a mapped HOME never escapes those checks (a single user's HOME moves with `usermod -d`).
 */
function mappedHomeRule(runAs: string | readonly string[] | undefined): string | null {
  if (runAs === undefined) return null;
  const fix =
    "remove it: the Runner sets each pool user's HOME to the user's own (its passwd entry, checked owner-only " +
    "at start and wiped when the user is recycled); put agent logins in [acp] home_template";
  if (typeof runAs !== "string" && runAs.length > 1) {
    return (
      `maps one HOME for every user of this run_as pool (${runAs.length} users): what one caller's run leaves ` +
      `there (agent logins, shell rc files, caches, ~/.gitconfig) is read by every other caller's runs; ${fix}`
    );
  }
  return (
    "is not allowed on a run_as agent: a mapped HOME escapes the checks on the pool user's own HOME " +
    `(move that one with usermod -d); ${fix}`
  );
}

/** Cross-field and filesystem rules, after the schema accepted the shape. */
function checkSemantics(file: string, raw: RawConfig, errors: string[]): RunnerConfig {
  const base = dirname(file);
  const err = (path: string, rule: string) => errors.push(`${file}: ${path}: ${rule}`);

  const projects: ProjectConfig[] = [];
  const projectIds = new Set<string>();
  const roots = new Map<string, string>();
  const placed: PlacedRoot[] = [];
  raw.projects.forEach((p, i) => {
    if (projectIds.has(p.id)) err(`projects[${i}].id`, `${JSON.stringify(p.id)} is not unique`);
    projectIds.add(p.id);
    const errorsBefore = errors.length;
    const root = checkProjectRoot(base, p.root, `projects[${i}].root`, err);
    const other = roots.get(root);
    if (other !== undefined)
      err(`projects[${i}].root`, `is the same directory as project ${JSON.stringify(other)} (${root})`);
    else roots.set(root, p.id);
    if (errors.length === errorsBefore) placed.push({ id: p.id, path: `projects[${i}].root`, root });
    if (errors.length === errorsBefore && p.workspace === "worktree") {
      const problem = worktreeRootProblem(root);
      if (problem !== null) err(`projects[${i}].workspace`, problem);
    }
    projects.push(
      Object.freeze({
        id: p.id,
        root,
        allowPatch: p.allow_patch,
        sharedBetweenCallers: p.shared_between_callers,
        workspace: p.workspace,
        workspaceAuthor: parseAuthor(p.workspace_author ?? raw.acp.workspace_author),
      }),
    );
  });
  checkRootPlacement(
    placed,
    {
      configDir: base,
      stateDir: resolveFrom(base, raw.runner.state_dir),
      tokenFile: raw.server?.token_file === undefined ? null : resolveFrom(base, raw.server.token_file),
      caFile: raw.server?.ca_file === undefined ? null : resolveFrom(base, raw.server.ca_file),
    },
    err,
  );

  const acp = raw.acp;
  if (acp.default_run_timeout_secs > acp.max_run_timeout_secs) {
    err("acp.default_run_timeout_secs", `must not exceed acp.max_run_timeout_secs (${acp.max_run_timeout_secs})`);
  }
  let switchSupport: SwitchSupport | undefined;
  const canSwitch = () => {
    switchSupport ??= switchUserSupport();
    return switchSupport;
  };
  const agents: AgentConfig[] = [];
  const agentIds = new Set<string>();
  acp.agents.forEach((a, i) => {
    const at = `acp.agents[${i}]`;
    if (agentIds.has(a.id)) err(`${at}.id`, `${JSON.stringify(a.id)} is not unique`);
    agentIds.add(a.id);

    const executable = checkExecutable(base, a.executable, `${at}.executable`, err);

    // The agent's own table overrides the Runner-wide one key by key; values are checked
    // against the live options at session/new, not here (only their types are known now).
    const forced = { ...acp.forced_config, ...a.forced_config };
    if (Object.keys(forced).length > MAX_CONFIG_ENTRIES) {
      err(
        `${at}.forced_config`,
        `together with [acp.forced_config] must force at most ${MAX_CONFIG_ENTRIES} keys (has ${Object.keys(forced).length})`,
      );
    }
    const seen = new Set<string>();
    a.allowed_config_options.forEach((key, j) => {
      if (Object.hasOwn(a.forced_config, key)) {
        err(`${at}.allowed_config_options[${j}]`, `${JSON.stringify(key)} is forced in ${at}.forced_config`);
      } else if (Object.hasOwn(acp.forced_config, key)) {
        err(`${at}.allowed_config_options[${j}]`, `${JSON.stringify(key)} is forced in [acp.forced_config]`);
      }
      if (seen.has(key)) err(`${at}.allowed_config_options[${j}]`, `${JSON.stringify(key)} is listed twice`);
      seen.add(key);
    });

    const runAs = resolveRunAs(a.run_as, a.run_as_group, canSwitch);
    if (!runAs.ok) err(`${at}.${runAs.key}`, runAs.reason);
    const mappedHome = mappedHomeRule(a.run_as);
    if (mappedHome !== null && Object.hasOwn(a.env_from_env, "HOME")) err(`${at}.env_from_env.HOME`, mappedHome);

    agents.push(
      Object.freeze({
        id: a.id,
        name: a.name ?? a.id,
        executable,
        args: Object.freeze([...a.args]),
        allowedConfigOptions: Object.freeze([...a.allowed_config_options]),
        forcedConfig: Object.freeze(forced),
        ownForcedKeys: Object.freeze(Object.keys(a.forced_config)),
        envFromEnv: Object.freeze({ ...a.env_from_env }),
        runAs: runAs.ok ? runAs.value : null,
        continuation: a.continuation,
      }),
    );
  });

  checkWorkspacesDirPlacement(raw, base, err);

  const sandboxed = acp.sandbox === "namespaces" && agents.some((a) => a.runAs !== null);
  const tools = sandboxed ? checkSandbox(projects, agents, err) : null;
  const sandboxedAgents = tools === null ? agents : agents.map((a) => withSandbox(a, tools));

  let server: ServerConfig | null = null;
  if (raw.server) {
    const s = raw.server;
    if ((s.token_env === undefined) === (s.token_file === undefined)) {
      err("server", "must set exactly one of token_env or token_file (the token is never inline)");
    }
    const insecure = insecureTransport(s.url);
    if (insecure !== null && !s.allow_insecure_transport) {
      err(
        "server.url",
        `ws:// to the non-loopback host ${JSON.stringify(insecure)} would send the Runner token and every prompt ` +
          "in clear text; use wss:// (with server.ca_file for a private CA), or set " +
          "[server] allow_insecure_transport = true to accept that",
      );
    }
    const caFile = s.ca_file === undefined ? null : resolveFrom(base, s.ca_file);
    if (caFile !== null) {
      try {
        accessSync(caFile, constants.R_OK);
      } catch (e) {
        err("server.ca_file", `cannot read ${caFile} (${(e as NodeJS.ErrnoException).code ?? "unreadable"})`);
      }
    }
    server = Object.freeze({
      url: s.url,
      tokenEnv: s.token_env ?? null,
      tokenFile: s.token_file === undefined ? null : resolveFrom(base, s.token_file),
      caFile,
      allowInsecureTransport: s.allow_insecure_transport,
    });
  }

  return Object.freeze({
    file,
    runner: Object.freeze({
      stateDir: resolveFrom(base, raw.runner.state_dir),
      logLevel: raw.runner.log_level,
      retainTerminalDays: raw.runner.retain_terminal_days,
      retainTerminalMax: raw.runner.retain_terminal_max,
      workspaceKeepSecs: raw.runner.workspace_keep_secs,
      worktreeSpares: raw.runner.worktree_spares,
      workspacesDir: raw.runner.workspaces_dir === undefined ? null : resolveFrom(base, raw.runner.workspaces_dir),
    }),
    server,
    projects: Object.freeze(projects),
    acp: Object.freeze({
      maxConcurrentRuns: acp.max_concurrent_runs,
      setupTimeoutSecs: acp.setup_timeout_secs,
      permissionTimeoutSecs: acp.permission_timeout_secs,
      cancelGraceSecs: acp.cancel_grace_secs,
      keepAgentAliveSecs: acp.keep_agent_alive_secs,
      defaultRunTimeoutSecs: acp.default_run_timeout_secs,
      maxRunTimeoutSecs: acp.max_run_timeout_secs,
      forcedConfig: Object.freeze({ ...acp.forced_config }),
      agentsShareRunnerUser: acp.agents_share_runner_user,
      singleTenant: acp.single_tenant,
      sandbox: acp.sandbox,
      maxUsersPerCaller: acp.max_users_per_caller ?? null,
      bindingIdleDays: acp.binding_idle_days,
      homeTemplate: checkHomeTemplate(base, acp.home_template, err),
      agents: Object.freeze(sandboxedAgents),
    }),
  });
}

/** Validate TOML text as if read from `file` (relative paths resolve against its directory). */
export function parseConfig(text: string, file: string): RunnerConfig {
  const abs = resolve(file);
  let raw: unknown;
  try {
    raw = parseToml(text);
  } catch (e) {
    if (e instanceof TomlError)
      throw new ConfigError([`${abs}:${e.line}:${e.column}: TOML syntax error: ${e.message.split("\n")[0]}`]);
    throw new ConfigError([`${abs}: TOML syntax error`]);
  }
  const parsed = ConfigSchema.safeParse(raw);
  if (!parsed.success) {
    const errors = describeIssues(abs, raw, parsed.error);
    checkFilesystemLeniently(abs, raw, errors);
    throw new ConfigError(errors);
  }
  const errors: string[] = [];
  const config = checkSemantics(abs, parsed.data, errors);
  if (errors.length > 0) throw new ConfigError(errors);
  return config;
}

/** Read and validate the config file. Throws ConfigError listing every problem. */
export async function loadConfig(file: string): Promise<RunnerConfig> {
  const { readFile } = await import("node:fs/promises");
  const abs = resolve(file);
  let text: string;
  try {
    text = await readFile(abs, "utf8");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? "unreadable";
    throw new ConfigError([`${abs}: cannot read the config file (${code})`]);
  }
  return parseConfig(text, abs);
}
