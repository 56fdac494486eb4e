#!/usr/bin/env node
/**
 * `npm start`: the WebCodex demo stack on this machine.
 *
 * Creates (or reuses) a state folder — by default .webcodex/demo/, or
 * $WEBCODEX_DEMO_DIR — holding the Server and Runner state, a demo Git
 * project copied from examples/demo-project, generated configs, a Runner
 * token and a demo principal token with the scopes the README's examples
 * use (DEMO_SCOPES), every file mode 0600. Starts the Server
 * and a Runner as child processes with prefixed logs, waits until the Runner
 * is connected, then prints the MCP URL, the token, a ready-to-paste MCP
 * client config, a few `webcodex` commands and the operator console's URL
 * with a key of the separate operator principal (OPERATOR_ID, operator:read only). Ctrl-C stops both cleanly,
 * also when the reader of its output is gone (`npm start | tee log`).
 *
 * Re-running reuses everything (runs from last time stay observable).
 * server.toml and runner.toml are regenerated at every start (their first line
 * says so); settings of the operator's own go in overrides/server.toml and
 * overrides/runner.toml in the state folder, which the demo only reads and
 * merges over what it generates (mergeOverrides).
 * Environment: WEBCODEX_DEMO_DIR (state folder), WEBCODEX_DEMO_PORT
 * (Server port, default 7420; 0 picks a free one), WEBCODEX_DEMO_WORKSPACE
 * (the demo project's `workspace`: `shared`, the default, or `worktree`: a git
 * worktree and a recorded change per run; read at every start), NO_COLOR,
 * WEBCODEX_PUBLIC_URL (the https origin a tunnel or proxy serves this port at,
 * e.g. https://abc.trycloudflare.com: the OAuth issuer real hosts connect to;
 * kept in the state folder for later starts, an empty value goes back to loopback).
 */
import { execFileSync } from "node:child_process";
import { chmodSync, cpSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join, relative, resolve } from "node:path";
import { parse as parseToml, stringify as stringifyToml } from "smol-toml";
import {
  BINS,
  issuePrincipalToken,
  killGroup,
  newRunnerToken,
  ROOT,
  serverConfigToml,
  sha256Hex,
  startRunner,
  startServer,
  stopInOrder,
  toml,
  waitForRunner,
} from "./local-stack.mjs";

const DEMO_DIR = resolve(process.env.WEBCODEX_DEMO_DIR || join(ROOT, ".webcodex", "demo"));
const PORT = process.env.WEBCODEX_DEMO_PORT === undefined ? 7420 : Number(process.env.WEBCODEX_DEMO_PORT);
const PUBLIC_URL_FILE = join(DEMO_DIR, "public_url");
/** The demo project's `workspace` mode (runner.example.toml [[projects]]), chosen at each start. */
const WORKSPACE_MODES = ["shared", "worktree"];
const WORKSPACE = process.env.WEBCODEX_DEMO_WORKSPACE || "shared";
/** The operator's own settings, merged over the generated configs; the demo never writes here. */
const OVERRIDES_DIR = join(DEMO_DIR, "overrides");
/** The public origin: WEBCODEX_PUBLIC_URL when set (empty: none), else the one a previous start kept. */
const PUBLIC_URL =
  process.env.WEBCODEX_PUBLIC_URL === undefined
    ? readSecret(PUBLIC_URL_FILE) || undefined
    : process.env.WEBCODEX_PUBLIC_URL.replace(/\/$/, "") || undefined;
const HOST = "127.0.0.1";
const PROJECT_ID = "demo";
const PROVIDER_ID = "fake";
const RUNNER_ID = "demo-runner";
const PRINCIPAL_ID = "demo";
/** What the README's examples need: runs (coding_agent:run, project:*) and workflow sessions (runtime:*). */
const DEMO_SCOPES = ["coding_agent:run", "project:read", "project:write", "runtime:read", "runtime:write"];
/** The console's own principal: operator:read and nothing else (it can start no run), kept apart from PRINCIPAL_ID. */
const OPERATOR_ID = "demo-operator";
const OPERATOR_SCOPES = ["operator:read"];

const color = process.stdout.isTTY === true && !process.env.NO_COLOR && process.env.TERM !== "dumb";
const tone = (code, text) => (color ? `\u001b[${code}m${text}\u001b[0m` : text);
const bold = (t) => tone(1, t);
const dim = (t) => tone(2, t);

/**
 * Output that outlives its reader: when the pipe the demo writes into closes (`npm start | tee log`, and
 * Ctrl-C ends tee first), writes stop there and the demo still shuts its daemons down in order.
 */
const closedOutputs = new Set();
for (const stream of [process.stdout, process.stderr]) {
  stream.on("error", (err) => {
    if (err.code !== "EPIPE") throw err;
    closedOutputs.add(stream);
  });
}

function write(stream, text) {
  if (!closedOutputs.has(stream) && !stream.destroyed) stream.write(text);
}

function say(line = "") {
  write(process.stdout, `${line}\n`);
}

function fail(message, hint) {
  write(process.stderr, `${tone(31, "demo:")} ${message}\n${hint ? `  ${hint}\n` : ""}`);
  process.exitCode = 1;
}

// ---- state --------------------------------------------------------------------

/** Every file the demo writes is its owner's alone: tokens, and configs that name the token files. */
function writePrivate(file, text) {
  writeFileSync(file, text, { mode: 0o600 });
  chmodSync(file, 0o600);
}

function writeSecret(file, text) {
  writePrivate(file, `${text}\n`);
}

function readSecret(file) {
  return existsSync(file) ? readFileSync(file, "utf8").trim() : undefined;
}

function prepareProject(projectDir) {
  if (existsSync(projectDir)) return false;
  const source = join(ROOT, "examples", "demo-project");
  if (!existsSync(source))
    throw new Error(`the fixture project ${relative(ROOT, source)} is missing from this checkout`);
  cpSync(source, projectDir, { recursive: true });
  const git = (...args) =>
    execFileSync("git", ["-c", "user.name=WebCodex demo", "-c", "user.email=demo@webcodex.invalid", ...args], {
      cwd: projectDir,
      stdio: "ignore",
    });
  try {
    git("init", "-q");
    git("add", "-A");
    git("commit", "-q", "-m", "Demo project: a small library with a failing test");
  } catch {
    say(dim("  (git is not available: the demo project is not a Git repository; runs work all the same)"));
  }
  return true;
}

/** First line of every config the demo generates. */
const regeneratedHeader = (name) =>
  `# Regenerated by scripts/demo.mjs at every \`npm start\`: edits here are lost. Put your own settings in\n` +
  `# overrides/${name} in this folder: the demo merges it over what it generates (README, "Two commands").\n`;

function isTable(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof Date);
}

function isArrayOfTables(value) {
  return Array.isArray(value) && value.length > 0 && value.every(isTable);
}

/**
 * `override` merged over `generated` (both parsed TOML): tables merge key by key, an array of tables
 * (`[[acp.agents]]`, `[[principals]]`, `[[oauth.clients]]`) gets the override's entries appended, and any other
 * value of the override replaces the generated one.
 */
function mergeOverrides(generated, override) {
  const merged = { ...generated };
  for (const [key, value] of Object.entries(override)) {
    const base = merged[key];
    if (isTable(base) && isTable(value)) merged[key] = mergeOverrides(base, value);
    else if (isArrayOfTables(base) && isArrayOfTables(value)) merged[key] = [...base, ...value];
    else merged[key] = value;
  }
  return merged;
}

/** overrides/NAME parsed, or undefined when there is none; invalid TOML is an error naming the file and line. */
function readOverride(name) {
  const file = join(OVERRIDES_DIR, name);
  if (!existsSync(file)) return undefined;
  try {
    return parseToml(readFileSync(file, "utf8"));
  } catch (err) {
    // smol-toml's TomlError carries the position; its message repeats the text around it.
    const where = Number.isInteger(err?.line) ? ` (line ${err.line}, column ${err.column})` : "";
    const why = (err instanceof Error ? err.message : String(err)).split("\n")[0];
    throw new Error(`${file} is not valid TOML${where}: ${why}`);
  }
}

/** The file the demo writes for `name`: the header, then `generated` as is, or merged with `override`. */
function withOverride(name, generated, override) {
  if (override === undefined) return regeneratedHeader(name) + generated;
  const merged = stringifyToml(mergeOverrides(parseToml(generated), override));
  return `${regeneratedHeader(name)}# Merged with overrides/${name}.\n\n${merged}\n`;
}

function serverConfig(runnerTokenSha256, port) {
  const scopes = DEMO_SCOPES;
  return `# The demo Server.\n${serverConfigToml({
    host: HOST,
    port,
    publicUrl: PUBLIC_URL ?? `http://${HOST}:${port}`,
    runnerId: RUNNER_ID,
    runnerTokenSha256,
    projects: [PROJECT_ID],
    principals: [
      { id: PRINCIPAL_ID, scopes, projects: [PROJECT_ID] },
      { id: OPERATOR_ID, scopes: OPERATOR_SCOPES, projects: [] },
    ],
  })}`;
}

function runnerConfig(serverPort) {
  return `# The demo Runner. See runner.example.toml for every option.
[runner]
state_dir = "runner"

[server]
url = ${toml(`ws://${HOST}:${serverPort}/runner`)}
token_file = "runner.token"

[[projects]]
id = ${toml(PROJECT_ID)}
root = "project"
allow_patch = true
workspace = ${toml(WORKSPACE)}

[acp]
max_concurrent_runs = 2
permission_timeout_secs = 30
# The demo's agent runs as your own OS user, so it could read this Runner's token, stop it and take over its
# link to the Server. Acceptable for a single-user demo on your machine only: a real install sets run_as on
# every agent instead (runner.example.toml, examples/systemd/webcodex-runner.service).
agents_share_runner_user = true

[[acp.agents]]
id = ${toml(PROVIDER_ID)}
name = "Fake agent (scripted, for demos and tests)"
executable = ${toml(process.execPath)}
args = [${toml(BINS.fakeAgent)}, "--config-options", "mode,model"]
allowed_config_options = ["mode", "model"]
`;
}

/** A port that is free right now on HOST. */
function freePort() {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, HOST, () => {
      const { port } = probe.address();
      probe.close(() => resolvePort(port));
    });
  });
}

// ---- child processes ----------------------------------------------------------

/** @type {Map<string, import("node:child_process").ChildProcess>} */
const children = new Map();
let stopping = false;

function formatLog(line) {
  if (!line.startsWith("{")) return line;
  try {
    const { level, time: _time, pid: _pid, hostname: _host, app: _app, name: _name, msg, ...rest } = JSON.parse(line);
    const names = { 10: "trace", 20: "debug", 30: "info", 40: "warn", 50: "error", 60: "fatal" };
    const label = typeof level === "number" ? (names[level] ?? String(level)) : String(level ?? "");
    const fields = Object.entries(rest)
      .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
      .join(" ");
    const shown = level >= 50 ? tone(31, label) : level >= 40 ? tone(33, label) : dim(label);
    return `${shown} ${msg ?? ""}${fields ? ` ${dim(fields)}` : ""}`;
  } catch {
    return line;
  }
}

/** Prints a daemon's output lines with a coloured `[name]` prefix. */
function logLines(name, code) {
  const prefix = tone(code, `[${name}]`.padEnd(9));
  return (line) => say(`${prefix} ${formatLog(line)}`);
}

function watch(name, child) {
  children.set(name, child);
  child.on("exit", (exitCode, signal) => {
    children.delete(name);
    if (!stopping) {
      fail(
        `${name} exited unexpectedly (${signal ?? `code ${exitCode}`}); stopping the demo`,
        "Its log lines above say why.",
      );
      void stopAll();
    }
  });
}

async function stopAll() {
  if (stopping) return;
  stopping = true;
  // Runner first (it drains its agents), then the Server.
  await stopInOrder([children.get("runner"), children.get("server")]);
}

/** Whether the saved token is still active and carries every scope of `scopes` (older demos issued fewer). */
function tokenIsCurrent(serverToml, tokenId, principalId = PRINCIPAL_ID, scopes = DEMO_SCOPES) {
  if (!tokenId) return false;
  try {
    const out = execFileSync(
      process.execPath,
      [BINS.server, "token", "list", "--config", serverToml, "--principal", principalId],
      { cwd: DEMO_DIR, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] },
    );
    return out.split("\n").some((line) => {
      const [id, , listed = ""] = line.split("\t");
      const held = new Set(listed.split(","));
      return id === tokenId && line.trimEnd().endsWith("active") && scopes.every((s) => held.has(s));
    });
  } catch {
    return false;
  }
}

// ---- main ---------------------------------------------------------------------

async function main() {
  for (const [name, file] of Object.entries(BINS)) {
    if (!existsSync(file)) {
      fail(`missing ${relative(ROOT, file)} (${name})`, "Run `npm start` from the repository root: it builds first.");
      return;
    }
  }
  if (!existsSync(BINS.cliLib) || !existsSync(join(ROOT, "packages", "runner", "dist", "main.js"))) {
    fail("the packages are not built", "Run `npm start` (it runs `tsc -b` first) or `npm run build`.");
    return;
  }
  if (!Number.isInteger(PORT) || PORT < 0 || PORT > 65_535) {
    fail(`WEBCODEX_DEMO_PORT must be a port number, got ${process.env.WEBCODEX_DEMO_PORT}`);
    return;
  }

  if (!WORKSPACE_MODES.includes(WORKSPACE)) {
    fail(
      `WEBCODEX_DEMO_WORKSPACE must be one of ${WORKSPACE_MODES.join(", ")}, got ${WORKSPACE}`,
      "`worktree` gives each run a git worktree of its own and records its change (README, Workspaces).",
    );
    return;
  }

  mkdirSync(DEMO_DIR, { recursive: true, mode: 0o700 });
  // Both overrides are read before anything starts, so a broken one stops the demo before it writes a config.
  const overrides = { server: readOverride("server.toml"), runner: readOverride("runner.toml") };
  if (PUBLIC_URL !== undefined && !/^https:\/\/[^/?#@\s]+$/.test(PUBLIC_URL))
    throw new Error(
      `WEBCODEX_PUBLIC_URL must be an https origin such as https://demo.example.com (no path): ${PUBLIC_URL}`,
    );
  if (process.env.WEBCODEX_PUBLIC_URL !== undefined) writeFileSync(PUBLIC_URL_FILE, `${PUBLIC_URL ?? ""}\n`);
  const fresh = !existsSync(join(DEMO_DIR, "server.toml"));
  say(`${bold("WebCodex demo")} ${dim(`· state in ${DEMO_DIR}${fresh ? " (new)" : " (reused)"}`)}`);

  const projectDir = join(DEMO_DIR, "project");
  if (prepareProject(projectDir)) say(dim(`  created the demo Git project in ${projectDir}`));

  const runnerTokenFile = join(DEMO_DIR, "runner.token");
  let runnerToken = readSecret(runnerTokenFile);
  if (!runnerToken) {
    runnerToken = newRunnerToken();
    writeSecret(runnerTokenFile, runnerToken);
  }
  const serverToml = join(DEMO_DIR, "server.toml");
  // OAuth's public_url names the port, so a free port is chosen before the config is written.
  const serverPort = PORT === 0 ? await freePort() : PORT;
  writePrivate(
    serverToml,
    withOverride("server.toml", serverConfig(sha256Hex(runnerToken), serverPort), overrides.server),
  );

  const principalFile = join(DEMO_DIR, "principal.json");
  let principal;
  try {
    principal = JSON.parse(readSecret(principalFile) ?? "null");
  } catch {
    principal = null;
  }
  if (!principal?.token || !tokenIsCurrent(serverToml, principal.token_id)) {
    const issued = issuePrincipalToken({
      configFile: serverToml,
      cwd: DEMO_DIR,
      principal: PRINCIPAL_ID,
      scopes: DEMO_SCOPES,
      projects: [PROJECT_ID],
    });
    principal = { token: issued.token, token_id: issued.token_id };
    writeSecret(principalFile, JSON.stringify(principal));
    say(
      dim(
        `  issued a demo token for principal "${PRINCIPAL_ID}" on project "${PROJECT_ID}": ${DEMO_SCOPES.join(", ")}`,
      ),
    );
  }

  const operatorFile = join(DEMO_DIR, "operator.json");
  let operator;
  try {
    operator = JSON.parse(readSecret(operatorFile) ?? "null");
  } catch {
    operator = null;
  }
  if (!operator?.token || !tokenIsCurrent(serverToml, operator.token_id, OPERATOR_ID, OPERATOR_SCOPES)) {
    const issued = issuePrincipalToken({
      configFile: serverToml,
      cwd: DEMO_DIR,
      principal: OPERATOR_ID,
      scopes: OPERATOR_SCOPES,
      projects: [],
    });
    operator = { token: issued.token, token_id: issued.token_id };
    writeSecret(operatorFile, JSON.stringify(operator));
    say(dim(`  issued an operator key for principal "${OPERATOR_ID}": ${OPERATOR_SCOPES.join(", ")}`));
  }

  const onSignal = () => {
    if (stopping) return;
    say();
    say(dim("stopping the Runner and the Server…"));
    void stopAll().then(() => {
      say(dim("demo stopped; state kept in ") + DEMO_DIR);
      process.exit(process.exitCode ?? 0);
    });
  };
  // SIGHUP: the terminal the demo ran in was closed.
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(signal, onSignal);

  const { port } = await startServer({
    configFile: serverToml,
    cwd: DEMO_DIR,
    onLine: logLines("server", 36),
    onSpawn: (child) => watch("server", child),
  });
  const url = `http://${HOST}:${port}/mcp`;

  const runnerToml = join(DEMO_DIR, "runner.toml");
  writePrivate(runnerToml, withOverride("runner.toml", runnerConfig(port), overrides.runner));
  watch("runner", startRunner({ configFile: runnerToml, cwd: DEMO_DIR, onLine: logLines("runner", 35) }));
  const project = await waitForRunner({
    url,
    token: principal.token,
    projectId: PROJECT_ID,
    shouldStop: () => stopping,
  });
  if (project === undefined || stopping) return;

  const providers = project.providers.map((p) => p.provider_id).join(", ") || "none";
  const mcpConfig = {
    mcpServers: {
      webcodex: { type: "http", url, headers: { Authorization: `Bearer ${principal.token}` } },
    },
  };
  say();
  say(bold("✔ WebCodex demo is running"));
  say(`  MCP URL    ${url}`);
  say(`  token      ${principal.token}`);
  say(`  project    ${PROJECT_ID} (${projectDir}) · providers: ${providers} · workspace: ${WORKSPACE}`);
  say(
    dim(
      "  the demo's agent runs as your own user (agents_share_runner_user = true): it could read the Runner's " +
        "token. Fine for this single-user demo; a real install sets run_as on every agent.",
    ),
  );
  say();
  say(bold("MCP client config") + dim(" (Streamable HTTP with a bearer header; see README for other clients)"));
  say(JSON.stringify(mcpConfig, null, 2));
  say();
  // Clients that only launch local processes (Claude Desktop and others): the stdio bridge, with this node
  // and this checkout's Server binary, forwarding to the URL above with the token from its environment.
  const stdioConfig = {
    mcpServers: {
      webcodex: {
        command: process.execPath,
        args: [BINS.server, "mcp-stdio", "--url", url, "--token-env", "WEBCODEX_TOKEN"],
        env: { WEBCODEX_TOKEN: principal.token },
      },
    },
  };
  say(bold("MCP client config, stdio") + dim(" (clients that launch a local process, e.g. Claude Desktop)"));
  say(JSON.stringify(stdioConfig, null, 2));
  say();
  say(bold("Try it") + dim(" in another terminal, from this folder:"));
  say(`  export WEBCODEX_URL=${url}`);
  say(`  export WEBCODEX_TOKEN=${principal.token}`);
  say(`  npx webcodex status`);
  say(`  npx webcodex run --project ${PROJECT_ID} --provider ${PROVIDER_ID} "scenario: tools"`);
  say(
    `  npx webcodex run --project ${PROJECT_ID} --provider ${PROVIDER_ID} "scenario: slow interval_ms=300 count=200"`,
  );
  say(
    dim("  (press Ctrl-C in that terminal to cancel the slow run; `npx webcodex observe RUN_ID` shows any run again)"),
  );
  say();
  say(bold("Operator console") + dim(" (every Runner, run, refusal and OAuth grant, live; docs/operating.md)"));
  say(`  open       http://${HOST}:${port}/console`);
  say(`  sign in with the operator key   ${operator.token}`);
  say(dim(`    (principal "${OPERATOR_ID}", operator:read only; also in ${operatorFile})`));
  say();
  say(bold("OAuth") + dim(" (hosts that cannot paste a token: point them at the MCP URL; see the server README)"));
  if (PUBLIC_URL) say(`  connector URL for ChatGPT / Claude.ai    ${PUBLIC_URL}/mcp`);
  else say(dim("  (set WEBCODEX_PUBLIC_URL to the https URL a tunnel serves this port at, to connect real hosts)"));
  say(`  access key to type on the consent page   ${principal.token}`);
  say(`  allow a client to be offered coding_agent:run (none is by default):`);
  say(`    npx webcodex-server oauth clients allow-coding-agent-run CLIENT_ID --config ${serverToml}`);
  say(dim(`    (client ids: npx webcodex-server oauth clients list --config ${serverToml})`));
  say();
  say(dim("Ctrl-C here stops the demo. Logs follow."));
}

// Last resort if the demo dies some other way: never leave the daemons behind.
process.on("exit", () => {
  for (const child of children.values()) killGroup(child, "SIGKILL");
});

main().catch((err) => {
  const message = err instanceof Error ? err.message : String(err);
  const portHint =
    PORT === 0
      ? undefined
      : `If port ${PORT} is taken (another demo or Server?), set WEBCODEX_DEMO_PORT to another port, or 0 for any free one.`;
  fail(message, message.includes("Server exited during start-up") ? portHint : undefined);
  void stopAll();
});
