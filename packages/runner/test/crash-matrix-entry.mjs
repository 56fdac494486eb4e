/**
 * Fallback entry for the durability tests while `webcodex-runner run` (main.ts)
 * does not route to startDaemon yet: `node crash-matrix-entry.mjs run --config F [--new-store]`
 * calls the very same startDaemon the real binary calls. The harness prefers the real binary.
 */
import { startDaemon } from "../dist/daemon.js";

const args = process.argv.slice(2);
const config = args[args.indexOf("--config") + 1];
if (args[0] !== "run" || !config) {
  process.stderr.write("usage: crash-matrix-entry.mjs run --config FILE [--new-store]\n");
  process.exit(2);
}
await startDaemon({ configPath: config, newStore: args.includes("--new-store") });
