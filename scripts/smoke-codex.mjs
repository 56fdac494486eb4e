#!/usr/bin/env node
/**
 * `npm run smoke:codex` — opt-in end-to-end smoke against the real codex-acp
 * adapter, through the full stack (Server + Runner daemons, MCP client).
 *
 * Skipped (exit 0) unless WEBCODEX_SMOKE_CODEX_ACP=1. The adapter is the
 * pinned @agentclientprotocol/codex-acp version, installed on demand into
 * .smoke-cache/ with `npm install --prefix`, or an existing install given by
 * WEBCODEX_SMOKE_CODEX_ACP_SCRIPT (its dist/index.js) and
 * WEBCODEX_SMOKE_CODEX_ACP_NODE (the node to run it with).
 *
 * Cases:
 *  (a) coding — a temp Git project with an unimplemented Python function and
 *      fixed acceptance tests; the agent must implement it, add its own test
 *      file, leave the acceptance tests unchanged and end with end_turn; the
 *      acceptance tests then pass when run independently.
 *  (b) cancel — cancel during observable progress → cancelled.
 *  (c) adapter failure before dispatch — no credentials (empty HOME and
 *      CODEX_HOME) → failed / not_started with a fixed summary. Needs neither
 *      credentials nor network.
 * (a) and (b) run only when credentials seem present (OPENAI_API_KEY,
 * CODEX_API_KEY or $CODEX_HOME/auth.json); otherwise they are reported as
 * skipped with the reason.
 *
 * The agent's environment is mapped explicitly: PATH (with node's directory
 * first), HOME, CODEX_HOME, USER, SHELL, proxy and SSL_CERT variables — and
 * never CODEX_PATH. Provider messages and raw diagnostics are never printed:
 * only states, kinds and counts. Every process is drained, pass or fail.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import {
  BINS,
  descendants,
  issuePrincipalToken,
  newRunnerToken,
  ROOT,
  serverConfigToml,
  sha256Hex,
  startRunner,
  startServer,
  stopInOrder,
  survivorsOf,
  toml,
  waitForRunner,
} from "./local-stack.mjs";

const PACKAGE = "@agentclientprotocol/codex-acp";
const PINNED_VERSION = "2.6.0";
const CACHE_DIR = join(ROOT, ".smoke-cache", `codex-acp-${PINNED_VERSION}`);
const PROJECT_CODE = "smoke_code";
const PROJECT_CANCEL = "smoke_cancel";
const PROJECT_FAIL = "smoke_fail";
const PRINCIPAL = "smoke";

const say = (line = "") => process.stdout.write(`${line}\n`);

if (process.env.WEBCODEX_SMOKE_CODEX_ACP !== "1") {
  say("smoke:codex skipped — set WEBCODEX_SMOKE_CODEX_ACP=1 to run it.");
  say(`  It runs the real ${PACKAGE}@${PINNED_VERSION} adapter through a local Server and Runner`);
  say("  (installed into .smoke-cache/ on first use, or WEBCODEX_SMOKE_CODEX_ACP_SCRIPT + _NODE).");
  process.exit(0);
}

// ---- the adapter ----------------------------------------------------------------

function findPackageJson(start) {
  let dir = dirname(start);
  for (let i = 0; i < 6; i++) {
    const file = join(dir, "package.json");
    if (existsSync(file)) return file;
    dir = dirname(dir);
  }
  return undefined;
}

function resolveAdapter() {
  const script = process.env.WEBCODEX_SMOKE_CODEX_ACP_SCRIPT;
  if (script) {
    const node = process.env.WEBCODEX_SMOKE_CODEX_ACP_NODE;
    if (!node)
      throw new Error(
        "WEBCODEX_SMOKE_CODEX_ACP_SCRIPT needs WEBCODEX_SMOKE_CODEX_ACP_NODE (the node binary to run it)",
      );
    if (!existsSync(script)) throw new Error("WEBCODEX_SMOKE_CODEX_ACP_SCRIPT does not exist");
    if (!existsSync(node)) throw new Error("WEBCODEX_SMOKE_CODEX_ACP_NODE does not exist");
    return { node, script, source: "WEBCODEX_SMOKE_CODEX_ACP_SCRIPT", strictVersion: false };
  }
  const installed = join(CACHE_DIR, "node_modules", ...PACKAGE.split("/"), "dist", "index.js");
  if (!existsSync(installed)) {
    say(`installing ${PACKAGE}@${PINNED_VERSION} into ${CACHE_DIR} …`);
    mkdirSync(CACHE_DIR, { recursive: true });
    const npm = process.platform === "win32" ? "npm.cmd" : "npm";
    const result = spawnSync(
      npm,
      ["install", "--prefix", CACHE_DIR, "--no-audit", "--no-fund", "--loglevel=error", `${PACKAGE}@${PINNED_VERSION}`],
      { stdio: ["ignore", "ignore", "pipe"], encoding: "utf8" },
    );
    if (result.status !== 0 || !existsSync(installed)) {
      throw new Error(
        `npm install of ${PACKAGE}@${PINNED_VERSION} failed (exit ${result.status}); is the registry reachable?`,
      );
    }
  }
  return { node: process.execPath, script: installed, source: ".smoke-cache", strictVersion: true };
}

function verifyAdapter(adapter) {
  const file = findPackageJson(adapter.script);
  if (file === undefined) throw new Error("the adapter's package.json was not found next to its script");
  const meta = JSON.parse(readFileSync(file, "utf8"));
  if (meta.name !== PACKAGE) throw new Error(`the adapter's package.json names ${meta.name}, not ${PACKAGE}`);
  if (meta.version !== PINNED_VERSION) {
    if (adapter.strictVersion) throw new Error(`the cached adapter is ${meta.version}, expected ${PINNED_VERSION}`);
    say(`  note: the given adapter is ${meta.version}; this smoke is pinned to ${PINNED_VERSION}`);
  }
  return meta.version;
}

// ---- environment mapping ----------------------------------------------------------

const PASS_THROUGH = [
  "USER",
  "SHELL",
  "HTTP_PROXY",
  "HTTPS_PROXY",
  "ALL_PROXY",
  "NO_PROXY",
  "http_proxy",
  "https_proxy",
  "all_proxy",
  "no_proxy",
  "SSL_CERT_FILE",
  "SSL_CERT_DIR",
  "NODE_EXTRA_CA_CERTS",
];
const CREDENTIALS = ["OPENAI_API_KEY", "CODEX_API_KEY"];

function realCodexHome() {
  return process.env.CODEX_HOME || join(process.env.HOME || homedir(), ".codex");
}

function credentialsPresent() {
  if (CREDENTIALS.some((name) => process.env[name])) return true;
  return existsSync(join(realCodexHome(), "auth.json"));
}

/**
 * The Runner's environment plus the source variables the agents map from.
 * Only variables that are set are mapped (a mapped source that is missing
 * fails the run before spawn, by design).
 */
function agentEnvironments(work, adapter) {
  const emptyHome = join(work, "empty-home");
  const emptyCodexHome = join(emptyHome, ".codex");
  mkdirSync(emptyCodexHome, { recursive: true });
  const runnerEnv = {
    ...process.env,
    WEBCODEX_SMOKE_PATH: [dirname(adapter.node), process.env.PATH ?? "/usr/bin:/bin"].join(":"),
    WEBCODEX_SMOKE_HOME: process.env.HOME || homedir(),
    WEBCODEX_SMOKE_CODEX_HOME: realCodexHome(),
    WEBCODEX_SMOKE_EMPTY_HOME: emptyHome,
    WEBCODEX_SMOKE_EMPTY_CODEX_HOME: emptyCodexHome,
  };
  delete runnerEnv.CODEX_PATH;
  const common = { PATH: "WEBCODEX_SMOKE_PATH" };
  for (const name of PASS_THROUGH) if (process.env[name]) common[name] = name;
  const withCredentials = { ...common, HOME: "WEBCODEX_SMOKE_HOME", CODEX_HOME: "WEBCODEX_SMOKE_CODEX_HOME" };
  for (const name of CREDENTIALS) if (process.env[name]) withCredentials[name] = name;
  if (!existsSync(join(realCodexHome(), "auth.json")) && CREDENTIALS.some((name) => process.env[name])) {
    // Without a `codex login`, codex-acp authenticates from the API key variable
    // only when told to (the Runner sends no ACP `authenticate`).
    runnerEnv.WEBCODEX_SMOKE_DEFAULT_AUTH_REQUEST = JSON.stringify({ methodId: "api-key" });
    withCredentials.DEFAULT_AUTH_REQUEST = "WEBCODEX_SMOKE_DEFAULT_AUTH_REQUEST";
  }
  const withoutCredentials = {
    ...common,
    HOME: "WEBCODEX_SMOKE_EMPTY_HOME",
    CODEX_HOME: "WEBCODEX_SMOKE_EMPTY_CODEX_HOME",
  };
  return { runnerEnv, withCredentials, withoutCredentials };
}

function envTable(mapping) {
  return Object.entries(mapping)
    .map(([child, source]) => `${child} = ${toml(source)}`)
    .join("\n");
}

// ---- projects -------------------------------------------------------------------------

const ACCEPTANCE_TESTS = `import unittest

from textutil import slugify


class AcceptanceTests(unittest.TestCase):
    def test_punctuation_becomes_one_dash(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_spaces_collapse_and_ends_are_trimmed(self):
        self.assertEqual(slugify("  Many   spaces here  "), "many-spaces-here")

    def test_already_a_slug(self):
        self.assertEqual(slugify("already-a-slug"), "already-a-slug")

    def test_digits_stay(self):
        self.assertEqual(slugify("Top 10 Tips (2024)"), "top-10-tips-2024")

    def test_empty(self):
        self.assertEqual(slugify(""), "")


if __name__ == "__main__":
    unittest.main()
`;

function git(cwd, ...args) {
  execFileSync("git", ["-c", "user.name=WebCodex smoke", "-c", "user.email=smoke@webcodex.invalid", ...args], {
    cwd,
    stdio: "ignore",
  });
}

function makeProject(dir, withTests) {
  mkdirSync(join(dir, "tests"), { recursive: true });
  writeFileSync(
    join(dir, "textutil.py"),
    `def slugify(title: str) -> str:
    """Lower-case \`title\`, turn every run of characters that are not ASCII letters
    or digits into a single '-', and strip '-' from both ends."""
    raise NotImplementedError
`,
  );
  writeFileSync(join(dir, "tests", "__init__.py"), "");
  if (withTests) writeFileSync(join(dir, "tests", "test_acceptance.py"), ACCEPTANCE_TESTS);
  writeFileSync(
    join(dir, "README.md"),
    "# textutil\n\nRun the tests with `python3 -m unittest discover -s tests -t .`\n",
  );
  git(dir, "init", "-q");
  git(dir, "add", "-A");
  git(dir, "commit", "-q", "-m", "textutil: slugify is not implemented yet");
}

const CODING_PROMPT = `Implement \`slugify\` in textutil.py exactly as its docstring describes.
Then add a NEW test file, tests/test_slugify_extra.py, with at least one unittest test case of your own.
Do not modify tests/test_acceptance.py.
Check your work with: python3 -m unittest discover -s tests -t .`;

const CANCEL_PROMPT = `Run this shell command in the repository and report what it printed:
for i in $(seq 1 300); do echo "step $i"; sleep 1; done`;

// ---- the stack --------------------------------------------------------------------------

async function startStack(stack, adapter, version) {
  const { work } = stack;
  const logFile = stack.logFile;
  const log = (name) => (line) => {
    try {
      writeFileSync(logFile, `[${name}] ${line}\n`, { flag: "a" });
    } catch {}
  };
  const envs = agentEnvironments(work, adapter);
  const runnerToken = newRunnerToken();
  const projects = [PROJECT_CODE, PROJECT_CANCEL, PROJECT_FAIL];
  const serverToml = join(work, "server.toml");
  writeFileSync(
    serverToml,
    serverConfigToml({
      port: 0,
      runnerId: "smoke-runner",
      runnerTokenSha256: sha256Hex(runnerToken),
      projects,
      principals: [{ id: PRINCIPAL, scopes: ["coding_agent:run", "project:read", "project:write"], projects }],
    }),
  );
  const { token } = issuePrincipalToken({
    configFile: serverToml,
    cwd: work,
    principal: PRINCIPAL,
    scopes: ["coding_agent:run", "project:read", "project:write"],
    projects,
  });
  stack.token = token;
  const server = await startServer({ configFile: serverToml, cwd: work, onLine: log("server") });
  stack.server = server.child;
  stack.url = `http://127.0.0.1:${server.port}/mcp`;
  writeFileSync(join(work, "runner.token"), `${runnerToken}\n`, { mode: 0o600 });
  const agent = (id, name, mapping) => `
[[acp.agents]]
id = ${toml(id)}
name = ${toml(name)}
executable = ${toml(adapter.node)}
args = [${toml(adapter.script)}]
allowed_config_options = []
[acp.agents.env_from_env]
${envTable(mapping)}
`;
  makeProject(join(work, PROJECT_CODE), true);
  makeProject(join(work, PROJECT_CANCEL), false);
  makeProject(join(work, PROJECT_FAIL), true);
  const runnerToml = join(work, "runner.toml");
  writeFileSync(
    runnerToml,
    `[runner]
state_dir = "runner"
log_level = "info"

[server]
url = ${toml(`ws://127.0.0.1:${server.port}/runner`)}
token_file = "runner.token"

${projects.map((id) => `[[projects]]\nid = ${toml(id)}\nroot = ${toml(join(work, id))}\nallow_patch = true\n`).join("\n")}
[acp]
max_concurrent_runs = 2
setup_timeout_secs = 120
permission_timeout_secs = 60
cancel_grace_secs = 30
default_run_timeout_secs = 900

# Hold codex-acp to its default sandboxed preset ("Auto review": workspace
# writes, no network, asks only for actions it deems unsafe — which WebCodex
# never grants). A Runner operator would force this the same way.
[acp.forced_config]
mode = "agent"
${agent("codex", `Codex (codex-acp ${version})`, envs.withCredentials)}
${agent("codex_nocreds", `Codex without credentials (codex-acp ${version})`, envs.withoutCredentials)}`,
  );
  stack.runner = startRunner({ configFile: runnerToml, cwd: work, env: envs.runnerEnv, onLine: log("runner") });
  const runnerExited = () => stack.runner.exitCode !== null || stack.runner.signalCode !== null;
  await waitForRunner({ url: stack.url, token, projectId: PROJECT_FAIL, timeoutMs: 60_000, shouldStop: runnerExited });
  if (runnerExited()) throw new Error(`the Runner exited during start-up (its log: ${stack.logFile})`);
}

function trackPids(stack) {
  for (const child of [stack.server, stack.runner]) {
    if (child?.pid === undefined) continue;
    for (const [pid, start] of descendants(child.pid)) stack.pids.set(pid, start);
  }
}

async function stopStack(stack) {
  try {
    trackPids(stack);
  } catch {}
  await stopInOrder([stack.runner, stack.server], 15_000);
  const survivors = survivorsOf(stack.pids);
  if (process.env.WEBCODEX_SMOKE_DEBUG === "1") {
    for (const pid of survivors) {
      try {
        say(`      survivor ${pid}: ${readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")[0]}`);
      } catch {}
    }
  }
  for (const pid of survivors) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {}
  }
  return survivors.length;
}

// ---- cases --------------------------------------------------------------------------------

async function runCase(stack, { project, provider, prompt, timeoutSecs, cancelOnProgress = false }) {
  const { McpRunsClient, followRun } = await import(BINS.cliLib);
  const client = new McpRunsClient({ url: stack.url, token: stack.token });
  const kinds = {};
  let cancelled = false;
  try {
    const start = await client.start({
      project_id: project,
      provider_id: provider,
      idempotency_key: `smoke-${Date.now()}-${Math.random().toString(36).slice(2)}`,
      prompt,
      timeout_secs: timeoutSecs,
    });
    const final = await followRun({
      client,
      runId: start.run_id,
      token: start.observation_token,
      onObservation: (obs) => {
        trackPids(stack);
        for (const event of obs.events) kinds[event.kind] = (kinds[event.kind] ?? 0) + 1;
        const progress = (kinds.agent_message ?? 0) + (kinds.tool_activity ?? 0) + (kinds.reasoning ?? 0);
        if (cancelOnProgress && !cancelled && progress > 0 && obs.state === "running") {
          cancelled = true;
          client.cancel(start.run_id).catch(() => {});
        }
      },
    });
    return { final, kinds, cancelled };
  } finally {
    await client.close();
  }
}

function summarize(result) {
  const { final, kinds } = result;
  const counts = Object.entries(kinds)
    .map(([k, n]) => `${k}×${n}`)
    .join(" ");
  return `${final.state}/${final.execution_state}${final.stop_reason ? ` stop=${final.stop_reason}` : ""}${final.failure_kind ? ` failure=${final.failure_kind}` : ""}${counts ? ` events: ${counts}` : ""}`;
}

async function caseAdapterFailure(stack) {
  const { FAILURE_SUMMARIES } = await import(join(ROOT, "packages", "protocol", "dist", "index.js"));
  const result = await runCase(stack, {
    project: PROJECT_FAIL,
    provider: "codex_nocreds",
    prompt: "Say hello.",
    timeoutSecs: 120,
  });
  const { final } = result;
  const problems = [];
  if (final.state !== "failed") problems.push(`state is ${final.state}, expected failed`);
  if (final.execution_state !== "not_started")
    problems.push(`execution_state is ${final.execution_state}, expected not_started`);
  if (!final.failure_kind) problems.push("no failure_kind");
  const fixed = Object.values(FAILURE_SUMMARIES).some((summary) => (final.message ?? "").includes(summary));
  if (!fixed) problems.push("the message is not one of the fixed failure summaries");
  if ((result.kinds.agent_message ?? 0) > 0)
    problems.push("agent messages were streamed although nothing was dispatched");
  return { result, problems, detail: fixed ? `summary: "${final.message}"` : "" };
}

function sha256File(file) {
  return createHash("sha256").update(readFileSync(file)).digest("hex");
}

async function caseCoding(stack) {
  const dir = join(stack.work, PROJECT_CODE);
  const acceptance = join(dir, "tests", "test_acceptance.py");
  const before = sha256File(acceptance);
  const result = await runCase(stack, {
    project: PROJECT_CODE,
    provider: "codex",
    prompt: CODING_PROMPT,
    timeoutSecs: 900,
  });
  const { final, kinds } = result;
  const problems = [];
  if (final.state !== "completed" || final.stop_reason !== "end_turn")
    problems.push(`ended ${final.state}/${final.stop_reason ?? "-"}, expected completed/end_turn`);
  if ((kinds.agent_message ?? 0) === 0) problems.push("no agent_message events");
  if ((kinds.tool_activity ?? 0) === 0) problems.push("no tool_activity events");
  if (!existsSync(acceptance) || sha256File(acceptance) !== before)
    problems.push("tests/test_acceptance.py was changed");
  const extra = readdirSync(join(dir, "tests")).filter((f) => /^test_.*\.py$/.test(f) && f !== "test_acceptance.py");
  if (extra.length === 0) problems.push("no new test file under tests/");
  if (readFileSync(join(dir, "textutil.py"), "utf8").includes("raise NotImplementedError"))
    problems.push("slugify is still not implemented");
  const tests = spawnSync("python3", ["-m", "unittest", "tests.test_acceptance"], {
    cwd: dir,
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", PYTHONDONTWRITEBYTECODE: "1" },
    stdio: "ignore",
    timeout: 60_000,
  });
  if (tests.status !== 0) problems.push("the acceptance tests fail when run independently");
  return { result, problems, detail: extra.length > 0 ? `new test files: ${extra.join(", ")}` : "" };
}

async function caseCancel(stack) {
  const result = await runCase(stack, {
    project: PROJECT_CANCEL,
    provider: "codex",
    prompt: CANCEL_PROMPT,
    timeoutSecs: 600,
    cancelOnProgress: true,
  });
  const problems = [];
  if (!result.cancelled) problems.push("no observable progress before the run ended, so no cancel was sent");
  if (result.final.state !== "cancelled") problems.push(`ended ${result.final.state}, expected cancelled`);
  return { result, problems, detail: "" };
}

// ---- main -----------------------------------------------------------------------------------

async function main() {
  if (!existsSync(BINS.cliLib) || !existsSync(join(ROOT, "packages", "runner", "dist"))) {
    throw new Error("the packages are not built; run `npm run smoke:codex` (it builds first)");
  }
  const adapter = resolveAdapter();
  const version = verifyAdapter(adapter);
  say(`smoke:codex — ${PACKAGE}@${version} (${adapter.source}), node ${adapter.node}`);
  const haveCredentials = credentialsPresent();
  const work = mkdtempSync(join(tmpdir(), "webcodex-smoke-"));
  const outcomes = [];
  const stack = {
    work,
    logFile: join(work, "daemons.log"),
    server: undefined,
    runner: undefined,
    url: "",
    token: "",
    pids: new Map(),
  };
  let survivors = 0;
  const onSignal = () => {
    say("smoke:codex interrupted; stopping the stack");
    void stopStack(stack).then(() => process.exit(130));
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    await startStack(stack, adapter, version);
    const cases = [
      ["c", "adapter failure before dispatch (no credentials)", caseAdapterFailure, undefined],
      [
        "a",
        "coding task",
        caseCoding,
        haveCredentials ? undefined : "no credentials found (OPENAI_API_KEY, CODEX_API_KEY or $CODEX_HOME/auth.json)",
      ],
      [
        "b",
        "cancel during progress",
        caseCancel,
        haveCredentials ? undefined : "no credentials found (OPENAI_API_KEY, CODEX_API_KEY or $CODEX_HOME/auth.json)",
      ],
    ];
    for (const [id, title, fn, skip] of cases) {
      if (skip !== undefined) {
        outcomes.push({ id, title, status: "skipped", note: skip });
        say(`  (${id}) ${title}: SKIPPED — ${skip}`);
        continue;
      }
      try {
        const { result, problems, detail } = await fn(stack);
        const status = problems.length === 0 ? "passed" : "failed";
        outcomes.push({ id, title, status });
        say(`  (${id}) ${title}: ${status.toUpperCase()} — ${summarize(result)}${detail ? ` · ${detail}` : ""}`);
        for (const problem of problems) say(`      ✗ ${problem}`);
      } catch (err) {
        outcomes.push({ id, title, status: "failed" });
        say(`  (${id}) ${title}: FAILED — ${err instanceof Error ? err.message : String(err)}`);
      }
    }
  } finally {
    survivors = await stopStack(stack);
  }
  if (survivors > 0) {
    say(`  ✗ ${survivors} process(es) outlived the stack and were killed`);
    outcomes.push({ id: "-", title: "process cleanup", status: "failed" });
  }
  const failed = outcomes.filter((o) => o.status === "failed");
  const passed = outcomes.filter((o) => o.status === "passed").length;
  const skipped = outcomes.filter((o) => o.status === "skipped").length;
  say(`smoke:codex: ${passed} passed, ${failed.length} failed, ${skipped} skipped`);
  if (failed.length > 0) {
    say(`  daemon logs (no prompts or agent output): ${join(work, "daemons.log")}`);
    process.exitCode = 1;
  } else {
    rmSync(work, { recursive: true, force: true });
  }
}

main().catch((err) => {
  say(`smoke:codex failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});
