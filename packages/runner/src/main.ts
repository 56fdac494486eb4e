/**
 * `webcodex-runner` command line.
 *
 *   webcodex-runner run   --config FILE [--new-store]
 *   webcodex-runner check --config FILE [--probe PROVIDER] [--project ID]
 *   webcodex-runner exec  --config FILE --project ID --provider ID [--json]
 *                         [--config KEY=VALUE]... [--timeout SECS] "prompt"
 *   webcodex-runner diagnose --config FILE RUN_ID
 *   webcodex-runner pool --config FILE [release USER]
 *
 * Exit codes: 0 success, 1 failure, 2 invalid config or usage, 3 store
 * refused (run). `exec` exits like the CLI (commands/exec.ts `execExitCode`):
 * 0 completed, 1 failed, 3 lost, 4 cancelled at the permission deadline, 5 at the run deadline, 130 cancelled (and on a second Ctrl-C).
 * Each command lives in commands/ (their usage and how help is answered: commands/help.ts); this file
 * parses argv and switches.
 */
import { type Parsed, parseArgv, UsageError } from "./commands/argv.js";
import { check } from "./commands/check.js";
import { diagnose } from "./commands/diagnose.js";
import { exec } from "./commands/exec.js";
import { answerHelp, commandUsage } from "./commands/help.js";
import { pool } from "./commands/pool.js";
import { ConfigError } from "./config/config.js";
import { reserveAgentFdTable } from "./process/fd-table.js";
import { closeInheritedFds } from "./process/inherited-fds.js";
import { BindingsFileError } from "./process/user-bindings.js";
import { STORE_REFUSAL_EXIT_CODE } from "./store/open.js";

/** `run` hands over to the daemon (commands/daemon.ts), loaded only for this command. */
async function run(parsed: Parsed): Promise<number> {
  if (parsed.configFile === null) throw new UsageError("--config FILE is required");
  const { startDaemon } = await import("./commands/daemon.js");
  const handle = await startDaemon({ configPath: parsed.configFile, newStore: parsed.flags.has("--new-store") });
  await handle.closed;
  return 0;
}

async function main(argv: readonly string[]): Promise<number> {
  const help = answerHelp(argv);
  if (help !== null) {
    (help.kind === "usage" ? process.stdout : process.stderr).write(help.text);
    return help.kind === "usage" ? 0 : 2;
  }
  let parsed: Parsed | undefined;
  try {
    parsed = parseArgv(argv);
    switch (parsed.command) {
      case "run":
        return await run(parsed);
      case "check":
        return await check(parsed);
      case "exec":
        return await exec(parsed);
      case "diagnose":
        return await diagnose(parsed);
      case "pool":
        return await pool(parsed);
      default:
        // answerHelp refused every name not in commands/help.ts COMMANDS; "help" was answered there.
        throw new UsageError(`unknown command ${JSON.stringify(parsed.command)}`);
    }
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`webcodex-runner: ${error.message}\n`);
      return error.exitCode;
    }
    if (error instanceof BindingsFileError) {
      process.stderr.write(`webcodex-runner: ${error.message}\n`);
      return STORE_REFUSAL_EXIT_CODE;
    }
    if (error instanceof UsageError) {
      process.stderr.write(
        `webcodex-runner: ${error.message}\n${commandUsage(parsed?.command ?? argv[0] ?? "help")}\n`,
      );
      return 2;
    }
    throw error;
  }
}

// Descriptors inherited without close-on-exec would reach every agent: close them first (process/inherited-fds.ts).
closeInheritedFds();
// Then size every agent's descriptor table before the first spawn (process/fd-table.ts).
reserveAgentFdTable();

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    process.stderr.write(`webcodex-runner: unexpected error: ${error instanceof Error ? error.name : "unknown"}\n`);
    process.exitCode = 1;
  },
);
