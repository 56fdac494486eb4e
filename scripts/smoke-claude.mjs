#!/usr/bin/env node
/**
 * `npm run smoke:claude` — opt-in end-to-end smoke against the real
 * claude-agent-acp adapter (Claude Code over ACP), through the full stack
 * (Server + Runner daemons, MCP client). Mirrors smoke:codex.
 *
 * Skipped (exit 0) unless WEBCODEX_SMOKE_CLAUDE_ACP=1. The adapter is the
 * pinned @agentclientprotocol/claude-agent-acp version, installed on demand
 * into .smoke-cache/ with `npm install --prefix`, or an existing install given
 * by WEBCODEX_SMOKE_CLAUDE_ACP_SCRIPT (its dist/index.js) and
 * WEBCODEX_SMOKE_CLAUDE_ACP_NODE.
 *
 * Cases (mode forced to acceptEdits, as examples/agents/claude-agent-acp.toml does):
 *  (c) no credentials — a fresh empty HOME and no key: claude-agent-acp
 *      accepts session/new and fails only at the prompt, so the run ends
 *      `failed` after dispatch with a fixed summary and no provider text (no
 *      agent message, the message one of FAILURE_SUMMARIES). Needs neither
 *      credentials nor network.
 *  (a) coding — the slugify project with fixed acceptance tests; edits only
 *      (acceptEdits approves edits; commands would ask, and WebCodex never
 *      grants); the acceptance tests then pass when run independently.
 *  (b) cancel — cancel during observable progress → cancelled.
 *  (d) two turns — turn 1 is told a fresh code word, turn 2 continues it
 *      (`continue_run_id`: session/resume in Claude Code's own session) and
 *      must answer it; the chain is checked as observe names it (design §17).
 * (a), (b) and (d) run only with ANTHROPIC_API_KEY set (ANTHROPIC_BASE_URL is
 * mapped too when set: a gateway, without a trailing /v1).
 *
 * The agent's environment: PATH (node's directory first), a fresh HOME per
 * agent entry, the key, the quiet switches DISABLE_TELEMETRY,
 * DISABLE_AUTOUPDATER, CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, proxies/CAs.
 */
import { mkdirSync } from "node:fs";
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

const PACKAGE = "@agentclientprotocol/claude-agent-acp";
const PINNED_VERSION = "0.101.0";
const CACHE_DIR = join(ROOT, ".smoke-cache", `claude-agent-acp-${PINNED_VERSION}`);
const PROJECT_CODE = "smoke_code";
const PROJECT_CANCEL = "smoke_cancel";
const PROJECT_FAIL = "smoke_fail";
const PROJECT_CHAT = "smoke_chat";

if (process.env.WEBCODEX_SMOKE_CLAUDE_ACP !== "1") {
  say("smoke:claude skipped — set WEBCODEX_SMOKE_CLAUDE_ACP=1 to run it.");
  say(`  It runs the real ${PACKAGE}@${PINNED_VERSION} adapter through a local Server and Runner`);
  say("  (installed into .smoke-cache/ on first use, or WEBCODEX_SMOKE_CLAUDE_ACP_SCRIPT + _NODE).");
  process.exit(0);
}

const CODING_PROMPT = `Implement \`slugify\` in textutil.py exactly as its docstring describes.
Then add a NEW test file, tests/test_slugify_extra.py, with at least one unittest test case of your own.
Do not modify tests/test_acceptance.py. Only edit files; do not run any commands.`;

const CANCEL_PROMPT = `Write a file notes/steps.md with 300 numbered lines "step N: …", each describing a made-up
refactoring step for this repository in one sentence, then explain the plan in detail.`;

/** The Runner's environment and the two agents' mappings (with and without credentials). */
function agentEnvironments(work, adapter) {
  const home = join(work, "claude-home");
  const emptyHome = join(work, "empty-home");
  mkdirSync(home, { recursive: true });
  mkdirSync(emptyHome, { recursive: true });
  const runnerEnv = {
    ...process.env,
    WEBCODEX_SMOKE_PATH: [dirname(adapter.node), process.env.PATH ?? "/usr/bin:/bin"].join(":"),
    WEBCODEX_SMOKE_HOME: home,
    WEBCODEX_SMOKE_EMPTY_HOME: emptyHome,
    WEBCODEX_SMOKE_ONE: "1",
  };
  const common = {
    PATH: "WEBCODEX_SMOKE_PATH",
    DISABLE_TELEMETRY: "WEBCODEX_SMOKE_ONE",
    DISABLE_AUTOUPDATER: "WEBCODEX_SMOKE_ONE",
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "WEBCODEX_SMOKE_ONE",
  };
  for (const name of PASS_THROUGH) if (process.env[name]) common[name] = name;
  const withCredentials = { ...common, HOME: "WEBCODEX_SMOKE_HOME" };
  for (const name of ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]) if (process.env[name]) withCredentials[name] = name;
  const withoutCredentials = { ...common, HOME: "WEBCODEX_SMOKE_EMPTY_HOME" };
  return { runnerEnv, withCredentials, withoutCredentials };
}

function startClaudeStack(stack, adapter, version) {
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
mode = "acceptEdits"
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
${agent("claude", `Claude Code (claude-agent-acp ${version})`, envs.withCredentials)}
${agent("claude_nocreds", `Claude Code without credentials (claude-agent-acp ${version})`, envs.withoutCredentials)}`,
  });
}

async function caseNoCredentials(stack) {
  const summaries = await fixedSummaries();
  const result = await runCase(stack, {
    project: PROJECT_FAIL,
    provider: "claude_nocreds",
    prompt: "Say hello.",
    timeoutSecs: 300,
  });
  const { final, kinds } = result;
  const problems = [];
  if (final.state !== "failed") problems.push(`state is ${final.state}, expected failed`);
  // Not not_started: this adapter accepts session/new without credentials, so the prompt was dispatched.
  if (final.execution_state === "not_started")
    problems.push("execution_state is not_started: the adapter now refuses session/new without credentials");
  if (!final.failure_kind) problems.push("no failure_kind");
  const fixed = summaries.some((summary) => (final.message ?? "").startsWith(summary));
  if (!fixed) problems.push("the message is not one of the fixed failure summaries");
  if ((kinds.agent_message ?? 0) > 0 || (kinds.reasoning ?? 0) > 0)
    problems.push("provider text was streamed (agent_message / reasoning events)");
  return { result, problems, detail: fixed ? `summary: "${final.message}"` : "" };
}

async function caseCoding(stack) {
  const dir = join(stack.work, PROJECT_CODE);
  const before = sha256File(join(dir, "tests", "test_acceptance.py"));
  const result = await runCase(stack, {
    project: PROJECT_CODE,
    provider: "claude",
    prompt: CODING_PROMPT,
    timeoutSecs: 900,
  });
  const { final, kinds } = result;
  const problems = [];
  if (final.state !== "completed" || final.stop_reason !== "end_turn")
    problems.push(`ended ${final.state}/${final.stop_reason ?? "-"}, expected completed/end_turn`);
  if ((kinds.tool_activity ?? 0) === 0) problems.push("no tool_activity events");
  if ((kinds.permission_request ?? 0) > 0) problems.push("it asked for permissions although acceptEdits was forced");
  const project = codingProblems(dir, before);
  problems.push(...project.problems);
  return { result, problems, detail: project.extra.length > 0 ? `new test files: ${project.extra.join(", ")}` : "" };
}

async function caseCancel(stack) {
  const result = await runCase(stack, {
    project: PROJECT_CANCEL,
    provider: "claude",
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
  return twoTurnCase(stack, { project: PROJECT_CHAT, provider: "claude", timeoutSecs: 600 });
}

async function main() {
  const adapter = resolveAdapter({
    pkg: PACKAGE,
    version: PINNED_VERSION,
    cacheDir: CACHE_DIR,
    prefix: "WEBCODEX_SMOKE_CLAUDE_ACP",
    entry: "dist/index.js",
  });
  const version = verifyAdapter(adapter, { pkg: PACKAGE, version: PINNED_VERSION });
  say(`smoke:claude — ${PACKAGE}@${version} (${adapter.source}), node ${adapter.node}`);
  const skip = process.env.ANTHROPIC_API_KEY ? undefined : "ANTHROPIC_API_KEY is not set";
  await runSmoke({
    name: "smoke:claude",
    start: (stack) => startClaudeStack(stack, adapter, version),
    cases: [
      ["c", "no credentials: failed after dispatch, fixed summary, no provider text", caseNoCredentials, undefined],
      ["a", "coding task (mode acceptEdits)", caseCoding, skip],
      ["b", "cancel during progress", caseCancel, skip],
      ["d", "two turns: turn 2 continues turn 1 and recalls its code word", caseTwoTurns, skip],
    ],
  });
}

main().catch((err) => {
  say(`smoke:claude failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});
