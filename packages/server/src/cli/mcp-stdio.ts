/**
 * `webcodex-server mcp-stdio --url http://127.0.0.1:PORT/mcp --token-env VAR`
 * Runs the stdio↔Streamable-HTTP bridge until stdin closes. Logs go to stderr;
 * stdout carries only MCP messages.
 */
import { parseArgs } from "node:util";
import { pino } from "pino";
import { startMcpStdioBridge } from "../mcp/stdio.js";
import { commandUsage } from "./help.js";

const USAGE = commandUsage("mcp-stdio");

export async function runMcpStdioCommand(argv: readonly string[]): Promise<number> {
  let values: { url?: string; "token-env"?: string };
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: { url: { type: "string" }, "token-env": { type: "string" } },
      strict: true,
    }));
  } catch (err) {
    console.error(`${err instanceof Error ? err.message : String(err)}\n${USAGE}`);
    return 2;
  }
  const envName = values["token-env"];
  if (!values.url || !envName) {
    console.error(USAGE);
    return 2;
  }
  let url: URL;
  try {
    url = new URL(values.url);
  } catch {
    console.error(`--url is not a URL\n${USAGE}`);
    return 2;
  }
  const token = process.env[envName];
  if (!token) {
    console.error(`environment variable ${envName} (from --token-env) is not set`);
    return 2;
  }
  const logger = pino(
    { name: "webcodex-mcp-stdio", level: process.env.WEBCODEX_LOG_LEVEL ?? "warn" },
    pino.destination(2),
  );
  try {
    const bridge = await startMcpStdioBridge({ url, token, logger });
    await bridge.closed;
    return 0;
  } catch (err) {
    console.error(`mcp-stdio: ${err instanceof Error ? err.message : String(err)}`);
    return 1;
  }
}
