import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";
import { HardeningSequencer } from "./sequencer.js";

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
    // 3x a quiet machine's start-up of a part's daemons (docs/testing.md).
    hookTimeout: 180_000,
    // Two files at once: the soak (about half the suite's wall time, one file) in one worker and every other
    // part after it in the other (sequencer.ts puts the soak and the chaos first). Safe because each file has
    // its own daemons, state dirs, ports and fake-agent ledger, and every check is scoped to them: the soak
    // samples only its own Server's and Runner's RSS, fds, databases and children, the fault and chaos parts
    // look only under their own Runner or dir. Most of each part's time is waiting (agent start-up, setup and
    // cancel deadlines, restarts), so two of them share the two cores well; timings: README.md.
    maxWorkers: 2,
    fileParallelism: true,
    sequence: { sequencer: HardeningSequencer },
    reporters: ["default", "./scripts/vitest/summary-reporter.ts"],
  },
});
