/**
 * Vitest global setup: build every workspace (`npm run build`: the generated session/update validator,
 * `tsc -b`, then the run view bundle — the MCP App the Server serves) before any test runs.
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

/** The build steps `npm run build` runs, in order (without npm's own start-up). */
const STEPS: readonly { label: string; argv: readonly string[] }[] = [
  { label: "scripts/build/session-update-validator.mjs", argv: ["scripts/build/session-update-validator.mjs"] },
  { label: "tsc -b", argv: [createRequire(import.meta.url).resolve("typescript/bin/tsc"), "-b"] },
  { label: "packages/server/scripts/build-run-view.mjs", argv: ["packages/server/scripts/build-run-view.mjs"] },
];

export default function setup(): void {
  for (const step of STEPS) {
    const result = spawnSync(process.execPath, step.argv, { cwd: REPO, encoding: "utf8", timeout: BUILD_TIMEOUT_MS });
    if (result.status !== 0) {
      const why = result.error ? String(result.error) : `exit ${result.status ?? result.signal}`;
      throw new Error(
        `vitest global setup: \`${step.label}\` failed (${why}); the process tests need a current build\n${result.stdout}${result.stderr}`,
      );
    }
  }
}
