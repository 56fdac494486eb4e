/**
 * webcodex-server CLI. One small switch; each subcommand parses its own flags. The commands, their one-line
 * descriptions and usage, and how help is answered (`--help`, `-h`, `help`, `CMD --help`): cli/help.ts.
 */
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { answerHelp, commandUsage } from "./cli/help.js";
import { rotateRunnerToken } from "./cli/runner-token.js";
import { ConfigError, loadServerConfig, sha256Hex } from "./config.js";
import { startServer } from "./server.js";
import { armShutdownDeadline, SHUTDOWN_LEAK_TEST_ENV } from "./wiring/teardown.js";

/** A usage mistake of one command: the reason, then that command's usage, on stderr; exit 2. */
function usageMistake(command: string, err: unknown): number {
  console.error(`${err instanceof Error ? err.message : String(err)}\n${commandUsage(command)}`);
  return 2;
}

async function cmdRun(argv: string[]): Promise<number> {
  let values: { config?: string | undefined };
  try {
    ({ values } = parseArgs({ args: argv, options: { config: { type: "string" } }, strict: true }));
  } catch (err) {
    return usageMistake("run", err);
  }
  if (!values.config) {
    console.error(`run needs --config FILE\n${commandUsage("run")}`);
    return 2;
  }
  const config = loadServerConfig(values.config);
  const logger = pino({ level: process.env.WEBCODEX_LOG_LEVEL ?? "info", base: { app: "webcodex-server" } });
  const server = await startServer({ config, logger, mcp: true });
  // Handlers first: whoever waits for the line below may signal at once (stdout to a pipe is synchronous).
  const stopped = new Promise<void>((resolve) => {
    const stop = (sig: string) => {
      logger.info({ signal: sig }, "shutting down");
      resolve();
    };
    process.once("SIGINT", () => stop("SIGINT"));
    process.once("SIGTERM", () => stop("SIGTERM"));
  });
  // One line on stdout that tools and tests can wait for.
  console.log(JSON.stringify({ listening: server.url, port: server.port }));
  await stopped;
  armShutdownDeadline(logger);
  if (process.env[SHUTDOWN_LEAK_TEST_ENV] === "1") setInterval(() => {}, 1_000);
  await server.close();
  return 0;
}

async function cmdRunnerToken(argv: string[]): Promise<number> {
  const [action, ...rest] = argv;
  let values: { runner?: string | undefined; config?: string | undefined };
  try {
    ({ values } = parseArgs({
      args: rest,
      options: { runner: { type: "string" }, config: { type: "string" } },
      strict: true,
    }));
  } catch (err) {
    return usageMistake("runner-token", err);
  }
  if (action === "rotate" && values.runner) {
    if (!values.config) {
      console.error(
        `runner-token rotate needs --config (the Server's state DB holds the new token's hash)\n${commandUsage("runner-token")}`,
      );
      return 2;
    }
    return await rotateRunnerToken(values.config, values.runner);
  }
  if (action !== "issue" || !values.runner) {
    console.error(commandUsage("runner-token"));
    return 2;
  }
  if (values.config) {
    const config = loadServerConfig(values.config);
    if (!config.runners.some((r) => r.id === values.runner)) {
      console.error(`note: runner "${values.runner}" is not in ${config.file}; add the block below.`);
    }
  }
  const token = `wcr_${randomBytes(32).toString("base64url")}`;
  console.log(`runner token for ${values.runner} (shown once; give it to the Runner via its token_env or token file):`);
  console.log(token);
  console.log("");
  console.log("add to the Server config:");
  console.log("[[runners]]");
  console.log(`id = "${values.runner}"`);
  console.log(`token_sha256 = "${sha256Hex(token)}"`);
  console.log(`projects = []  # the project ids this runner owns`);
  return 0;
}

async function main(argv: string[]): Promise<number> {
  const help = answerHelp(argv);
  if (help !== null) {
    (help.kind === "usage" ? process.stdout : process.stderr).write(help.text);
    return help.kind === "usage" ? 0 : 2;
  }
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case "run":
      return cmdRun(rest);
    case "runner-token":
      return await cmdRunnerToken(rest);
    case "token":
      return (await import("./cli/token.js")).runTokenCommand(rest);
    case "oauth":
      return (await import("./cli/oauth.js")).runOAuthCommand(rest);
    case "webhooks":
      return (await import("./cli/webhooks.js")).runWebhooksCommand(rest);
    case "mcp-stdio":
      return (await import("./cli/mcp-stdio.js")).runMcpStdioCommand(rest);
    default:
      // answerHelp refused every name not in cli/help.ts COMMANDS; "help" was answered there.
      console.error(commandUsage("help"));
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    if (err instanceof ConfigError) console.error(`webcodex-server: ${err.message}`);
    else console.error("webcodex-server:", err instanceof Error ? err.message : err);
    process.exitCode = 1;
  },
);
