/**
 * Issue 20 §1: `webcodex-runner check --probe ID` ends with a verdict — the
 * effective mode after the forced config, a warning when that mode is known
 * to ask for permissions (per-agent table) or when nobody forced an
 * advertised mode, warnings about commonly needed env that is not mapped —
 * never printing env values. The fake agent mimics the real adapters' names.
 */
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, test } from "vitest";
import { RUNNER_BIN as BIN, FAKE_AGENT_BIN } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";
import { makeWorkspace } from "../support/harness.js";

const run = promisify(execFile);
const ws = makeWorkspace();
afterAll(() => ws.cleanup());
const SECRET = canary("api-key");

const CLAUDE = ["--agent-name", "@agentclientprotocol/claude-agent-acp", "--config-options", "mode,model"];
const CLAUDE_MODES = ["--mode-values", "default,acceptEdits,plan,auto"];
const CODEX = ["--agent-name", "@agentclientprotocol/codex-acp", "--config-options", "mode", "--mode-values"];

interface Entry {
  id: string;
  args: string[];
  forced?: Record<string, string>;
  env?: Record<string, string>;
}
const entries: Entry[] = [
  { id: "claude-default", args: [...CLAUDE, ...CLAUDE_MODES] },
  {
    id: "claude-ok",
    args: [...CLAUDE, ...CLAUDE_MODES],
    forced: { mode: "acceptEdits" },
    env: { PATH: "PATH", HOME: "HOME", ANTHROPIC_API_KEY: "WC_PROBE_SECRET" },
  },
  {
    id: "codex-ww",
    args: [...CODEX, "read-only,workspace-write,agent"],
    forced: { mode: "workspace-write" },
    env: { PATH: "PATH", HOME: "HOME", OPENAI_API_KEY: "WC_PROBE_SECRET" },
  },
  { id: "unsatisfiable", args: [...CLAUDE, ...CLAUDE_MODES], forced: { mode: "bypassPermissions" } },
  {
    id: "gemini-like",
    args: ["--agent-name", "gemini-cli", "--session-modes", "default,autoEdit,yolo,plan"],
    env: { PATH: "PATH", HOME: "HOME", GEMINI_API_KEY: "WC_PROBE_SECRET" },
  },
  { id: "generic", args: ["--config-options", "mode"], env: { PATH: "PATH", HOME: "HOME" } },
  {
    id: "copilot-like",
    args: ["--agent-name", "Copilot", "--auth-required"],
    env: { PATH: "PATH", HOME: "HOME", GITHUB_TOKEN_CANARY: "WC_PROBE_SECRET" },
  },
  {
    id: "pi-like",
    args: ["--agent-name", "pi-acp", "--session-modes", "medium,low,high"],
    env: { PATH: "PATH", HOME: "HOME" },
  },
];
const lines = [
  "[[projects]]",
  'id = "demo"',
  `root = ${JSON.stringify(ws.projectRoot)}`,
  "[acp]",
  "agents_share_runner_user = true",
  "setup_timeout_secs = 20",
];
for (const e of entries) {
  lines.push("[[acp.agents]]", `id = "${e.id}"`, `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`);
  lines.push(`args = ${JSON.stringify(e.args)}`);
  lines.push("[acp.agents.forced_config]");
  for (const [k, v] of Object.entries(e.forced ?? {})) lines.push(`${k} = ${JSON.stringify(v)}`);
  lines.push("[acp.agents.env_from_env]");
  for (const [k, v] of Object.entries(e.env ?? { PATH: "PATH" })) lines.push(`${k} = ${JSON.stringify(v)}`);
}
const CONFIG = join(ws.dir, "probe.toml");
writeFileSync(CONFIG, `${lines.join("\n")}\n`);

async function probe(id: string) {
  const env = { ...process.env, WC_PROBE_SECRET: SECRET };
  try {
    const { stdout, stderr } = await run(process.execPath, [BIN, "check", "--config", CONFIG, "--probe", id], {
      env,
      timeout: 60_000,
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe("check --probe verdict", () => {
  test("claude-agent-acp left in its default mode: not forced, known to ask, HOME and the API key not mapped", async () => {
    const { code, stdout } = await probe("claude-default");
    expect(code).toBe(0);
    expect(stdout).toContain("verdict (claude-agent-acp): effective mode default (config option mode, not forced)");
    expect(stdout).toMatch(
      /warning: the agent advertises a mode option \(mode, now default\) and no forced_config sets it/,
    );
    expect(stdout).toMatch(/warning: mode default is known to ask for permissions \(claude-agent-acp: default, plan\)/);
    expect(stdout).toContain('force mode = "acceptEdits" in [acp.agents.forced_config]');
    expect(stdout).toMatch(/warning: env: HOME not mapped/);
    expect(stdout).toMatch(
      /warning: env: ANTHROPIC_API_KEY \/ ANTHROPIC_AUTH_TOKEN \/ CLAUDE_CODE_OAUTH_TOKEN not mapped/,
    );
  });

  test("claude-agent-acp with mode forced to acceptEdits and its env mapped: applied, verified, no warnings, no values printed", async () => {
    const { code, stdout, stderr } = await probe("claude-ok");
    expect(code).toBe(0);
    expect(stdout).toContain('mode = "acceptEdits"  (agent)');
    expect(stdout).toContain("applied and verified on the live session, as a run would");
    expect(stdout).toContain("verdict (claude-agent-acp): effective mode acceptEdits (config option mode, forced)");
    expect(stdout).toContain("no warnings");
    expect(`${stdout}${stderr}`).not.toContain(SECRET);
  });

  test("codex-acp forced to workspace-write: the forced mode is applied and still warned about", async () => {
    const { code, stdout } = await probe("codex-ww");
    expect(code).toBe(0);
    expect(stdout).toContain("verdict (codex-acp): effective mode workspace-write (config option mode, forced)");
    expect(stdout).toMatch(
      /warning: mode workspace-write is known to ask for permissions \(codex-acp: read-only, workspace-write\)/,
    );
    expect(stdout).not.toMatch(/warning: env:/);
  });

  test("a forced value the live session does not offer: NOT satisfiable, exit 1", async () => {
    const { code, stdout } = await probe("unsatisfiable");
    expect(code).toBe(1);
    expect(stdout).toContain('NOT satisfiable: The agent does not offer the forced value of config option "mode".');
    expect(stdout).toMatch(
      /warning: the forced config cannot be applied .*every run would fail forced_config_unsatisfied/,
    );
  });

  test("gemini-cli-like session modes: effective mode from session/new, known to ask, the relaunch switch not mapped", async () => {
    const { code, stdout } = await probe("gemini-like");
    expect(code).toBe(0);
    expect(stdout).toContain(
      "verdict (gemini-cli): effective mode default (session mode; not settable by forced_config)",
    );
    expect(stdout).toMatch(
      /warning: mode default is known to ask for permissions \(gemini-cli: default, plan\).*--approval-mode=auto_edit/,
    );
    expect(stdout).toMatch(/warning: env: GEMINI_CLI_NO_RELAUNCH not mapped/);
  });

  test("an unknown agent with a mode option nobody forced gets the generic warning only", async () => {
    const { code, stdout } = await probe("generic");
    expect(code).toBe(0);
    expect(stdout).toContain("verdict: effective mode ask (config option mode, not forced)");
    expect(stdout).toMatch(/warning: the agent advertises a mode option \(mode, now ask\)/);
    expect(stdout).not.toMatch(/known to ask/);
    expect(stdout).not.toMatch(/warning: env:/);
  });

  test("session/new refused with ACP auth_required: what initialize advertised, the auth methods by kind, that the Runner never authenticates, the credential names to map — exit 1", async () => {
    const { code, stdout, stderr } = await probe("copilot-like");
    expect(code).toBe(1);
    expect(stdout).toContain("  agent: Copilot 0.1.0");
    expect(stdout).toContain("  auth methods: fake-terminal-login, fake-api-key");
    expect(stderr).toContain(
      "probe copilot-like failed at session_new: session/new refused: the agent requires authentication (ACP auth_required, -32000); it advertises auth methods fake-terminal-login (terminal login), fake-api-key (authenticate).",
    );
    expect(stderr).toContain("The Runner never sends authenticate and runs no terminal login");
    expect(stderr).toContain("(copilot: COPILOT_GITHUB_TOKEN / GH_TOKEN / GITHUB_TOKEN / COPILOT_PROVIDER_BASE_URL)");
    expect(`${stdout}${stderr}`).not.toContain(SECRET);
  });

  test("pi-acp's session modes are thinking levels: no effective permission mode, and the warning says it asks for nothing", async () => {
    const { code, stdout } = await probe("pi-like");
    expect(code).toBe(0);
    expect(stdout).toContain("verdict (pi-acp): effective mode (the agent advertises no mode)");
    expect(stdout).toMatch(
      /warning: its session modes \(now medium\) are thinking levels, not permission modes: pi asks for no permission/,
    );
    expect(stdout).not.toContain("session mode; not settable");
  });
});
