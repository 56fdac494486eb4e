/**
 * Prints one plain closing line, `tests: N passed, N failed[, N skipped]`,
 * after vitest's own summary, so CI logs carry a line any reader can parse.
 */
import type { Reporter, TestModule } from "vitest/node";

export default class SummaryReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<unknown>): void {
    let passed = 0;
    let failed = 0;
    let skipped = 0;
    for (const mod of testModules) {
      for (const test of mod.children.allTests()) {
        const state = test.result().state;
        if (state === "passed") passed++;
        else if (state === "failed") failed++;
        else skipped++;
      }
      // A module that failed to load has no tests but is still a failure.
      if (mod.state() === "failed" && [...mod.children.allTests()].length === 0) failed++;
    }
    failed += unhandledErrors.length;
    const tail = skipped > 0 ? `, ${skipped} skipped` : "";
    process.stdout.write(`\ntests: ${passed} passed, ${failed} failed${tail}\n`);
  }
}
