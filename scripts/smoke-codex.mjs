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
 *  (d) two turns — turn 1 is told a fresh code word, turn 2 continues it
 *      (`continue_run_id`: session/resume in codex's own session) and must
 *      answer it; the chain is checked as observe names it (design §17).
 * (a), (b) and (d) run only when credentials seem present (OPENAI_API_KEY,
 * CODEX_API_KEY or $CODEX_HOME/auth.json); otherwise they are reported as
 * skipped with the reason.
 *
 * The agent's environment is mapped explicitly: PATH (with node's directory
 * first), HOME, CODEX_HOME, USER, SHELL, proxy and SSL_CERT variables — and
 * never CODEX_PATH. Provider messages and raw diagnostics are never printed:
 * only states, kinds and counts. Every process is drained, pass or fail.
 */
import { existsSync, mkdirSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import {
  codingProblems,
  envTable,
  fixedSummaries,
  PASS_THROUGH,
  ROOT,
  resolveAdapter,
  runCase,
  runSmoke,
  say,
  sha256File,
  startStack,
  toml,
  twoTurnCase,
  verifyAdapter,
} from "./smoke-lib.mjs";

const PACKAGE = "@agentclientprotocol/codex-acp";
const PINNED_VERSION = "2.6.0";
const CACHE_DIR = join(ROOT, ".smoke-cache", `codex-acp-${PINNED_VERSION}`);
const PROJECT_CODE = "smoke_code";
const PROJECT_CANCEL = "smoke_cancel";
const PROJECT_FAIL = "smoke_fail";
const PROJECT_CHAT = "smoke_chat";

if (process.env.WEBCODEX_SMOKE_CODEX_ACP !== "1") {
  say("smoke:codex skipped — set WEBCODEX_SMOKE_CODEX_ACP=1 to run it.");
  say(`  It runs the real ${PACKAGE}@${PINNED_VERSION} adapter through a local Server and Runner`);
  say("  (installed into .smoke-cache/ on first use, or WEBCODEX_SMOKE_CODEX_ACP_SCRIPT + _NODE).");
  process.exit(0);
}

// ---- environment mapping ----------------------------------------------------------

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

const CODING_PROMPT = `Implement \`slugify\` in textutil.py exactly as its docstring describes.
Then add a NEW test file, tests/test_slugify_extra.py, with at least one unittest test case of your own.
Do not modify tests/test_acceptance.py.
Check your work with: python3 -m unittest discover -s tests -t .`;

const CANCEL_PROMPT = `Run this shell command in the repository and report what it printed:
for i in $(seq 1 300); do echo "step $i"; sleep 1; done`;

// ---- the stack --------------------------------------------------------------------------

function startCodexStack(stack, adapter, version) {
  const envs = agentEnvironments(stack.work, adapter);
  const agent = (id, name, mapping) => `
[[acp.agents]]
id = ${toml(id)}
name = ${toml(name)}
executable = ${toml(adapter.node)}
args = [${toml(adapter.script)}]
allowed_config_options = []
# It advertises session/load and session/resume: runs can be continued (design §17).
continuation = "both"
[acp.agents.forced_config]
# Codex's default sandboxed preset ("Auto review": workspace writes, no network,
# asks only for actions it deems unsafe — which WebCodex never grants), forced
# the way examples/agents/codex-acp.toml does.
mode = "agent"
[acp.agents.env_from_env]
${envTable(mapping)}
`;
  return startStack(stack, {
    projects: [PROJECT_FAIL, PROJECT_CODE, PROJECT_CANCEL, PROJECT_CHAT],
    testProjects: [PROJECT_FAIL, PROJECT_CODE],
    runnerEnv: envs.runnerEnv,
    acpToml: `[acp]
agents_share_runner_user = true   # a throwaway smoke stack: the agent runs as this user
max_concurrent_runs = 2
setup_timeout_secs = 120
permission_timeout_secs = 60
cancel_grace_secs = 30
default_run_timeout_secs = 900
${agent("codex", `Codex (codex-acp ${version})`, envs.withCredentials)}
${agent("codex_nocreds", `Codex without credentials (codex-acp ${version})`, envs.withoutCredentials)}`,
  });
}

// ---- cases --------------------------------------------------------------------------------

async function caseAdapterFailure(stack) {
  const summaries = await fixedSummaries();
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
  const fixed = summaries.some((summary) => (final.message ?? "").includes(summary));
  if (!fixed) problems.push("the message is not one of the fixed failure summaries");
  if ((result.kinds.agent_message ?? 0) > 0)
    problems.push("agent messages were streamed although nothing was dispatched");
  return { result, problems, detail: fixed ? `summary: "${final.message}"` : "" };
}

async function caseCoding(stack) {
  const dir = join(stack.work, PROJECT_CODE);
  const before = sha256File(join(dir, "tests", "test_acceptance.py"));
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
  const project = codingProblems(dir, before);
  problems.push(...project.problems);
  return { result, problems, detail: project.extra.length > 0 ? `new test files: ${project.extra.join(", ")}` : "" };
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

async function caseTwoTurns(stack) {
  return twoTurnCase(stack, { project: PROJECT_CHAT, provider: "codex", timeoutSecs: 600 });
}

// ---- main -----------------------------------------------------------------------------------

async function main() {
  const adapter = resolveAdapter({
    pkg: PACKAGE,
    version: PINNED_VERSION,
    cacheDir: CACHE_DIR,
    prefix: "WEBCODEX_SMOKE_CODEX_ACP",
    entry: "dist/index.js",
  });
  const version = verifyAdapter(adapter, { pkg: PACKAGE, version: PINNED_VERSION });
  say(`smoke:codex — ${PACKAGE}@${version} (${adapter.source}), node ${adapter.node}`);
  const skip = credentialsPresent()
    ? undefined
    : "no credentials found (OPENAI_API_KEY, CODEX_API_KEY or $CODEX_HOME/auth.json)";
  await runSmoke({
    name: "smoke:codex",
    start: (stack) => startCodexStack(stack, adapter, version),
    cases: [
      ["c", "adapter failure before dispatch (no credentials)", caseAdapterFailure, undefined],
      ["a", "coding task", caseCoding, skip],
      ["b", "cancel during progress", caseCancel, skip],
      ["d", "two turns: turn 2 continues turn 1 and recalls its code word", caseTwoTurns, skip],
    ],
  });
}

main().catch((err) => {
  say(`smoke:codex failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});
