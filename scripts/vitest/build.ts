/**
 * Vitest global setup: build every workspace (`tsc -b`) before any test runs.
 *
 * The process tests spawn the daemons and the fake agent from `dist/`, so a
 * plain `vitest run` after editing `src` would otherwise test stale code. The
 * build is incremental (a no-op when dist is current) and a failed build fails
 * the whole run instead of letting tests skip or run old output.
 */
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { REPO_ROOT } from "../test-support/index.js";

/** Upper bound on one build; a cold `tsc -b` of the workspace takes well under this. */
const BUILD_TIMEOUT_MS = 300_000;

export default function setup(): void {
  const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
  const result = spawnSync(process.execPath, [tsc, "-b"], {
    cwd: REPO_ROOT,
    encoding: "utf8",
    timeout: BUILD_TIMEOUT_MS,
  });
  if (result.status !== 0) {
    const why = result.error ? String(result.error) : `exit ${result.status ?? result.signal}`;
    throw new Error(
      `vitest global setup: \`tsc -b\` failed (${why}); the process tests need a current dist/\n${result.stdout}${result.stderr}`,
    );
  }
}
