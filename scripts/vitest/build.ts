/**
 * Vitest global setup: build every workspace (`tsc -b`) and bundle the run view (the MCP App the Server
 * serves, packages/server/scripts/build-run-view.mjs) before any test runs.
 *
 * The process tests spawn the daemons and the fake agent from `dist/`, so a
 * plain `vitest run` after editing `src` would otherwise test stale code. The
 * build is incremental (a no-op when dist is current) and a failed build fails
 * the whole run instead of letting tests skip or run old output.
 */
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";

const REPO = resolve(fileURLToPath(new URL("../..", import.meta.url)));
/** Upper bound on one build; a cold `tsc -b` of the workspace takes well under this. */
const BUILD_TIMEOUT_MS = 300_000;

const VIEW_BUILD = resolve(REPO, "packages/server/scripts/build-run-view.mjs");

function run(what: string, args: string[]): void {
  const result = spawnSync(process.execPath, args, { cwd: REPO, encoding: "utf8", timeout: BUILD_TIMEOUT_MS });
  if (result.status !== 0) {
    const why = result.error ? String(result.error) : `exit ${result.status ?? result.signal}`;
    throw new Error(
      `vitest global setup: ${what} failed (${why}); the process tests need a current dist/\n${result.stdout}${result.stderr}`,
    );
  }
}

export default function setup(): void {
  run("`tsc -b`", [createRequire(import.meta.url).resolve("typescript/bin/tsc"), "-b"]);
  run("the run view bundle", [VIEW_BUILD]);
}
