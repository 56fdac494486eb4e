/**
 * The three executables answer for help the same way, through real child processes:
 * `X --help`, `X -h` and `X help` print the usage with a one-line description of every command, exit 0;
 * `X CMD --help` (and `X help CMD`) print that command's usage, exit 0; an unknown command prints a
 * short error and a hint to `--help` on stderr, exit 2.
 */
import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";
import { CLI_BIN, RUNNER_BIN, SERVER_BIN } from "../test-support/index.js";

/** Longest one binary may take to print its help on a loaded machine. */
const HELP_TIMEOUT_MS = 60_000;

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

function call(bin: string, args: string[]): Promise<Result> {
  return new Promise((resolve, reject) => {
    // No Server URL, token or config in the environment: help needs none.
    const env = { PATH: process.env.PATH ?? "" };
    const child = spawn(process.execPath, [bin, ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}

const BINARIES = [
  {
    name: "webcodex",
    bin: CLI_BIN,
    commands: ["run", "observe", "cancel", "changes", "apply", "status", "task", "session"],
  },
  { name: "webcodex-server", bin: SERVER_BIN, commands: ["run", "token", "runner-token", "oauth", "mcp-stdio"] },
  { name: "webcodex-runner", bin: RUNNER_BIN, commands: ["run", "check", "exec", "diagnose", "pool"] },
] as const;

describe.each(BINARIES)("$name answers for help like the others", ({ name, bin, commands }) => {
  it.each([["--help"], ["-h"], ["help"]])(
    "`%s` prints every command with a one-line description and exits 0",
    async (flag) => {
      const r = await call(bin, [flag]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toBe("");
      for (const cmd of commands) {
        // `  NAME  description` on one line of the commands list.
        expect(r.stdout, `${name} ${flag} describes ${cmd}`).toMatch(new RegExp(`^  ${cmd} +\\S.{10,}$`, "m"));
      }
    },
    HELP_TIMEOUT_MS,
  );

  it.each(commands.map((c) => [c]))(
    "`%s --help` and `help CMD` print that command's usage and exit 0",
    async (cmd) => {
      const all = await call(bin, ["--help"]);
      for (const args of [
        [cmd, "--help"],
        [cmd, "-h"],
        ["help", cmd],
      ]) {
        const r = await call(bin, args);
        expect(r.code, `${name} ${args.join(" ")}: ${r.stderr}`).toBe(0);
        expect(r.stdout).toMatch(/usage:/i);
        expect(r.stdout).toContain(`${name} ${cmd}`);
        // That command's usage, not the whole list: no other command's description line.
        for (const other of commands.filter((c) => c !== cmd)) {
          const line = new RegExp(`^  ${other} +\\S.*$`, "m").exec(all.stdout)?.[0];
          expect(line, `${name} --help describes ${other}`).toBeDefined();
          expect(r.stdout, `${args.join(" ")} shows the line of ${other}`).not.toContain(line);
        }
      }
    },
    HELP_TIMEOUT_MS * 3,
  );

  it(
    "an unknown command is named on stderr with a hint to --help, exit 2",
    async () => {
      const r = await call(bin, ["frobnicate"]);
      expect(r.code).toBe(2);
      expect(r.stdout).toBe("");
      expect(r.stderr).toContain('unknown command "frobnicate"');
      expect(r.stderr).toContain(`${name} --help`);
      // Short: the error and the hint, not the whole usage.
      expect(r.stderr.trim().split("\n").length).toBeLessThanOrEqual(2);
    },
    HELP_TIMEOUT_MS,
  );
});
