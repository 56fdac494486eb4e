/**
 * Where the repository and the built daemons are. Process tests run the
 * daemons and the fake agent from these paths (dist/, built by the vitest
 * global setup), never from src/.
 */
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (the folder holding the root package.json). */
export const REPO_ROOT = resolve(fileURLToPath(new URL("../..", import.meta.url)));
/** `webcodex-runner` (the Runner daemon and its exec/check commands). */
export const RUNNER_BIN = join(REPO_ROOT, "packages/runner/bin/webcodex-runner.js");
/** `webcodex-server` (the Server daemon and its admin commands). */
export const SERVER_BIN = join(REPO_ROOT, "packages/server/bin/webcodex-server.js");
/** `webcodex` (the CLI). */
export const CLI_BIN = join(REPO_ROOT, "packages/cli/bin/webcodex.js");
/** The fake ACP agent; `--ledger FILE` makes it append one JSON line per prompt (ledger.ts). */
export const FAKE_AGENT_BIN = join(REPO_ROOT, "fake-acp-agent/bin/fake-acp-agent.js");
