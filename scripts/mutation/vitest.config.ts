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
      "packages/runner/test/store/dispatch-store.test.ts",
      "packages/runner/test/store/dispatch-store-retention.test.ts",
      "packages/runner/test/runs/terminal-write-retry.test.ts",
      "packages/runner/test/acp/config-sequencing.test.ts",
      "packages/runner/test/acp/config-sequencing-units.test.ts",
      "packages/runner/test/events/events.test.ts",
      "packages/runner/test/runs/admission.test.ts",
      "packages/runner/test/runs/cleanup-survivors.test.ts",
      "packages/runner/test/runs/scenarios.test.ts",
    ],
    pool: "forks",
    testTimeout: 30_000,
    hookTimeout: 30_000,
    maxWorkers: 1,
  },
});
