/** The `webcodex` executable: wires runCli to the real process. */
import { runCli } from "./cli.js";
import { McpRunsClient } from "./server-client.js";

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk)));
  return Buffer.concat(chunks).toString("utf8");
}

const code = await runCli(process.argv.slice(2), {
  stdout: process.stdout,
  stderr: process.stderr,
  env: process.env,
  readStdin,
  onInterrupt(handler) {
    process.on("SIGINT", handler);
    return () => process.off("SIGINT", handler);
  },
  createClient: (connection) => new McpRunsClient(connection),
});
// Idle keep-alive sockets must not hold the process open after the answer.
process.exit(code);
