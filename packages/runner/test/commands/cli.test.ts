/**
 * The operator commands as real processes, with the shipped runner.example.toml
 * (relative paths resolve against the config file, so the cwd does not matter).
 */
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { RunEvent } from "@webcodex/protocol";
import { afterAll, describe, expect, test } from "vitest";
import { alive, RUNNER_BIN as BIN, FAKE_AGENT_BIN, REPO_ROOT } from "../../../../scripts/test-support/index.js";
import { canary } from "../../../../scripts/vitest/canary.js";

const run = promisify(execFile);
const EXAMPLE = join(REPO_ROOT, "runner.example.toml");
const dir = mkdtempSync(join(tmpdir(), "wc-cli-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function cli(args: string[], env: NodeJS.ProcessEnv = process.env) {
  try {
    const { stdout, stderr } = await run(process.execPath, [BIN, ...args], { cwd: dir, env, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe("webcodex-runner", () => {
  test("check --probe fake prints the agent's info and config options", async () => {
    const { code, stdout } = await cli(["check", "--config", EXAMPLE, "--probe", "fake"]);
    expect(code).toBe(0);
    expect(stdout).toMatch(/config OK/);
    expect(stdout).toMatch(/agent: fake-acp-agent/);
    expect(stdout).toMatch(/protocol version: 1/);
    expect(stdout).toMatch(/model \(select\) = fake-small/);
  });

  test('exec "Say hello." reaches completed; --json prints one RunEvent per line; logs hold no bodies', async () => {
    const human = await cli(["exec", "--config", EXAMPLE, "--project", "demo", "--provider", "fake", "Say hello."]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/terminal: completed \/ completed \(end_turn\)/);

    const promptCanary = canary("prompt");
    const secretPrompt = `scenario: tools\nthe prompt body must never be logged ${promptCanary}`;
    const json = await cli(
      ["exec", "--config", EXAMPLE, "--project", "demo", "--provider", "fake", "--json", "--log-level", "debug"].concat(
        ["-c", "model=fake-large", secretPrompt],
      ),
    );
    expect(json.code).toBe(0);
    const events = json.stdout
      .trim()
      .split("\n")
      .map((line) => RunEvent.parse(JSON.parse(line)));
    expect(events.at(-1)).toMatchObject({ kind: "terminal", state: "completed" });
    expect(json.stderr).toMatch(/"msg":"run terminal"/);
    expect(json.stderr).not.toContain(promptCanary);
    expect(json.stderr).not.toContain("I fixed add()");
  });

  test("exec of a run that reaches its own deadline exits 5, not the 130 of Ctrl-C", async () => {
    const slow = "scenario: slow interval_ms=100 count=600";
    const res = await cli([
      "exec",
      "--config",
      EXAMPLE,
      "--project",
      "demo",
      "--provider",
      "fake",
      "--timeout",
      "1",
      slow,
    ]);
    expect(res.stdout).toMatch(/terminal: cancelled/);
    expect(res.stdout).toMatch(/run_timeout|deadline/);
    expect(res.code).toBe(5);
  });

  test("exec exits only after the agent's whole tree is gone (SIGTERM-ignoring grandchild)", async () => {
    const ledger = join(dir, "ledger.jsonl");
    const file = join(dir, "grandchild.toml");
    writeFileSync(
      file,
      [
        "[[projects]]",
        'id = "demo"',
        `root = ${JSON.stringify(join(REPO_ROOT, "examples/demo-project"))}`,
        "allow_patch = true",
        "[acp]",
        "[[acp.agents]]",
        'id = "fake"',
        `executable = ${JSON.stringify(FAKE_AGENT_BIN)}`,
        `args = ["--ledger", ${JSON.stringify(ledger)}]`,
        "[acp.agents.env_from_env]",
        'PATH = "PATH"',
      ].join("\n"),
    );
    const { code } = await cli([
      "exec",
      "--config",
      file,
      "--project",
      "demo",
      "--provider",
      "fake",
      "scenario: grandchild",
    ]);
    expect(code).toBe(0);
    const entry = readFileSync(ledger, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { event: string; pid?: number })
      .find((e) => e.event === "grandchild");
    expect(entry?.pid).toBeGreaterThan(0);
    expect(alive(entry?.pid as number)).toBe(false);
  });

  test.each([
    ["completed", "scenario: hello", 0],
    ["failed", "scenario: stop reason=max_tokens", 1],
    ["lost", "scenario: crash_before_response", 3],
    ["cancelled", "scenario: stop reason=cancelled", 130],
  ] as const)("exec exits like the CLI: %s (%s) → exit %d", async (state, prompt, expected) => {
    const { code, stdout } = await cli([
      "exec",
      "--config",
      EXAMPLE,
      "--project",
      "demo",
      "--provider",
      "fake",
      "--json",
      prompt,
    ]);
    const last = stdout.trim().split("\n").at(-1) ?? "{}";
    expect(JSON.parse(last)).toMatchObject({ kind: "terminal", state });
    expect(code).toBe(expected);
  });

  test("check warns of an env_from_env source that is not set, by its name and never a value", async () => {
    const unset = `WC_UNSET_${randomBytes(24).toString("hex").toUpperCase()}`;
    const secret = canary("env-value");
    const file = join(dir, "env-check.toml");
    writeFileSync(
      file,
      `[runner]\nstate_dir = "state-env-check"\n\n[[projects]]\nid = "demo"\nroot = ${JSON.stringify(join(REPO_ROOT, "examples/demo-project"))}\n\n` +
        `[acp]\nagents_share_runner_user = true\n\n[[acp.agents]]\nid = "fake"\nexecutable = ${JSON.stringify(FAKE_AGENT_BIN)}\n` +
        `[acp.agents.env_from_env]\nPATH = "PATH"\nAPI_KEY = "${unset}"\nSET_ONE = "WC_CHECK_SET"\n`,
    );
    const { code, stdout, stderr } = await cli(["check", "--config", file], { ...process.env, WC_CHECK_SET: secret });
    expect(code, stderr).toBe(0);
    expect(stdout).toContain(`warning: agent fake: env_from_env API_KEY = "${unset}": ${unset} is not set`);
    expect(stdout).not.toMatch(/env_from_env (PATH|SET_ONE)/);
    expect(`${stdout}${stderr}`).not.toContain(secret);
  });

  test("an unknown key names the nearest known one of its table", async () => {
    const file = join(dir, "typo.toml");
    writeFileSync(
      file,
      `[[projects]]\nid = "demo"\nroot = "."\n[acp]\nmax_concurent_runs = 2\n[[acp.agents]]\nid = "fake"\nexecutable = "x"\nexecutabel_args = []\ncolour = "red"\n`,
    );
    const { code, stderr } = await cli(["check", "--config", file]);
    expect(code).toBe(2);
    expect(stderr).toContain(
      `${file}: acp.max_concurent_runs: unknown key (not allowed) (did you mean \`max_concurrent_runs\`?)`,
    );
    // Nothing near enough: no guess.
    expect(stderr).toMatch(/acp\.agents\[0\]\.colour: unknown key \(not allowed\)\n/);
  });

  test("an invalid config exits 2 listing every error", async () => {
    const file = join(dir, "bad.toml");
    writeFileSync(file, '[[projects]]\nid = "Bad"\nroot = "nowhere"\n[acp]\nmax_concurrent_runs = 0\n');
    const { code, stderr } = await cli(["check", "--config", file]);
    expect(code).toBe(2);
    expect(stderr).toContain(`${file}: projects[0].id: "Bad" must match`);
    expect(stderr).toContain(`${file}: acp.max_concurrent_runs: must be at least 1`);
    expect(stderr).toContain(`${file}: acp.agents: is required`);
  });
});
