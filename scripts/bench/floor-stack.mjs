/**
 * The fan-out's floor as a stack (issue 45): floor-server.mjs as a child process with the Server's own node
 * flags (`DAEMON_NODE_FLAGS.server`), and the same face `launchStack` gives the fan-out suite (url, runnerUrl,
 * sims, tokens, pids, mcpClient, stop), so `fanout.cell` measures it unchanged. Nothing is authenticated:
 * the tokens are placeholders of a principal token's length.
 */
import { randomBytes, randomUUID } from "node:crypto";
import { join } from "node:path";
import { DAEMON_NODE_FLAGS } from "../local-stack.mjs";
import { spawnJsonChild } from "./lib/child.mjs";
import { connectLeanMcp } from "./lib/mcp-lean.mjs";
import { BENCH_DIR } from "./lib/paths.mjs";
import { killByMarker, stopTracked } from "./lib/proc.mjs";
import { profileArgs } from "./lib/sims.mjs";
import { makeTempDir } from "./lib/tmp.mjs";

/** How long the floor server may take to listen. */
const FLOOR_READY_TIMEOUT_MS = 20_000;

export async function launchFloor({ label, simRunners = 0, principals = 1, nodeArgs = {} }) {
  const dir = makeTempDir(label);
  const sims = Array.from({ length: simRunners }, (_, i) => ({
    runner_id: `sim${i}`,
    project_id: `p${i}`,
    token: randomBytes(32).toString("base64url"),
  }));
  const tokens = Array.from({ length: principals }, () => `wc_pat_${randomBytes(32).toString("base64url")}`);
  // The directory as the last argument marks the process for killByMarker, as the daemons' config paths do.
  const server = spawnJsonChild(join(BENCH_DIR, "floor-server.mjs"), [dir], {
    logFile: join(dir, "floor.log"),
    nodeArgs: [...DAEMON_NODE_FLAGS.server, ...profileArgs(nodeArgs, "floor")],
  });
  let ready;
  try {
    ready = await server.waitLine((l) => "ready" in l, FLOOR_READY_TIMEOUT_MS);
  } catch (error) {
    await stopTracked(server, 2000);
    killByMarker(dir);
    throw error;
  }
  const url = `http://127.0.0.1:${ready.port}/mcp`;
  return {
    dir,
    port: ready.port,
    url,
    runnerUrl: `ws://127.0.0.1:${ready.port}/runner`,
    tokens,
    sims,
    pids: () => ({ server: server.pid }),
    async mcpClient(i = 0) {
      const lean = await connectLeanMcp({ url, token: tokens[i], name: "webcodex-bench-floor" });
      return {
        start: (args) => lean.callTool("start_coding_agent", { ...args, idempotency_key: randomUUID() }),
        cancel: (run_id) => lean.callTool("cancel_coding_agent", { run_id }),
        close: () => lean.close(),
      };
    },
    async stop() {
      await stopTracked(server, 3000);
      killByMarker(dir);
    },
  };
}
