/**
 * The baseline: a bare ACP SDK client that spawns the fake agent itself and
 * drives initialize → session/new → session/prompt with nothing in between.
 */
import { Readable, Writable } from "node:stream";
import { client, ndJsonStream } from "@agentclientprotocol/sdk";
import { reserveAgentFdTable } from "../../../packages/runner/dist/process/fd-table.js";
import { spawnTracked, stopTracked } from "./proc.mjs";

// The baseline's agents start with the descriptor table the Runner gives its agents (fd-table.ts), whatever
// the shell that launched the bench left open: the comparison is of the two paths, not of table sizes.
reserveAgentFdTable();

/** The environment a Runner would give the agent (env cleared, PATH and HOME mapped). */
export function agentEnv() {
  const env = {};
  if (process.env.PATH) env.PATH = process.env.PATH;
  if (process.env.HOME) env.HOME = process.env.HOME;
  return env;
}

/**
 * Spawn `argv` and open an ACP session in `cwd`. `onUpdate(params)` sees every session/update.
 * Returns { session_id, prompt(text) → PromptResponse, close() }.
 */
export async function openBareSession({ argv, cwd, onUpdate }) {
  const handle = spawnTracked(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "ignore"], env: agentEnv(), cwd });
  const stream = ndJsonStream(Writable.toWeb(handle.child.stdin), Readable.toWeb(handle.child.stdout));
  const app = client()
    .onNotification("session/update", (ctx) => {
      onUpdate?.(ctx.params);
    })
    .onRequest("session/request_permission", () => ({ outcome: { outcome: "cancelled" } }));
  const connection = app.connect(stream);
  const close = async () => {
    try {
      handle.child.stdin.end();
    } catch {
      // already closed
    }
    const timer = setTimeout(() => void stopTracked(handle, 1000), 1000);
    await handle.exited;
    clearTimeout(timer);
    await stopTracked(handle, 500);
    connection.close();
  };
  try {
    await connection.agent.request("initialize", {
      protocolVersion: 1,
      clientInfo: { name: "webcodex-bench-baseline", version: "0.0.0" },
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    });
    const created = await connection.agent.request("session/new", { cwd, mcpServers: [] });
    const sessionId = created.sessionId;
    return {
      pid: handle.pid,
      sessionId,
      prompt: (text) => connection.agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text }] }),
      close,
    };
  } catch (error) {
    await close();
    throw error;
  }
}
