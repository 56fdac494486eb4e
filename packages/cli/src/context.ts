/**
 * What a command needs from the outside world, injected so tests can run
 * commands in-process against recorded or scripted Servers.
 */
import type { OutputStream } from "./live-output.js";
import type { RunsClient, ServerConnection } from "./server-client.js";

export interface CliContext {
  stdout: OutputStream;
  stderr: OutputStream;
  env: NodeJS.ProcessEnv;
  readStdin(): Promise<string>;
  /** Calls `handler` on every Ctrl-C (SIGINT) until the returned function is called. */
  onInterrupt(handler: () => void): () => void;
  createClient(connection: ServerConnection): RunsClient;
}
