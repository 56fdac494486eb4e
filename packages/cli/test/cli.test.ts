import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { CLI_BIN as BIN } from "../../../scripts/test-support/index.js";
import { parseCommand } from "../src/args.js";
import { runCli } from "../src/cli.js";
import { CliError } from "../src/errors.js";
import { loadRecorded, scriptedClient, testContext } from "./support.js";

describe("argument errors exit 2", () => {
  it.each([
    [[], "missing command"],
    [["frobnicate"], 'unknown command "frobnicate"'],
    [["run", "--provider", "fake", "hi"], "missing --project ID"],
    [["run", "--project", "demo", "hi"], "missing --provider ID"],
    [["run", "--project", "demo", "--provider", "fake"], "missing PROMPT"],
    [["run", "--project", "demo", "--provider", "fake", "two", "prompts"], "expected one PROMPT"],
    [["run", "--project", "demo", "--provider", "fake", "--timeout", "soon", "hi"], "--timeout expects a whole number"],
    [["run", "--project", "demo", "--provider", "fake", "--config", "model", "hi"], "--config expects KEY=VALUE"],
    [["run", "--project", "demo", "--provider", "fake", "--bogus", "hi"], "--bogus"],
    [["observe"], "missing RUN_ID"],
    [["cancel", "a", "b"], "expected one RUN_ID"],
    [["status", "extra"], "status takes no arguments"],
  ])("%j → %s", async (argv, message) => {
    const { ctx, stderr } = testContext(scriptedClient(loadRecorded("tools-run")));
    expect(await runCli(argv, ctx)).toBe(2);
    expect(stderr.text).toContain(message);
  });

  it("needs a URL and a token from flags or the environment", async () => {
    const client = scriptedClient(loadRecorded("tools-run"));
    const noUrl = testContext(client, { WEBCODEX_URL: undefined });
    expect(await runCli(["status"], noUrl.ctx)).toBe(2);
    expect(noUrl.stderr.text).toContain("no Server URL");
    const noToken = testContext(client, { WEBCODEX_TOKEN: undefined });
    expect(await runCli(["status"], noToken.ctx)).toBe(2);
    expect(noToken.stderr.text).toContain("WEBCODEX_TOKEN");
    const flags = testContext(client, { WEBCODEX_URL: undefined, WEBCODEX_TOKEN: undefined });
    expect(await runCli(["status", "--url", "http://h/mcp", "--token", "t"], flags.ctx)).toBe(0);
  });

  it("parses config pairs, booleans and repeatable flags", () => {
    const cmd = parseCommand([
      "run",
      "--project",
      "p",
      "--provider",
      "f",
      "--config",
      "model=gpt",
      "--config",
      "fast=true",
      "--timeout",
      "60",
      "--key",
      "k",
      "go",
    ]);
    expect(cmd).toMatchObject({
      name: "run",
      config: { model: "gpt", fast: true },
      timeoutSecs: 60,
      key: "k",
      prompt: "go",
    });
    expect(() =>
      parseCommand(["run", "--project", "p", "--provider", "f", "--config", "a=1", "--config", "a=2", "go"]),
    ).toThrow(CliError);
  });

  it("exits 2 from the real executable and prints usage help", async () => {
    const result = await promisify(execFile)(process.execPath, [BIN, "run", "--project", "demo"], { env: {} }).catch(
      (err: { code: number; stderr: string }) => err,
    );
    expect("code" in result ? result.code : 0).toBe(2);
    expect(result.stderr).toContain("missing --provider ID");
    expect(result.stderr).toContain("webcodex --help");
  });

  it("prints help and version with exit 0", async () => {
    const { ctx, stdout } = testContext(scriptedClient(loadRecorded("tools-run")));
    expect(await runCli(["--help"], ctx)).toBe(0);
    expect(stdout.text).toContain("webcodex run --project ID --provider ID");
    // Every command has its line under "Commands:".
    const commands = stdout.text.split("Commands:\n")[1]?.split("\n\n")[0] ?? "";
    for (const name of ["run", "observe", "cancel", "status", "task", "session"]) {
      expect(commands, name).toMatch(new RegExp(`^  ${name} +\\S`, "m"));
    }
    expect(await runCli(["--version"], ctx)).toBe(0);
    expect(stdout.text).toMatch(/webcodex \d+\.\d+\.\d+/);
  });
});

describe("connection errors", () => {
  it("says what failed and what to check, and exits 1", async () => {
    const result = await promisify(execFile)(process.execPath, [BIN, "status"], {
      env: { WEBCODEX_URL: "http://127.0.0.1:9/mcp", WEBCODEX_TOKEN: "wct_nope" },
    }).catch((err: { code: number; stderr: string }) => err);
    expect("code" in result ? result.code : 0).toBe(1);
    expect(result.stderr).toContain("cannot reach the Server at http://127.0.0.1:9/mcp");
    expect(result.stderr).toContain("webcodex-server is running");
  });
});
