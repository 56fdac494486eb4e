/** Runner TOML validation (design §4.1): every rule, all errors at once, file + key path + rule. */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MAX_MESSAGE_LENGTH } from "@webcodex/protocol";
import { afterAll, describe, expect, test } from "vitest";
import { REPO_ROOT } from "../../../../scripts/test-support/index.js";
import { lost, notStarted } from "../../src/acp/terminal.js";
import { ConfigError, loadConfig, parseConfig } from "../../src/config/config.js";
import { MAX_ENV_NAME_LENGTH } from "../../src/config/schema.js";

const dir = mkdtempSync(join(tmpdir(), "wc-config-test-"));
mkdirSync(join(dir, "proj"));
mkdirSync(join(dir, "bin"));
writeFileSync(join(dir, "bin", "agent"), "#!/bin/sh\n");
chmodSync(join(dir, "bin", "agent"), 0o755);
writeFileSync(join(dir, "bin", "not-exec"), "");
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const file = join(dir, "runner.toml");

const VALID = `
[runner]
state_dir = "state"
[server]
url = "ws://127.0.0.1:7420/runner"
token_env = "WEBCODEX_RUNNER_TOKEN"
[[projects]]
id = "demo"
root = "proj"
allow_patch = true
[acp]
max_concurrent_runs = 2
[acp.forced_config]
mode = "ask"
sandbox = true
[[acp.agents]]
id = "fake"
executable = "bin/agent"
allowed_config_options = ["model"]
[acp.agents.env_from_env]
PATH = "PATH"
`;

function errorsOf(text: string): string[] {
  try {
    parseConfig(text, file);
  } catch (error) {
    if (error instanceof ConfigError) return [...error.errors];
    throw error;
  }
  throw new Error("config was accepted");
}

describe("runner config", () => {
  test("fair-pool keys: defaults, bounds and a home_template that must be a directory", () => {
    const base = parseConfig(VALID, file).acp;
    expect([base.maxUsersPerCaller, base.bindingIdleDays, base.homeTemplate]).toEqual([null, 30, null]);
    const withAcp = (lines: string) =>
      VALID.replace("max_concurrent_runs = 2\n", `max_concurrent_runs = 2\n${lines}\n`);
    mkdirSync(join(dir, "tpl"), { recursive: true });
    const set = parseConfig(
      withAcp('max_users_per_caller = 2\nbinding_idle_days = 7\nhome_template = "tpl"'),
      file,
    ).acp;
    expect([set.maxUsersPerCaller, set.bindingIdleDays, set.homeTemplate]).toEqual([2, 7, join(dir, "tpl")]);
    expect(errorsOf(withAcp("max_users_per_caller = 0\nbinding_idle_days = 0"))).toEqual([
      `${file}: acp.max_users_per_caller: must be at least 1`,
      `${file}: acp.binding_idle_days: must be at least 1`,
    ]);
    expect(errorsOf(withAcp("binding_idle_days = 3651"))).toEqual([
      `${file}: acp.binding_idle_days: must be at most 3650`,
    ]);
    // keep_agent_alive_secs: 0 (the default) keeps nothing; bounded by MAX_KEEP_AGENT_ALIVE_SECS.
    expect(parseConfig(VALID, file).acp.keepAgentAliveSecs).toBe(0);
    expect(parseConfig(withAcp("keep_agent_alive_secs = 3600"), file).acp.keepAgentAliveSecs).toBe(3600);
    expect(errorsOf(withAcp("keep_agent_alive_secs = 3601"))).toEqual([
      `${file}: acp.keep_agent_alive_secs: must be at most 3600`,
    ]);
    expect(errorsOf(withAcp("keep_agent_alive_secs = -1"))).toEqual([
      `${file}: acp.keep_agent_alive_secs: must be at least 0`,
    ]);
    expect(errorsOf(withAcp('home_template = "bin/agent"'))).toEqual([
      `${file}: acp.home_template: ${join(dir, "bin", "agent")} is not a directory (nor may it be a symlink)`,
    ]);
    expect(errorsOf(withAcp('home_template = "missing"'))).toEqual([
      `${file}: acp.home_template: ${join(dir, "missing")} does not exist`,
    ]);
  });

  test("a valid config is typed, frozen and resolved against the config file", () => {
    const config = parseConfig(VALID, file);
    expect(Object.isFrozen(config)).toBe(true);
    expect(config.runner.stateDir).toBe(join(dir, "state"));
    expect(config.projects[0]).toEqual({
      id: "demo",
      root: join(dir, "proj"),
      allowPatch: true,
      sharedBetweenCallers: false,
      workspace: "shared",
      workspaceAuthor: { name: "WebCodex Runner", email: "runner@webcodex.invalid" },
    });
    expect(config.acp.agents[0]).toMatchObject({
      id: "fake",
      name: "fake",
      executable: join(dir, "bin", "agent"),
      args: [],
    });
    expect(config.acp).toMatchObject({
      maxConcurrentRuns: 2,
      setupTimeoutSecs: 60,
      forcedConfig: { mode: "ask", sandbox: true },
    });
    expect(config.server).toEqual({
      url: "ws://127.0.0.1:7420/runner",
      tokenEnv: "WEBCODEX_RUNNER_TOKEN",
      tokenFile: null,
      caFile: null,
      allowInsecureTransport: false,
    });
  });

  test("lists every error at once, naming file, key path and rule", () => {
    const bad = `
[[projects]]
id = "Demo"
root = "missing-dir"
[[projects]]
id = "demo2"
root = "proj"
colour = "blue"
[acp]
max_concurrent_runs = 65
setup_timeout_secs = 1.5
[acp.forced_config]
mode = "ask"
temperature = 3
[[acp.agents]]
id = "fake"
executable = "codex-acp"
allowed_config_options = ["mode"]
[[acp.agents]]
id = "Codex"
executable = "bin/not-exec"
[[acp.agents]]
id = "fake"
executable = "/nonexistent/agent"
args = [1]
[acp.agents.env_from_env]
"BAD-NAME" = "PATH"
`;
    const errors = errorsOf(bad);
    const expected = [
      `${file}: projects[0].id: "Demo" must match ^[a-z0-9][a-z0-9_-]{0,63}$`,
      `${file}: projects[1].colour: unknown key`,
      `${file}: acp.max_concurrent_runs: must be at most 64`,
      `${file}: acp.setup_timeout_secs: must be an integer`,
      `${file}: acp.forced_config.temperature: numeric values are not allowed`,
      `${file}: acp.agents[1].id: "Codex" must match`,
      `${file}: acp.agents[2].args[0]: must be a string`,
      `${file}: acp.agents[2].env_from_env.BAD-NAME`,
      // Filesystem problems are listed in the same pass as schema problems.
      `${file}: projects[0].root: ${join(dir, "missing-dir")} does not exist`,
      `${file}: acp.agents[0].executable: must be an absolute path or a path relative to the config file`,
      `${file}: acp.agents[1].executable: ${join(dir, "bin", "not-exec")} is not executable`,
    ];
    for (const prefix of expected)
      expect(
        errors.some((e) => e.startsWith(prefix)),
        prefix,
      ).toBe(true);
  });

  test("filesystem and cross-field rules", () => {
    const text = `
[[projects]]
id = "demo"
root = "missing-dir"
[[projects]]
id = "demo"
root = "proj"
[acp]
default_run_timeout_secs = 100
max_run_timeout_secs = 50
[acp.forced_config]
mode = "ask"
[[acp.agents]]
id = "a"
executable = "codex-acp"
allowed_config_options = ["mode", "model", "model"]
[[acp.agents]]
id = "b"
executable = "bin/not-exec"
[[acp.agents]]
id = "b"
executable = "/nonexistent/agent"
`;
    const errors = errorsOf(text);
    const expected = [
      `${file}: projects[0].root: ${join(dir, "missing-dir")} does not exist`,
      `${file}: projects[1].id: "demo" is not unique`,
      `${file}: acp.default_run_timeout_secs: must not exceed acp.max_run_timeout_secs`,
      `${file}: acp.agents[0].executable: must be an absolute path or a path relative to the config file`,
      `${file}: acp.agents[0].allowed_config_options[0]: "mode" is forced`,
      `${file}: acp.agents[0].allowed_config_options[2]: "model" is listed twice`,
      `${file}: acp.agents[1].executable: ${join(dir, "bin", "not-exec")} is not executable`,
      `${file}: acp.agents[2].id: "b" is not unique`,
      `${file}: acp.agents[2].executable: /nonexistent/agent does not exist`,
    ];
    for (const line of expected)
      expect(
        errors.some((e) => e.startsWith(line)),
        line,
      ).toBe(true);
  });

  test("requires projects and agents (no default agent) and a token source without an inline token", () => {
    const errors = errorsOf('[server]\nurl = "http://x"\ntoken = "inline"\n[acp]\n');
    expect(errors).toEqual(
      expect.arrayContaining([
        `${file}: projects: is required`,
        `${file}: acp.agents: is required`,
        `${file}: server.url: must be a ws:// or wss:// URL`,
        `${file}: server.token: unknown key (not allowed)`,
      ]),
    );
  });

  test("environment variable names are bounded (a missing source's name goes into a run's message)", () => {
    const long = `S${"X".repeat(MAX_ENV_NAME_LENGTH)}`;
    const errors = errorsOf(VALID.replace('PATH = "PATH"', `PATH = "${long}"`));
    expect(errors.some((e) => e.startsWith(`${file}: acp.agents[0].env_from_env.PATH: must be at most`))).toBe(true);
    const ok = parseConfig(VALID.replace('PATH = "PATH"', `PATH = "${long.slice(0, MAX_ENV_NAME_LENGTH)}"`), file);
    expect(Object.values(ok.acp.agents[0]?.envFromEnv ?? {})).toEqual([long.slice(0, MAX_ENV_NAME_LENGTH)]);
  });

  test("terminal messages built from config names stay within MAX_MESSAGE_LENGTH", () => {
    const name = "N".repeat(2000);
    const failed = notStarted("missing_env", "spawn", `Missing source variable: ${name}.`);
    expect(failed.message.length).toBeLessThanOrEqual(MAX_MESSAGE_LENGTH);
    expect(lost("io_error", name).message.length).toBeLessThanOrEqual(MAX_MESSAGE_LENGTH);
    const short = notStarted("missing_env", "spawn", "Missing source variable: PATH.");
    expect(short.message).toContain("Missing source variable: PATH. Stage: spawn.");
  });

  test("[acp] sandbox is namespaces or none (default namespaces); shared_between_callers is a boolean (default false)", () => {
    expect(parseConfig(VALID, file).acp.sandbox).toBe("namespaces");
    expect(parseConfig(VALID.replace("[acp]\n", '[acp]\nsandbox = "none"\n'), file).acp.sandbox).toBe("none");
    const bad = VALID.replace("[acp]\n", '[acp]\nsandbox = "bwrap"\n').replace(
      "allow_patch = true\n",
      'allow_patch = true\nshared_between_callers = "yes"\n',
    );
    expect(errorsOf(bad)).toEqual([
      `${file}: projects[0].shared_between_callers: must be a boolean`,
      `${file}: acp.sandbox: must be one of namespaces, none`,
    ]);
  });

  test("an agent's continuation is none, load, resume or both (default none)", () => {
    expect(parseConfig(VALID, file).acp.agents[0]?.continuation).toBe("none");
    const both = VALID.replace(
      'allowed_config_options = ["model"]\n',
      'allowed_config_options = ["model"]\ncontinuation = "both"\n',
    );
    expect(parseConfig(both, file).acp.agents[0]?.continuation).toBe("both");
    expect(errorsOf(both.replace('"both"', '"sometimes"'))).toEqual([
      `${file}: acp.agents[0].continuation: must be one of none, load, resume, both`,
    ]);
  });

  test("TOML syntax errors name the line", () => {
    expect(errorsOf("[runner\n")[0]).toMatch(new RegExp(`^${file}:1:\\d+: TOML syntax error`));
  });

  test("runner.example.toml is valid as shipped", async () => {
    const config = await loadConfig(join(REPO_ROOT, "runner.example.toml"));
    expect(config.projects.map((p) => p.id)).toEqual(["demo"]);
    expect(config.acp.agents.map((a) => a.id)).toEqual(["fake"]);
  });
});
