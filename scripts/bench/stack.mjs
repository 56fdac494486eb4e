/**
 * The full stack as real processes: a Server (`webcodex-server run`), optionally
 * a Runner daemon (`webcodex-runner run`) whose agents are the fake agent
 * (plain and behind tap-agent.mjs), configs generated into a temp dir,
 * principal tokens issued through the Server's own CLI
 * (`webcodex-server token issue --json`). Everything listens on 127.0.0.1.
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { promisify } from "node:util";
import { DAEMON_NODE_FLAGS } from "../local-stack.mjs";
import { LedgerReader, sha256 } from "./lib/ledger.mjs";
import { connectMcp } from "./lib/mcp-client.mjs";
import { FAKE_AGENT_BIN, RUNNER_BIN, SERVER_BIN, TAP_AGENT } from "./lib/paths.mjs";
import { killByMarker, spawnTracked, stopTracked } from "./lib/proc.mjs";
import { makeTempDir } from "./lib/tmp.mjs";

const run = promisify(execFile);

/** Commands of the daemons (kept here so a CLI rename is a one-line change). */
export const SERVER_RUN = (config) => [SERVER_BIN, "run", "--config", config];
export const RUNNER_RUN = (config) => [RUNNER_BIN, "run", "--config", config];
export const TOKEN_ISSUE = (config, principal, projects) => [
  SERVER_BIN,
  "token",
  "issue",
  "--config",
  config,
  "--principal",
  principal,
  "--scope",
  "coding_agent:run",
  "--scope",
  "project:write",
  "--scope",
  "project:read",
  ...projects.flatMap((p) => ["--project", p]),
  "--allow-coding-agent-run",
  "--json",
];

const toml = (value) => JSON.stringify(value);
/** The Server's `[server] max_connections` in the bench (the default 1000 is below the largest fan-out cell). */
const BENCH_MAX_CONNECTIONS = 4096;

export async function freePort() {
  return await new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function tail(file, lines = 15) {
  try {
    return readFileSync(file, "utf8").split("\n").slice(-lines).join("\n");
  } catch {
    return "(no log)";
  }
}

/**
 * @param {object} o
 * @param {string} o.label temp dir label
 * @param {boolean} [o.runner] start a real Runner daemon with the fake agent (project "bench")
 * @param {number} [o.simRunners] extra runner bindings "sim0..simN-1" owning projects "p0..pN-1"
 * @param {number} [o.principals] principals to declare and issue tokens for
 * @param {string[]} [o.nodeArgs] extra node flags for the daemons (e.g. --cpu-prof)
 * @param {string[]} [o.principalProjects] the projects the principals may use (default: every project)
 * @param {number} [o.maxConnections] the Servers' `[server] max_connections` (default BENCH_MAX_CONNECTIONS)
 * @param {boolean} [o.clusterListener] on PostgreSQL: each instance serves `/_wc/` on a listener of its own
 *   (`[server.cluster] listen_port = 0`); false: on the clients' one (`serve_on_client_listener = true`)
 * @param {string} [o.serverToml] more Server config tables, appended (e.g. `[server.webhooks] …`)
 * @param {{id: string, root: string, workspace?: "shared" | "worktree"}[]} [o.extraProjects] more projects of the
 *   Runner (absolute roots, made by the caller), granted to its binding and to every principal
 * @param {string} [o.runnerSettings] more keys of the Runner's `[runner]` table (e.g. `workspace_keep_secs = 0`)
 */
/** The env var a bench Server config's `[server.state] url_env` names when the stack runs on PostgreSQL. */
const BENCH_DATABASE_URL_ENV = "WEBCODEX_BENCH_DATABASE_URL";

/**
 * `stateUrl`: keep the Server's state in that PostgreSQL database (`[server.state] backend = "postgres"`)
 * instead of the SQLite file; the token CLI and the Server get the URL through BENCH_DATABASE_URL_ENV.
 * `keepAgentAliveSecs`: the Runner's `[acp] keep_agent_alive_secs`, and one more agent, `fake-continue`, whose
 * sessions persist in the stack's dir so a run can be continued (design §17; the follow-up cell).
 */
export async function launchStack({
  label,
  runner = true,
  simRunners = 0,
  principals = 1,
  nodeArgs = {},
  stateUrl = undefined,
  principalProjects = undefined,
  maxConnections = BENCH_MAX_CONNECTIONS,
  clusterListener = false,
  keepAgentAliveSecs = undefined,
  serverToml = "",
  extraProjects = [],
  runnerSettings = "",
}) {
  // `stack.addInstance()` (PostgreSQL only) starts another Server on the same database; see below.
  const dir = makeTempDir(label);
  const port = await freePort();
  const serverConfig = join(dir, "server.toml");
  const runnerConfig = join(dir, "runner.toml");
  const ledgerFile = join(dir, "ledger.jsonl");
  const tapFile = join(dir, "tap.jsonl");
  const projectDir = join(dir, "project");
  mkdirSync(projectDir);
  const runnerToken = randomBytes(32).toString("base64url");
  writeFileSync(join(dir, "runner.token"), `${runnerToken}\n`, { mode: 0o600 });

  const sims = Array.from({ length: simRunners }, (_, i) => ({
    runner_id: `sim${i}`,
    project_id: `p${i}`,
    token: randomBytes(32).toString("base64url"),
  }));
  const runnerProjects = runner ? ["bench", ...extraProjects.map((p) => p.id)] : [];
  const projects = [...runnerProjects, ...sims.map((s) => s.project_id)];

  // max_connections: the fan-out's largest cell holds 1,000 long-polls plus the sim runners and control clients.
  let s = `[server]\nhost = "127.0.0.1"\nport = ${port}\nstate_dir = "server-state"\nmax_connections = ${maxConnections}\n\n`;
  if (stateUrl !== undefined) s += `[server.state]\nbackend = "postgres"\nurl_env = "${BENCH_DATABASE_URL_ENV}"\n\n`;
  // Without a listener of its own, /_wc/ shares the clients' one: the explicit opt-in (the default is its own).
  if (stateUrl !== undefined) {
    s += clusterListener
      ? "[server.cluster]\nlisten_port = 0\n\n"
      : "[server.cluster]\nserve_on_client_listener = true\n\n";
  }
  const env = stateUrl === undefined ? process.env : { ...process.env, [BENCH_DATABASE_URL_ENV]: stateUrl };
  if (runner) {
    s += `[[runners]]\nid = "bench"\ntoken_sha256 = ${toml(sha256(runnerToken))}\nprojects = ${toml(runnerProjects)}\n\n`;
  }
  for (const sim of sims) {
    s += `[[runners]]\nid = ${toml(sim.runner_id)}\ntoken_sha256 = ${toml(sha256(sim.token))}\nprojects = [${toml(sim.project_id)}]\n\n`;
  }
  const grants = principalProjects ?? projects;
  const principalIds = Array.from({ length: principals }, (_, i) => `bench-${i}`);
  for (const id of principalIds) {
    s += `[[principals]]\nid = ${toml(id)}\nscopes = ["coding_agent:run", "project:write", "project:read"]\nprojects = ${toml(grants)}\n\n`;
  }
  s += serverToml;
  writeFileSync(serverConfig, s);

  if (runner) {
    const agent = (id, args) =>
      `[[acp.agents]]\nid = ${toml(id)}\nname = ${toml(id)}\nexecutable = ${toml(process.execPath)}\nargs = ${toml(args)}\n` +
      `[acp.agents.env_from_env]\nPATH = "PATH"\nHOME = "HOME"\n\n`;
    const r =
      `[runner]\nstate_dir = "runner-state"\nlog_level = "info"\n${runnerSettings ? `${runnerSettings.trimEnd()}\n` : ""}\n` +
      `[server]\nurl = ${toml(`ws://127.0.0.1:${port}/runner`)}\ntoken_file = "runner.token"\n\n` +
      `[[projects]]\nid = "bench"\nroot = "project"\nallow_patch = true\n\n` +
      extraProjects
        .map(
          (p) =>
            `[[projects]]\nid = ${toml(p.id)}\nroot = ${toml(p.root)}\nallow_patch = true\nworkspace = ${toml(p.workspace ?? "shared")}\n\n`,
        )
        .join("") +
      `[acp]\nagents_share_runner_user = true\nmax_concurrent_runs = 4\nsetup_timeout_secs = 30\ncancel_grace_secs = 5\n` +
      (keepAgentAliveSecs === undefined ? "" : `keep_agent_alive_secs = ${keepAgentAliveSecs}\n`) +
      "\n" +
      agent("fake", [FAKE_AGENT_BIN, "--ledger", ledgerFile]) +
      agent("fake-tap", [TAP_AGENT, "--tap", tapFile, "--", process.execPath, FAKE_AGENT_BIN, "--ledger", ledgerFile]) +
      (keepAgentAliveSecs === undefined
        ? ""
        : agent("fake-continue", [
            FAKE_AGENT_BIN,
            "--ledger",
            ledgerFile,
            "--continuation",
            "both",
            "--session-dir",
            join(dir, "sessions"),
          ]).replace("[acp.agents.env_from_env]", 'continuation = "both"\n[acp.agents.env_from_env]'));
    writeFileSync(runnerConfig, r);
  }

  // Tokens first (the Server CLI writes only hashes into the state DB). The first
  // call creates the DB alone; the rest run a few at a time.
  const issue = async (id) => {
    const { stdout } = await run(process.execPath, TOKEN_ISSUE(serverConfig, id, grants), {
      cwd: dir,
      env,
      timeout: 60_000,
    });
    return JSON.parse(stdout.trim().split("\n").at(-1)).token;
  };
  const tokens = [];
  if (principalIds.length > 0) tokens.push(await issue(principalIds[0]));
  for (let i = 1; i < principalIds.length; i += 4) {
    tokens.push(...(await Promise.all(principalIds.slice(i, i + 4).map(issue))));
  }

  const handles = {};
  const stack = {
    dir,
    port,
    url: `http://127.0.0.1:${port}/mcp`,
    runnerUrl: `ws://127.0.0.1:${port}/runner`,
    serverConfig,
    runnerConfig,
    env,
    tokens,
    sims,
    ledgerFile,
    tapFile,
    ledger: new LedgerReader(ledgerFile),
    providerId: "fake",
    tapProviderId: "fake-tap",
    projectId: "bench",
    handles,
    pids() {
      const out = {};
      for (const [name, h] of Object.entries(handles)) if (h) out[name] = h.pid;
      return out;
    },
    mcpClient(i = 0, projectId = "bench") {
      return connectMcp({ url: stack.url, token: tokens[i], projectId });
    },
    /**
     * Another Server instance on the same PostgreSQL state (the Runner stays linked to the first): resolves to
     * a view of this stack whose MCP clients talk to the new instance, so a start or an observe through it is
     * forwarded to the first and woken by the database's notifications (design §14).
     */
    async addInstance(name) {
      if (stateUrl === undefined) throw new Error("addInstance needs a stack on PostgreSQL (stateUrl)");
      const extraPort = await freePort();
      const config = join(dir, `server-${name}.toml`);
      writeFileSync(config, readFileSync(serverConfig, "utf8").replace(/^port = \d+$/m, `port = ${extraPort}`));
      handles[`server_${name}`] = spawnTracked(
        process.execPath,
        [...DAEMON_NODE_FLAGS.server, ...(nodeArgs.server ?? []), ...SERVER_RUN(config)],
        { logFile: join(dir, `server-${name}.log`), cwd: dir, env },
      );
      const view = {
        ...stack,
        port: extraPort,
        url: `http://127.0.0.1:${extraPort}/mcp`,
        runnerUrl: `ws://127.0.0.1:${extraPort}/runner`,
        mcpClient(i = 0, projectId = "bench") {
          return connectMcp({ url: view.url, token: tokens[i], projectId });
        },
      };
      await waitForMcp(view, handles[`server_${name}`], join(dir, `server-${name}.log`));
      return view;
    },
    async stop() {
      await stopTracked(handles.runner, 8000);
      for (const [key, handle] of Object.entries(handles)) {
        if (key.startsWith("server_")) await stopTracked(handle, 5000);
      }
      await stopTracked(handles.server, 5000);
      killByMarker(dir);
    },
  };

  try {
    handles.server = spawnTracked(
      process.execPath,
      [...DAEMON_NODE_FLAGS.server, ...(nodeArgs.server ?? []), ...SERVER_RUN(serverConfig)],
      {
        logFile: join(dir, "server.log"),
        cwd: dir,
        env,
      },
    );
    await waitForMcp(stack, handles.server, join(dir, "server.log"));
    if (runner) {
      handles.runner = spawnTracked(
        process.execPath,
        [...DAEMON_NODE_FLAGS.runner, ...(nodeArgs.runner ?? []), ...RUNNER_RUN(runnerConfig)],
        {
          logFile: join(dir, "runner.log"),
          cwd: dir,
        },
      );
      await waitForRunnerOnline(stack, handles.runner, join(dir, "runner.log"));
    }
    return stack;
  } catch (error) {
    await stack.stop();
    throw error;
  }
}

async function waitForMcp(stack, handle, log, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    if (handle.child.exitCode !== null) throw new Error(`server exited (${handle.child.exitCode}):\n${tail(log)}`);
    try {
      const mcp = await stack.mcpClient(0);
      await mcp.close();
      return;
    } catch (error) {
      last = error;
      await sleep(100);
    }
  }
  throw new Error(`server not answering MCP within ${timeoutMs} ms (${last?.message}):\n${tail(log)}`);
}

async function waitForRunnerOnline(stack, handle, log, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  const mcp = await stack.mcpClient(0);
  try {
    while (Date.now() < deadline) {
      if (handle.child.exitCode !== null) throw new Error(`runner exited (${handle.child.exitCode}):\n${tail(log)}`);
      const res = await mcp.client.readResource({ uri: "webcodex://projects" });
      const text = res.contents?.[0]?.text ?? "";
      if (/"runner_online"\s*:\s*true/.test(text)) return;
      await sleep(100);
    }
    throw new Error(`runner not online within ${timeoutMs} ms:\n${tail(log)}`);
  } finally {
    await mcp.close();
  }
}
