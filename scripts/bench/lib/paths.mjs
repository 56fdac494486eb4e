/** Where things are in the repository. */
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
export const BENCH_DIR = join(REPO, "scripts/bench");
export const FAKE_AGENT_BIN = join(REPO, "fake-acp-agent/bin/fake-acp-agent.js");
/** WEBCODEX_BENCH_SERVER_BIN / _RUNNER_BIN point at another build (A/B experiments on a patched copy). */
export const SERVER_BIN = process.env.WEBCODEX_BENCH_SERVER_BIN ?? join(REPO, "packages/server/bin/webcodex-server.js");
export const RUNNER_BIN = process.env.WEBCODEX_BENCH_RUNNER_BIN ?? join(REPO, "packages/runner/bin/webcodex-runner.js");
export const TAP_AGENT = join(BENCH_DIR, "tap-agent.mjs");

/** argv of the fake agent writing its ledger to `ledgerFile`. */
export function fakeAgentArgv(ledgerFile) {
  return [process.execPath, FAKE_AGENT_BIN, "--ledger", ledgerFile];
}

export function built(path) {
  return existsSync(path);
}

export function fakeAgentBuilt() {
  return existsSync(join(REPO, "fake-acp-agent/dist/main.js"));
}
