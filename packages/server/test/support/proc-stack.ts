/**
 * Process-level stack for the Server <-> Runner acceptance tests: a real Server (either
 * in-process via startServer, or as a `webcodex-server run` child process
 * that can be SIGKILLed and restarted on the same port), one or more real
 * Runner daemons (`webcodex-runner run`) and the fake ACP agent they spawn.
 * The internal RunsApi is called directly in-process, or through the
 * test-only HTTP hook (WEBCODEX_TEST_HOOK_API=1) for a Server child.
 * Needs a build (`tsc -b`): the daemons and the fake agent run from dist.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { isTerminalState } from "@webcodex/protocol";
import Database from "better-sqlite3";
import { pino } from "pino";
import {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  type DaemonProcess,
  FAKE_AGENT_BIN,
  killProcesses,
  type LedgerLine,
  ledgerPrompts,
  poll,
  processesMentioning,
  startRunnerProcess,
  startServerProcess,
} from "../../../../scripts/test-support/index.js";
import { sharedTestDir } from "../../../runner/test/support/test-user.js";
import { loadServerConfig, sha256Hex } from "../../src/config.js";
import type {
  ApiResult,
  CancelOutput,
  ObserveInput,
  ObserveOutput,
  Principal,
  ProjectView,
  StartInput,
  StartOutput,
} from "../../src/runs/api.js";
import { type RunningServer, startServer } from "../../src/server.js";
import { principalFromConfig } from "../../src/test-api.js";

/** The tail of each daemon's output that `logs` holds. */
const LOG_CHARS = 64 * 1024;
/** How long killRunner() (and stop()) give a daemon after its signal before SIGKILL. */
const STOP_GRACE_MS = 10_000;

/** The env var the Server config's `[server.state] url_env` names in a stack on PostgreSQL. */
export const STATE_URL_ENV = "WEBCODEX_STACK_DATABASE_URL";
/**
 * Set by the PostgreSQL pass of the suite (scripts/vitest/postgres-pass.ts): the cluster's superuser URL; every
 * stack then keeps its Server's state in a fresh database of its own there.
 */
export const TEST_POSTGRES_ADMIN_URL_ENV = "WEBCODEX_TEST_POSTGRES_ADMIN_URL";

export interface ProcRunner {
  id: string;
  projects: string[];
  /**
   * Run the fake agent as this OS user (`run_as`), from `agentBin` (a copy the user can read). Without it the
   * agent runs as the Runner's user and the Runner config opts in (`agents_share_runner_user = true`).
   */
  runAs?: { user: string | string[]; agentBin: string };
  /** The Server config's `shared_user_principals` for this runner. */
  sharedUserPrincipals?: string[];
  /**
   * Projects of this runner in `workspace = "worktree"` mode (design §16): each one's root is made a git
   * repository with one commit (README.md) first.
   */
  worktreeProjects?: string[];
}

export interface ProcStackOptions {
  runners: ProcRunner[];
  /** "inproc" (default): startServer in this process; "child": a webcodex-server child process. */
  server?: "inproc" | "child";
  /** Extra env for the Server (test hooks). */
  serverEnv?: Record<string, string>;
  /** Scopes both principals get besides coding_agent:run, project:write and project:read. */
  extraScopes?: string[];
  /**
   * A PostgreSQL database URL: the Server keeps its state there (`[server.state] backend = "postgres"`) instead
   * of the SQLite file. Default: a fresh database in the PostgreSQL pass (TEST_POSTGRES_ADMIN_URL_ENV), else SQLite.
   */
  stateUrl?: string;
  /** Extra lines inside the Server config's `[server]` table (given the port), e.g. `public_url`. */
  serverSection?: (port: number) => string;
  /** The Server's heartbeat_interval_ms (default 2000); the link lease runs two of them. */
  heartbeatIntervalMs?: number;
  /** Extra TOML appended to the Server config (e.g. an `[oauth]` table). */
  extraServerToml?: string;
  /** Serve TLS with this certificate; Runners connect with wss:// and trust `caFile` (test-ca.ts). */
  tls?: { certFile: string; keyFile: string; caFile: string };
  /**
   * With a PostgreSQL state: `[server.cluster] listen_port`, the instances' own listener (absent: its default,
   * a free port), or "client" for `serve_on_client_listener = true` (the instances' endpoints on the clients' one).
   */
  clusterListenPort?: number | "client";
  /** Extra lines of each Runner's `[runner]` table (e.g. `retain_terminal_max = 1`). */
  runnerTable?: string;
  /** The port the Runners dial instead of the Server's (a proxy in front of it). */
  linkPort?: number;
  /** Extra command-line flags of the fake agent (e.g. `--config-options`). */
  agentArgs?: string[];
  /** Extra lines of the Runner's `[[acp.agents]]` table (e.g. `continuation = "both"`). */
  agentToml?: string;
  /** Each Runner's `[acp] permission_timeout_secs` (default 60). */
  permissionTimeoutSecs?: number;
  /** Extra lines of each Runner's `[acp]` table (e.g. `keep_agent_alive_secs = 30`). */
  acpTable?: string;
}

/** A git repository at `root` with one commit of a README.md (a `worktree` project's root). */
function initRepository(root: string): void {
  writeFileSync(join(root, "README.md"), "demo\n");
  const git = (...args: string[]) =>
    execFileSync("git", ["-c", "user.name=stack", "-c", "user.email=stack@example.invalid", ...args], {
      cwd: root,
      stdio: "ignore",
    });
  git("init", "-q", "-b", "main");
  git("add", "-A");
  git("commit", "-q", "-m", "initial");
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export class ProcStack {
  /** With a run_as Runner, outside the /tmp its sandboxed agents get private (the agent must see the ledger). */
  readonly dir: string;
  readonly serverConfigFile: string;
  readonly tokens = new Map<string, string>();
  readonly runnerProcs = new Map<string, DaemonProcess>();
  /** Runners started at least once: a restart first waits for the Server to drop the previous link. */
  readonly #startedOnce = new Set<string>();
  readonly logs = new Map<string, string>();
  /** Bearer tokens of the config's principals (inline `token_sha256`), for real MCP clients. */
  readonly principalTokens = new Map<string, string>();
  readonly #clients: Client[] = [];
  inproc: RunningServer | null = null;
  serverChild: DaemonProcess | null = null;
  port = 0;

  constructor(readonly opts: ProcStackOptions) {
    this.dir = opts.runners.some((r) => r.runAs) ? sharedTestDir("wc-proc-") : mkdtempSync(join(tmpdir(), "wc-proc-"));
    this.serverConfigFile = join(this.dir, "server.toml");
  }

  /** The PostgreSQL URL the Server's state is on, or undefined for SQLite (set by `init`). */
  stateUrl: string | undefined;

  /** The Server's env: the test hooks' and, on PostgreSQL, the database URL. */
  #serverEnv(): Record<string, string> {
    const url = this.stateUrl;
    return { ...this.opts.serverEnv, ...(url === undefined ? {} : { [STATE_URL_ENV]: url }) };
  }

  get mode(): "inproc" | "child" {
    return this.opts.server ?? "inproc";
  }

  ledgerFile(runnerId: string): string {
    return join(this.dir, `ledger-${runnerId}.jsonl`);
  }

  /** session/prompt lines the fake agent of this runner received. */
  prompts(runnerId: string): LedgerLine[] {
    return ledgerPrompts(this.ledgerFile(runnerId));
  }

  async init(): Promise<this> {
    this.port = await freePort();
    const admin = process.env[TEST_POSTGRES_ADMIN_URL_ENV];
    if (this.opts.stateUrl !== undefined) this.stateUrl = this.opts.stateUrl;
    else if (admin) {
      // Loaded only in the PostgreSQL pass (it registers process exit hooks).
      const { createDatabaseAt } = await import("../../../../scripts/test-support/postgres.js");
      this.stateUrl = await createDatabaseAt(admin);
    }
    // The server CLI a test runs (`token issue`, `runner-token rotate`) reads the same state: it inherits this.
    if (this.stateUrl !== undefined) process.env[STATE_URL_ENV] = this.stateUrl;
    const allProjects = this.opts.runners.flatMap((r) => r.projects);
    let toml = `[server]\nhost = "127.0.0.1"\nport = ${this.port}\nstate_dir = "server-state"\nheartbeat_interval_ms = ${this.opts.heartbeatIntervalMs ?? 2000}\n${this.opts.serverSection?.(this.port) ?? ""}\n\n`;
    const stateUrl = this.stateUrl;
    if (stateUrl !== undefined) toml += `[server.state]\nbackend = "postgres"\nurl_env = "${STATE_URL_ENV}"\n\n`;
    const clusterListen = this.opts.clusterListenPort;
    if (stateUrl !== undefined && clusterListen !== undefined)
      toml +=
        clusterListen === "client"
          ? "[server.cluster]\nserve_on_client_listener = true\n\n"
          : `[server.cluster]\nlisten_port = ${clusterListen}\n\n`;
    const tls = this.opts.tls;
    if (tls)
      toml += `[server.tls]\ncert_file = ${JSON.stringify(tls.certFile)}\nkey_file = ${JSON.stringify(tls.keyFile)}\n\n`;
    for (const r of this.opts.runners) {
      const token = `wcr_${randomBytes(24).toString("base64url")}`;
      this.tokens.set(r.id, token);
      toml += `[[runners]]\nid = "${r.id}"\ntoken_sha256 = "${sha256Hex(token)}"\nprojects = ${JSON.stringify(r.projects)}\n`;
      if (r.sharedUserPrincipals) toml += `shared_user_principals = ${JSON.stringify(r.sharedUserPrincipals)}\n`;
      toml += "\n";
      for (const p of r.projects) mkdirSync(join(this.dir, "projects", p), { recursive: true });
      for (const p of r.worktreeProjects ?? []) initRepository(join(this.dir, "projects", p));
      this.#writeRunnerConfig(r);
    }
    const scopes = JSON.stringify([
      "coding_agent:run",
      "project:write",
      "project:read",
      ...(this.opts.extraScopes ?? []),
    ]);
    for (const id of ["alice", "bob"]) {
      const bearer = `wct_${randomBytes(24).toString("base64url")}`;
      this.principalTokens.set(id, bearer);
      toml +=
        `[[principals]]\nid = "${id}"\nscopes = ${scopes}\nprojects = ${JSON.stringify(allProjects)}\n` +
        `token_sha256 = ["${sha256Hex(bearer)}"]\ntoken_scopes = ${scopes}\nallow_coding_agent_run = true\n\n`;
    }
    if (this.opts.extraServerToml) toml += `\n${this.opts.extraServerToml}\n`;
    writeFileSync(this.serverConfigFile, toml);
    await this.startServer();
    return this;
  }

  #writeRunnerConfig(r: ProcRunner): void {
    const projects = r.projects
      // A run_as Runner's projects serve several callers here (pool tests); one project serving one caller is
      // the Runner's sandbox.test.ts.
      .map(
        (p) =>
          `[[projects]]\nid = "${p}"\nroot = ${JSON.stringify(join("projects", p))}\nallow_patch = true\n` +
          (r.runAs ? "shared_between_callers = true\n" : "") +
          (r.worktreeProjects?.includes(p) ? 'workspace = "worktree"\n' : ""),
      )
      .join("\n");
    writeFileSync(
      join(this.dir, `runner-${r.id}.toml`),
      `[runner]\nstate_dir = "runner-state-${r.id}"\nlog_level = "info"\n${this.opts.runnerTable ?? ""}\n\n` +
        `[server]\nurl = "${this.opts.tls ? "wss" : "ws"}://127.0.0.1:${this.opts.linkPort ?? this.port}/runner"\ntoken_env = "WEBCODEX_RUNNER_TOKEN"\n` +
        (this.opts.tls ? `ca_file = ${JSON.stringify(this.opts.tls.caFile)}\n` : "") +
        "\n" +
        `${projects}\n[acp]\nmax_concurrent_runs = 4\nsetup_timeout_secs = 20\npermission_timeout_secs = ${this.opts.permissionTimeoutSecs ?? 60}\ncancel_grace_secs = 5\n` +
        (this.opts.acpTable ? `${this.opts.acpTable}\n` : "") +
        (r.runAs ? "\n" : "agents_share_runner_user = true\n\n") +
        `[[acp.agents]]\nid = "fake"\nname = "Fake agent"\nexecutable = ${JSON.stringify(r.runAs?.agentBin ?? FAKE_AGENT_BIN)}\n` +
        `args = ${JSON.stringify(["--ledger", this.ledgerFile(r.id), ...(this.opts.agentArgs ?? [])])}\nallowed_config_options = ["model"]\n` +
        (r.runAs ? `run_as = ${JSON.stringify(r.runAs.user)}\n` : "") +
        (this.opts.agentToml ? `${this.opts.agentToml}\n` : "") +
        `[acp.agents.env_from_env]\nPATH = "PATH"\n`,
    );
  }

  async startServer(): Promise<void> {
    if (this.mode === "inproc") {
      const config = loadServerConfig(this.serverConfigFile);
      this.inproc = await startServer({
        config,
        logger: pino({ level: process.env.WEBCODEX_TEST_LOG_LEVEL ?? "silent" }),
        env: this.#serverEnv(),
      });
      return;
    }
    const child = startServerProcess(this.serverConfigFile, {
      cwd: this.dir,
      env: { ...process.env, WEBCODEX_TEST_HOOK_API: "1", WEBCODEX_LOG_LEVEL: "warn", ...this.#serverEnv() },
      outputLimit: LOG_CHARS,
      stopGraceMs: STOP_GRACE_MS,
      onOutput: () => this.logs.set("server", child.output()),
    });
    this.serverChild = child;
    await poll(
      () => {
        if (child.exitCode !== null) throw new Error(`server exited ${child.exitCode}: ${child.output()}`);
        return child.output().includes('"listening"');
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what: "the Server child to listen" },
    );
  }

  /**
   * Rows of a read-only query on the Server's state, straight from its database (`?` placeholders): the
   * PostgreSQL database in the PostgreSQL pass, else the SQLite file.
   */
  async stateRows<T = Record<string, unknown>>(sql: string, params: readonly (string | number)[] = []): Promise<T[]> {
    if (this.stateUrl !== undefined) {
      const { default: pg } = await import("pg");
      const client = new pg.Client({ connectionString: this.stateUrl });
      await client.connect();
      try {
        let n = 0;
        return (
          await client.query(
            sql.replace(/\?/g, () => `$${++n}`),
            [...params],
          )
        ).rows as T[];
      } finally {
        await client.end();
      }
    }
    const db = new Database(join(this.serverStateDir, "server.sqlite3"), { readonly: true, fileMustExist: true });
    try {
      return db.prepare(sql).all(...params) as T[];
    } finally {
      db.close();
    }
  }

  /**
   * A backup of the Server's state as it is now (stop the Server first): a copy of its state dir, and on
   * PostgreSQL of its database. `restoreState` puts it back, as an operator restoring that backup would.
   */
  async backupState(): Promise<void> {
    rmSync(this.#stateBackupDir, { recursive: true, force: true });
    if (existsSync(this.serverStateDir)) cpSync(this.serverStateDir, this.#stateBackupDir, { recursive: true });
    if (this.stateUrl !== undefined) await this.#copyDatabase("backup");
  }

  /** Put back what `backupState` took (stop the Server first). */
  async restoreState(): Promise<void> {
    rmSync(this.serverStateDir, { recursive: true, force: true });
    if (existsSync(this.#stateBackupDir)) cpSync(this.#stateBackupDir, this.serverStateDir, { recursive: true });
    if (this.stateUrl !== undefined) await this.#copyDatabase("restore");
  }

  get #stateBackupDir(): string {
    return join(this.dir, "server-state.backup");
  }

  /** Copy the state database to its backup database, or back. */
  async #copyDatabase(direction: "backup" | "restore"): Promise<void> {
    const admin = process.env[TEST_POSTGRES_ADMIN_URL_ENV];
    const state = this.stateUrl;
    if (!admin || state === undefined) {
      throw new Error(`a backup of a PostgreSQL state needs ${TEST_POSTGRES_ADMIN_URL_ENV} (the PostgreSQL pass)`);
    }
    const { copyDatabaseAt, siblingDatabaseUrl } = await import("../../../../scripts/test-support/postgres.js");
    const backup = siblingDatabaseUrl(state, "backup");
    if (direction === "backup") await copyDatabaseAt(admin, state, backup);
    else await copyDatabaseAt(admin, backup, state);
  }

  /** The Server's state dir (its SQLite database and server secret). */
  get serverStateDir(): string {
    return join(this.dir, "server-state");
  }

  async killServer(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    if (this.inproc) {
      await this.inproc.close();
      this.inproc = null;
    }
    const child = this.serverChild;
    if (child) {
      this.serverChild = null;
      await child.signal(signal);
    }
  }

  async startRunner(
    id: string,
    args: string[] = [],
    env: Record<string, string> = {},
    opts: { waitOnline?: boolean } = {},
  ): Promise<void> {
    if (this.runnerProcs.has(id)) throw new Error(`runner ${id} already running`);
    const projects = this.#projectsOf(id);
    // A restart: until the Server has seen the killed process's link close, its projects still read online,
    // and "online" would be the old link's (the new one is refused while the old one looks live).
    if (this.#startedOnce.has(id) && opts.waitOnline !== false) await this.#waitLinkGone(id, projects);
    this.#startedOnce.add(id);
    const child = startRunnerProcess(join(this.dir, `runner-${id}.toml`), {
      args,
      cwd: this.dir,
      env: { ...process.env, ...env, WEBCODEX_RUNNER_TOKEN: this.tokens.get(id) ?? "" },
      outputLimit: LOG_CHARS,
      stopGraceMs: STOP_GRACE_MS,
      onOutput: () => this.logs.set(id, child.output()),
    });
    this.runnerProcs.set(id, child);
    if (opts.waitOnline === false) return;
    await this.#pollProjects(projects, true, `runner ${id} online`, () => {
      if (child.exitCode !== null) throw new Error(`runner ${id} exited ${child.exitCode}: ${child.output()}`);
    });
  }

  /** An MCP SDK client over Streamable HTTP for a config principal (its inline token). Closed by stop(). */
  async mcp(principalId: string): Promise<Client> {
    const token = this.principalTokens.get(principalId);
    if (!token) throw new Error(`no token for principal ${principalId}`);
    const client = new Client({ name: "webcodex-proc-stack", version: "0" });
    await client.connect(
      new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${this.port}/mcp`), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } },
      }),
    );
    this.#clients.push(client);
    return client;
  }

  /** Waits for a Runner that ends on its own (a failpoint's SIGKILL) and forgets it; returns how it ended. */
  async runnerExit(id: string): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    const child = this.runnerProcs.get(id);
    if (!child) throw new Error(`runner ${id} is not running`);
    const exit = await child.exited;
    this.runnerProcs.delete(id);
    return exit;
  }

  async killRunner(id: string, signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const child = this.runnerProcs.get(id);
    if (!child) return;
    this.runnerProcs.delete(id);
    await child.stop(signal);
  }

  /** Until the Server shows offline the projects only runner `id` serves (no other running Runner has them). */
  async #waitLinkGone(id: string, projects: string[]): Promise<void> {
    const others = new Set(
      this.opts.runners.filter((r) => r.id !== id && this.runnerProcs.has(r.id)).flatMap((r) => r.projects),
    );
    const own = projects.filter((p) => !others.has(p));
    if (own.length > 0) await this.#pollProjects(own, false, `runner ${id}'s previous link dropped`);
  }

  /** Until the Server shows every project of runner `id` online again (after a reconnect). */
  async waitOnline(id: string): Promise<void> {
    await this.#pollProjects(this.#projectsOf(id), true, `runner ${id} online again`);
  }

  async waitOffline(id: string): Promise<void> {
    await this.#pollProjects(this.#projectsOf(id), false, `runner ${id} offline`);
  }

  #projectsOf(id: string): string[] {
    return this.opts.runners.find((r) => r.id === id)?.projects ?? [];
  }

  /**
   * Until the Server shows every one of `projects` online (or every one offline), as `alice` sees them.
   * `check` runs before each look and may throw to stop waiting (a Runner that already exited).
   */
  async #pollProjects(projects: string[], online: boolean, what: string, check?: () => void): Promise<void> {
    await poll(
      async () => {
        check?.();
        const views = await this.projects("alice");
        return projects.every((p) => (views.find((v) => v.project_id === p)?.runner_online ?? false) === online);
      },
      { timeoutMs: DAEMON_WAIT_MS, intervalMs: DAEMON_POLL_MS, what },
    );
  }

  #principal(id: string): Principal {
    const p = principalFromConfig(loadServerConfig(this.serverConfigFile), id);
    if (!p) throw new Error(`no principal ${id}`);
    return p;
  }

  async #post<T>(op: string, principalId: string, input: unknown): Promise<ApiResult<T>> {
    const res = await fetch(`http://127.0.0.1:${this.port}/__test/runs/${op}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ principal_id: principalId, input }),
    });
    if (res.status !== 200) throw new Error(`test api ${op}: HTTP ${res.status} ${await res.text()}`);
    return (await res.json()) as ApiResult<T>;
  }

  async projects(principalId: string): Promise<ProjectView[]> {
    if (this.inproc) return this.inproc.runs.listProjects(this.#principal(principalId));
    try {
      const res = await fetch(`http://127.0.0.1:${this.port}/__test/projects?principal_id=${principalId}`);
      return (await res.json()) as ProjectView[];
    } catch {
      return [];
    }
  }

  start(principalId: string, input: StartInput): Promise<ApiResult<StartOutput>> {
    if (this.inproc) return this.inproc.runs.start(this.#principal(principalId), input);
    return this.#post("start", principalId, input);
  }

  observe(principalId: string, input: ObserveInput): Promise<ApiResult<ObserveOutput>> {
    if (this.inproc) return this.inproc.runs.observe(this.#principal(principalId), input);
    return this.#post("observe", principalId, input);
  }

  cancel(principalId: string, input: { run_id: string }): Promise<ApiResult<CancelOutput>> {
    if (this.inproc) return this.inproc.runs.cancel(this.#principal(principalId), input);
    return this.#post("cancel", principalId, input);
  }

  /** Observes the run as `principalId` (2 s long polls) until its state is terminal; returns that observation. */
  untilTerminal(runId: string, principalId = "alice", timeoutMs = 30_000): Promise<ObserveOutput> {
    return poll(
      async () => {
        const o = okValue(await this.observe(principalId, { run_id: runId, wait_secs: 2 }));
        return isTerminalState(o.state) ? o : undefined;
      },
      { timeoutMs, intervalMs: DAEMON_POLL_MS, what: `run ${runId} terminal` },
    );
  }

  /** Starts `prompt` as alice on project demo with the fake agent (idempotency key `key`) and waits for its end. */
  async runToEnd(key: string, prompt = "scenario: hello"): Promise<ObserveOutput> {
    const started = okValue(
      await this.start("alice", { project_id: "demo", provider_id: "fake", idempotency_key: key, prompt }),
    );
    return this.untilTerminal(started.run_id);
  }

  async stop(): Promise<void> {
    for (const c of this.#clients.splice(0)) await c.close().catch(() => {});
    for (const id of [...this.runnerProcs.keys()]) await this.killRunner(id, "SIGTERM");
    await this.killServer("SIGTERM");
    const survivors = processesMentioning(this.dir);
    killProcesses(survivors);
    if (!process.env.WEBCODEX_KEEP_STACK) rmSync(this.dir, { recursive: true, force: true });
    if (survivors.length > 0) throw new Error(`processes outlived the stack: ${survivors.join(", ")}`);
  }
}

export function okValue<T>(r: ApiResult<T>): T {
  if (!r.ok) throw new Error(`expected ok, got ${JSON.stringify(r.error)}`);
  return r.value;
}
