/**
 * Vitest config for mutation runs: only the in-process suites that import the
 * mutated modules from `src` (process tests run `dist`, which is not mutated).
 * No build step here: Stryker's sandbox already carries the built dist that
 * the fake agent runs from.
 */
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: [
      "packages/server/test/runs/identity.test.ts",
      "packages/server/test/principals/authority.test.ts",
      "packages/server/test/runs/runs.test.ts",
      "packages/runner/test/dispatch-store.test.ts",
      "packages/runner/test/dispatch-store-retention.test.ts",
      "packages/runner/test/terminal-write-retry.test.ts",
      "packages/runner/test/config-sequencing.test.ts",
      "packages/runner/test/config-sequencing-units.test.ts",
      "packages/runner/test/events.test.ts",
      "packages/runner/test/admission.test.ts",
      "packages/runner/test/cleanup-survivors.test.ts",
      "packages/runner/test/scenarios.test.ts",
    ],
    pool: "forks",
    testTimeout: 30_000,
    hookTimeout: 30_000,
    maxWorkers: 1,
  },
});
