/**
 * webcodex-server CLI. One small switch; each subcommand parses its own flags.
 *
 *   webcodex-server run --config FILE
 *   webcodex-server runner-token issue --runner ID [--config FILE]
 *   webcodex-server runner-token rotate --runner ID --config FILE
 */
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { rotateRunnerToken } from "./cli/runner-token.js";
import { ConfigError, loadServerConfig, sha256Hex } from "./config.js";
import { createMcpHandler } from "./mcp/mcp.js";
import { startServer } from "./server.js";

const USAGE = `usage:
  webcodex-server run --config FILE
  webcodex-server runner-token issue --runner ID [--config FILE]
  webcodex-server runner-token rotate --runner ID --config FILE
  webcodex-server token issue --config FILE --principal ID --scope SCOPE... [--project ID...] [--allow-coding-agent-run]
  webcodex-server oauth clients list|show|revoke|allow-coding-agent-run|disallow-coding-agent-run [CLIENT_ID] --config FILE
  webcodex-server oauth grants list|revoke [--id G | --principal ID | --client CLIENT_ID] --config FILE
  webcodex-server oauth audit list [--limit N] [--json] --config FILE
  webcodex-server mcp-stdio --url http://127.0.0.1:PORT/mcp --token-env VAR`;

async function cmdRun(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: { config: { type: "string" } }, strict: true });
  if (!values.config) {
    console.error(USAGE);
    return 2;
  }
  const config = loadServerConfig(values.config);
  const logger = pino({ level: process.env.WEBCODEX_LOG_LEVEL ?? "info", base: { app: "webcodex-server" } });
  const server = await startServer({ config, logger, mcpHandler: createMcpHandler });
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
  await server.close();
  return 0;
}

async function cmdRunnerToken(argv: string[]): Promise<number> {
  const [action, ...rest] = argv;
  const { values } = parseArgs({
    args: rest,
    options: { runner: { type: "string" }, config: { type: "string" } },
    strict: true,
  });
  if (action === "rotate" && values.runner) {
    if (!values.config) {
      console.error(`runner-token rotate needs --config (the Server's state DB holds the new token's hash)\n${USAGE}`);
      return 2;
    }
    return await rotateRunnerToken(values.config, values.runner);
  }
  if (action !== "issue" || !values.runner) {
    console.error(USAGE);
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
    case "mcp-stdio":
      return (await import("./cli/mcp-stdio.js")).runMcpStdioCommand(rest);
    default:
      console.error(USAGE);
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
