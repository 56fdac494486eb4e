/**
 * Issue 20 §0: `[acp.agents.forced_config]` per agent entry — the Runner-wide
 * `[acp.forced_config]` is a default the agent's own table overrides key by
 * key; values are checked only by type at start, and against the live
 * options at session/new (a run) or by `check --probe`.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { FAKE_AGENT_BIN, readLedger } from "../../../../scripts/test-support/index.js";
import { ConfigError, parseConfig, type RunnerConfig } from "../../src/config/config.js";
import { makeWorkspace, newManager, runToEnd } from "../support/harness.js";

const dir = mkdtempSync(join(tmpdir(), "wc-forced-agent-"));
mkdirSync(join(dir, "proj"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = join(dir, "runner.toml");

function errorsOf(text: string): string[] {
  try {
    parseConfig(text, file);
  } catch (error) {
    if (error instanceof ConfigError) return [...error.errors];
    throw error;
  }
  throw new Error("config was accepted");
}

const head = `[[projects]]\nid = "demo"\nroot = "proj"\nallow_patch = true\n`;
const agent = (id: string, extra = "") =>
  `[[acp.agents]]\nid = "${id}"\nexecutable = ${JSON.stringify(FAKE_AGENT_BIN)}\n${extra}`;

describe("config", () => {
  test("an agent's own table overrides the Runner-wide one key by key; other agents keep the default", () => {
    const config = parseConfig(
      `${head}[acp.forced_config]\nmode = "agent"\nsandbox = true\n${agent("claude")}[acp.agents.forced_config]\nmode = "acceptEdits"\n${agent("codex")}`,
      file,
    );
    const [claude, codex] = config.acp.agents;
    expect(claude?.forcedConfig).toEqual({ mode: "acceptEdits", sandbox: true });
    expect(claude?.ownForcedKeys).toEqual(["mode"]);
    expect(codex?.forcedConfig).toEqual({ mode: "agent", sandbox: true });
    expect(codex?.ownForcedKeys).toEqual([]);
    expect(config.acp.forcedConfig).toEqual({ mode: "agent", sandbox: true });
  });

  test("values are checked by type only; a numeric value, a bad id and a key also allowed are refused with the key path", () => {
    const errors = errorsOf(
      `${head}${agent("a", 'allowed_config_options = ["model"]\n')}[acp.agents.forced_config]\nmode = "any-value-the-agent-may-not-offer"\nmodel = "big"\ntemperature = 3\n"-bad" = "x"\n`,
    );
    expect(errors).toEqual(
      expect.arrayContaining([
        expect.stringContaining(`${file}: acp.agents[0].forced_config.temperature: numeric values are not allowed`),
        expect.stringContaining(`${file}: acp.agents[0].forced_config`),
      ]),
    );
    const allowedConflict = errorsOf(
      `${head}${agent("a", 'allowed_config_options = ["model"]\n')}[acp.agents.forced_config]\nmodel = "big"\n`,
    );
    expect(allowedConflict).toEqual([
      `${file}: acp.agents[0].allowed_config_options[0]: "model" is forced in acp.agents[0].forced_config`,
    ]);
    // Any string passes at start: only the live session can say whether it is offered.
    expect(() =>
      parseConfig(`${head}${agent("a")}[acp.agents.forced_config]\nmode = "whatever"\n`, file),
    ).not.toThrow();
  });

  test("the merged table is bounded", () => {
    const wide = Array.from({ length: 20 }, (_, i) => `w${i} = true`).join("\n");
    const own = Array.from({ length: 20 }, (_, i) => `o${i} = true`).join("\n");
    const errors = errorsOf(`${head}[acp.forced_config]\n${wide}\n${agent("a")}[acp.agents.forced_config]\n${own}\n`);
    expect(errors).toEqual([
      `${file}: acp.agents[0].forced_config: together with [acp.forced_config] must force at most 32 keys (has 40)`,
    ]);
  });
});

describe("runs", () => {
  const ws = makeWorkspace();
  // Two agents naming their permission modes differently, as claude-agent-acp and codex-acp do.
  const text = [
    "[runner]",
    `state_dir = ${JSON.stringify(join(ws.dir, "state"))}`,
    "[[projects]]",
    'id = "demo"',
    `root = ${JSON.stringify(ws.projectRoot)}`,
    "allow_patch = true",
    "[acp]",
    "max_concurrent_runs = 4",
    "[acp.forced_config]",
    'mode = "agent"',
    "[[acp.agents]]",
    'id = "claude"',
    `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
    `args = ${JSON.stringify(["--ledger", ws.ledger, "--config-options", "mode", "--mode-values", "default,acceptEdits,plan,auto"])}`,
    "[acp.agents.forced_config]",
    'mode = "acceptEdits"',
    "[acp.agents.env_from_env]",
    'PATH = "PATH"',
    "[[acp.agents]]",
    'id = "codex"',
    `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
    `args = ${JSON.stringify(["--ledger", ws.ledger, "--config-options", "mode", "--mode-values", "read-only,workspace-write,agent"])}`,
    "[acp.agents.env_from_env]",
    'PATH = "PATH"',
  ].join("\n");
  const path = join(ws.dir, "runner.toml");
  writeFileSync(path, text);
  const config: RunnerConfig = parseConfig(text, path);
  const { manager } = newManager(config);
  afterAll(async () => {
    await manager.close();
    ws.cleanup();
  });

  test("on a Runner with both agents, each run applies its own agent's forced mode and completes", async () => {
    const claude = await runToEnd(manager, "scenario: hello", { provider_id: "claude" });
    expect(claude.run).toMatchObject({ state: "completed", effective_config: [{ id: "mode", value: "acceptEdits" }] });
    const codex = await runToEnd(manager, "scenario: hello", { provider_id: "codex" });
    expect(codex.run).toMatchObject({ state: "completed", effective_config: [{ id: "mode", value: "agent" }] });
    const sets = readLedger(ws.ledger).filter((e) => e.event === "set_config_option");
    expect(sets.map((e) => (e as { value?: unknown }).value)).toEqual(["acceptEdits", "agent"]);
  });

  test("a caller key that the agent's own table forces is refused before dispatch", async () => {
    const refused = await runToEnd(manager, "scenario: hello", { provider_id: "claude", config: { mode: "plan" } });
    expect(refused.run).toMatchObject({
      state: "failed",
      execution_state: "not_started",
      failure_kind: "invalid_config",
      recovery_kind: "fix_input",
    });
  });
});
