/**
 * StrykerJS configuration for `npm run test:mutation` (not run in CI: slow).
 *
 * Tests: the in-process suites that import the mutated modules from `src`
 * (scripts/mutation/vitest.config.ts). Process tests run the daemons from
 * `dist`, which Stryker does not mutate, so they are left out — they could
 * not kill a mutant.
 *
 * The machine is shared: concurrency is kept low and per-test coverage lets
 * each mutant run only the tests that reach it.
 */
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { mutatePatterns } from "./scope.mjs";

const ROOT = resolve(fileURLToPath(new URL("../..", import.meta.url)));
/** Parallel test-runner processes; 1 leaves the second core to everyone else. */
const CONCURRENCY = Number(process.env.WEBCODEX_MUTATION_CONCURRENCY ?? 1);

/** @type {import("@stryker-mutator/api/core").PartialStrykerOptions} */
export default {
  packageManager: "npm",
  testRunner: "vitest",
  vitest: { configFile: "scripts/mutation/vitest.config.ts", related: false },
  coverageAnalysis: "perTest",
  // The sandbox copy drops the executable bit the tests check on the fake agent's bin.
  buildCommand: "chmod +x fake-acp-agent/bin/fake-acp-agent.js packages/runner/bin/webcodex-runner.js",
  checkers: ["typescript"],
  tsconfigFile: "tsconfig.json",
  typescriptChecker: { prioritizePerformanceOverAccuracy: true },
  mutate: mutatePatterns(ROOT),
  concurrency: CONCURRENCY,
  checkerNodeArgs: [],
  timeoutMS: 20_000,
  timeoutFactor: 2,
  ignoreStatic: true,
  reporters: ["clear-text", "progress", "json"],
  jsonReporter: { fileName: "bench-results/mutation-stryker.json" },
  tempDirName: ".stryker-tmp",
  ignorePatterns: ["bench-results", ".webcodex", ".smoke-cache", "coverage", ".vitest-tmp"],
  cleanTempDir: "always",
};
