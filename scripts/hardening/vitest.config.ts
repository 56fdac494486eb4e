import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

/**
 * `npm run test:hardening` — the full hardening suite (issue 16): every file in
 * scripts/hardening/test, at full size (WEBCODEX_HARDENING=full: ≥ 10k fuzz
 * frames, 20× fault scenarios, ≥ 200 chaos iterations, the soak). `npm test`
 * runs the same files except `*.full.test.ts`, at the short size (profile.ts).
 */
export default defineConfig({
  test: {
    root: fileURLToPath(new URL("../..", import.meta.url)),
    include: ["scripts/hardening/test/**/*.test.ts"],
    globalSetup: ["./scripts/vitest/build.ts"],
    pool: "forks",
    env: { WEBCODEX_HARDENING: "full" },
    testTimeout: 20 * 60_000,
    hookTimeout: 60_000,
    // The parts load the machine themselves (capacity cycles, chaos): one file at a time.
    maxWorkers: 1,
    fileParallelism: false,
    reporters: ["default", "./scripts/vitest/summary-reporter.ts"],
  },
});
