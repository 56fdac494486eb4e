import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: [
      "packages/*/test/**/*.test.ts",
      "fake-acp-agent/test/**/*.test.ts",
      "scripts/test/**/*.test.ts",
      // The hardening suite's short variant (issue 16); `npm run test:hardening` runs it at full size.
      "scripts/hardening/test/**/*.test.ts",
    ],
    exclude: ["**/node_modules/**", "scripts/hardening/test/**/*.full.test.ts"],
    // Process tests run the daemons from dist/: build first so they never test stale code.
    globalSetup: ["./scripts/vitest/build.ts"],
    pool: "forks",
    // Sized for a machine 3x slower than a quiet one (a shared 2-core box under load): a test or hook that
    // needs more than a third of this on a quiet machine sets its own, 3x its quiet time (docs/testing.md).
    testTimeout: 90_000,
    hookTimeout: 90_000,
    // Integration tests spawn real processes; two cores want few files at once.
    maxWorkers: 2,
    reporters: ["default", "./scripts/vitest/summary-reporter.ts"],
  },
});
