/**
 * The full stack for integration tests: a real Server (in-process
 * `startServer` with the real MCP front end, HTTP on 127.0.0.1 port 0), a real
 * Runner daemon as a child process (`webcodex-runner run --config …`) and the
 * fake ACP agent it spawns, each in a temp state dir. Needs a build
 * (`npm run build` / `tsc -b`): the Runner and the fake agent run from dist.
 *
 *   const stack = await startStack({ principals: [{ id: "alice", scopes: [...], projects: ["demo"] }] });
 *   const token = await stack.issueToken("alice", ["coding_agent:run", "project:write"], ["demo"]);
 *   const client = await stack.connect(token);
 *   ...
 *   await stack.stop();   // stops Runner (and its agents) and Server; asserts nothing of ours survives
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { pino } from "pino";
import {
  DAEMON_POLL_MS,
  DAEMON_WAIT_MS,
  type DaemonProcess,
  FAKE_AGENT_BIN,
  killProcesses,
  type LedgerLine,
  poll,
  processesMentioning,
  readLedger,
  startRunnerProcess,
} from "../../../../scripts/test-support/index.js";
import { loadServerConfig, type ServerConfig, sha256Hex } from "../../src/config.js";
import { principalLookup, TokenStore } from "../../src/principals/tokens.js";
import type { Principal, Scope } from "../../src/runs/api.js";
import { type RunningServer, startServer } from "../../src/server.js";
import type { SqlParam } from "../../src/state/engine.js";
import { stateText } from "./in-process.js";
import { STATE_URL_ENV, TEST_POSTGRES_ADMIN_URL_ENV } from "./proc-stack.js";

/** The Runner output `runnerLog()` holds (its tail), across restarts. */
const RUNNER_LOG_CHARS = 64 * 1024;
/** How long stopRunner() gives the Runner after SIGTERM before SIGKILL. */
const RUNNER_STOP_GRACE_MS = 10_000;
/** Bound on the Server seeing a stopped Runner's projects offline. */
const RUNNER_OFFLINE_WAIT_MS = 10_000;

export interface StackPrincipal {
  id: string;
  scopes: Scope[];
  projects: string[];
}

export interface StackProject {
  id: string;
  allow_patch?: boolean;
  /** `worktree`: the project's root is made a git repository with one commit (README.md) first. */
  workspace?: "shared" | "worktree";
}

export interface StackOptions {
  principals: StackPrincipal[];
  /** Projects of the one Runner (default: `demo`, allow_patch). */
  projects?: StackProject[];
  /** Extra `[acp]` keys for the Runner config, e.g. { permission_timeout_secs: 2 }. */
  acp?: Record<string, number>;
  /** Extra args for the fake agent (after --ledger FILE). */
  agentArgs?: string[];
  /** Extra lines of the Runner's `[[acp.agents]]` table (e.g. `continuation = "both"`). */
  agentToml?: string;
  /** Extra env for the Runner process (failpoints …). */
  runnerEnv?: Record<string, string>;
  /** Start the Runner (default true). */
  runner?: boolean;
  /** Level of the Server's log, written to `server.log` in the stack dir (default "debug"). */
  serverLogLevel?: string;
}

export interface Stack {
  /** Temp dir holding every state dir, config and the ledger. */
  readonly dir: string;
  readonly server: RunningServer;
  readonly config: ServerConfig;
  readonly serverConfigFile: string;
  readonly mcpUrl: URL;
  /** The fake agent's ledger: one JSON line per received session/prompt (and notable events). */
  readonly ledgerFile: string;
  /** The Runner child's stdout+stderr (last 64 KiB). */
  readonly runnerLog: () => string;
  /** The in-process Server's pino log (JSON lines). */
  readonly serverLog: () => string;
  /** Issue a principal bearer token directly in the Server's state DB (like `token issue`). */
  issueToken(principalId: string, scopes: Scope[], projects: string[], allowCodingAgentRun?: boolean): Promise<string>;
  /** An SDK Client over Streamable HTTP with this bearer token. Closed by stop(). */
  connect(token: string): Promise<Client>;
  ledger(): LedgerLine[];
  /** Rows of a query on the Server's state, on whichever engine it uses (`?` placeholders). */
  rows<T>(sql: string, params?: readonly SqlParam[]): Promise<T[]>;
  /**
   * Everything the Server's state holds, as text to search for what must not be there: on SQLite the
   * bytes of every file in its state dir (WAL checkpointed); on PostgreSQL every row of every table.
   */
  stateText(): Promise<string>;
  /** Start (or restart) the Runner child and wait until its projects are online. */
  startRunner(): Promise<void>;
  stopRunner(): Promise<void>;
  /** Stop everything, then verify that no process started for this stack survives. */
  stop(): Promise<void>;
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

function toml(value: unknown): string {
  return JSON.stringify(value);
}

export async function startStack(options: StackOptions): Promise<Stack> {
  const dir = mkdtempSync(join(tmpdir(), "wc-stack-"));
  const projects = options.projects ?? [{ id: "demo", allow_patch: true }];
  const runnerToken = `wcr_${randomBytes(24).toString("base64url")}`;
  const ledgerFile = join(dir, "ledger.jsonl");
  const runnerLogFile = join(dir, "runner.log");

  for (const p of projects) mkdirSync(join(dir, "projects", p.id, "src"), { recursive: true });
  for (const p of projects.filter((q) => q.workspace === "worktree")) initRepository(join(dir, "projects", p.id));

  const serverConfigFile = join(dir, "server.toml");
  const principalsToml = options.principals
    .map((p) => `[[principals]]\nid = ${toml(p.id)}\nscopes = ${toml(p.scopes)}\nprojects = ${toml(p.projects)}\n`)
    .join("\n");
  // In the PostgreSQL pass (TEST_POSTGRES_ADMIN_URL_ENV) the Server keeps its state in a fresh database of
  // its own, as the process stacks do (proc-stack.ts), so these suites run on both engines.
  const admin = process.env[TEST_POSTGRES_ADMIN_URL_ENV];
  const stateUrl = admin
    ? await (await import("../../../../scripts/test-support/postgres.js")).createDatabaseAt(admin)
    : undefined;
  // A server CLI the test runs (`token issue` …) reads the same state: it inherits the URL, under a
  // variable of this stack's own (a file may run several stacks at once).
  const urlEnv = `${STATE_URL_ENV}_${randomBytes(6).toString("hex").toUpperCase()}`;
  if (stateUrl !== undefined) process.env[urlEnv] = stateUrl;
  const stateToml = stateUrl === undefined ? "" : `[server.state]\nbackend = "postgres"\nurl_env = "${urlEnv}"\n\n`;
  writeFileSync(
    serverConfigFile,
    `[server]\nhost = "127.0.0.1"\nport = 0\nstate_dir = "server-state"\nheartbeat_interval_ms = 2000\n\n` +
      stateToml +
      `[[runners]]\nid = "local"\ntoken_sha256 = ${toml(sha256Hex(runnerToken))}\nprojects = ${toml(projects.map((p) => p.id))}\n\n` +
      principalsToml,
  );
  const config = loadServerConfig(serverConfigFile);
  const serverLogFile = join(dir, "server.log");
  const logger = pino(
    { level: options.serverLogLevel ?? "debug" },
    pino.destination({ dest: serverLogFile, sync: true, mkdir: true }),
  );
  const env = stateUrl === undefined ? {} : { [urlEnv]: stateUrl };
  const server = await startServer({ config, logger, mcp: true, env });
  if (stateUrl !== undefined && server.store.engine.dialect !== "postgres") {
    await server.close();
    throw new Error("the PostgreSQL pass started a stack whose Server is not on PostgreSQL");
  }
  const mcpUrl = new URL(`${server.url}/mcp`);

  const runnerConfigFile = join(dir, "runner.toml");
  const acp = {
    max_concurrent_runs: 4,
    setup_timeout_secs: 20,
    permission_timeout_secs: 60,
    cancel_grace_secs: 5,
    ...options.acp,
  };
  writeFileSync(
    runnerConfigFile,
    `[runner]\nstate_dir = "runner-state"\nlog_level = "warn"\n\n` +
      `[server]\nurl = ${toml(`ws://127.0.0.1:${server.port}/runner`)}\ntoken_env = "WEBCODEX_RUNNER_TOKEN"\n\n` +
      projects
        .map(
          (p) =>
            `[[projects]]\nid = ${toml(p.id)}\nroot = ${toml(join("projects", p.id))}\nallow_patch = ${p.allow_patch ?? true}\n` +
            (p.workspace ? `workspace = ${toml(p.workspace)}\n` : ""),
        )
        .join("\n") +
      `\n[acp]\nagents_share_runner_user = true\n${Object.entries(acp)
        .map(([k, v]) => `${k} = ${v}`)
        .join("\n")}\n\n` +
      `[[acp.agents]]\nid = "fake"\nname = "Fake agent"\nexecutable = ${toml(FAKE_AGENT_BIN)}\n` +
      `args = ${toml(["--ledger", ledgerFile, ...(options.agentArgs ?? [])])}\nallowed_config_options = ["model"]\n` +
      (options.agentToml ? `${options.agentToml}\n` : "") +
      `[acp.agents.env_from_env]\nPATH = "PATH"\n`,
  );

  const everyone: Principal = {
    id: "__stack__",
    scopes: new Set<Scope>(["project:read"]),
    projects: new Set(projects.map((p) => p.id)),
  };
  const allOnline = async () => (await server.runs.listProjects(everyone)).every((p) => p.runner_online);

  let runner: DaemonProcess | null = null;
  let runnerLog = "";
  const clients: Client[] = [];
  const tokens = new TokenStore(server.store.engine);

  const stack: Stack = {
    dir,
    server,
    config,
    serverConfigFile,
    mcpUrl,
    ledgerFile,
    runnerLog: () => runnerLog,
    serverLog: () => (existsSync(serverLogFile) ? readFileSync(serverLogFile, "utf8") : ""),

    async issueToken(principalId, scopes, projectIds, allowCodingAgentRun = true) {
      const issued = await tokens.issue(
        { principal_id: principalId, scopes, projects: projectIds, allowCodingAgentRun },
        principalLookup(config.principals),
      );
      return issued.token;
    },

    async connect(token) {
      const client = new Client({ name: "webcodex-test", version: "0" });
      await client.connect(
        new StreamableHTTPClientTransport(mcpUrl, { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
      );
      clients.push(client);
      return client;
    },

    ledger() {
      return readLedger(ledgerFile);
    },

    async rows<T>(sql: string, params: readonly SqlParam[] = []) {
      return await server.store.engine.all<T>(sql, params);
    },

    async stateText() {
      return await stateText(server.store, config.stateDir);
    },

    async startRunner() {
      if (runner) throw new Error("runner already running");
      const child = startRunnerProcess(runnerConfigFile, {
        cwd: dir,
        env: { ...process.env, ...options.runnerEnv, WEBCODEX_RUNNER_TOKEN: runnerToken },
        stopGraceMs: RUNNER_STOP_GRACE_MS,
        onOutput: (chunk) => {
          runnerLog = (runnerLog + chunk).slice(-RUNNER_LOG_CHARS);
          writeFileSync(runnerLogFile, runnerLog);
        },
      });
      runner = child;
      await poll(
        async () => {
          if (child.exitCode !== null) throw new Error(`runner exited with ${child.exitCode}:\n${runnerLog}`);
          return await allOnline();
        },
        {
          timeoutMs: DAEMON_WAIT_MS,
          intervalMs: DAEMON_POLL_MS,
          what: () => `the Runner to come online\n${runnerLog}`,
        },
      );
    },

    async stopRunner() {
      const child = runner;
      if (!child) return;
      runner = null;
      await child.stop("SIGTERM");
      await poll(async () => !(await allOnline()), {
        timeoutMs: RUNNER_OFFLINE_WAIT_MS,
        intervalMs: DAEMON_POLL_MS,
        what: "the Runner to go offline",
      });
    },

    async stop() {
      for (const c of clients.splice(0)) await c.close().catch(() => {});
      await stack.stopRunner().catch(() => {});
      await server.close();
      // Agents are the Runner's children; after a graceful Runner stop none may survive.
      const survivors = processesMentioning(dir);
      killProcesses(survivors);
      if (!process.env.WEBCODEX_KEEP_STACK) rmSync(dir, { recursive: true, force: true });
      if (survivors.length > 0) throw new Error(`processes outlived the stack: ${survivors.join(", ")}`);
    },
  };

  try {
    if (options.runner !== false) await stack.startRunner();
  } catch (err) {
    await stack.stop().catch(() => {});
    throw err;
  }
  return stack;
}
