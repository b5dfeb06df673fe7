import type { Reporter, TestModule } from "vitest/node";

/**
 * Ends the run with one plain line, `N passed, N failed[, N skipped]`, that any CI can read whatever the
 * runner's own formatting (vitest's summary is coloured and split over several lines).
 */
export default class SummaryReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>) {
    const counts = { passed: 0, failed: 0, skipped: 0 };
    for (const m of modules) {
      for (const t of m.children.allTests()) {
        const state = t.result().state;
        if (state === "passed") counts.passed++;
        else if (state === "failed") counts.failed++;
        else counts.skipped++;
      }
      if (m.state() === "failed" && [...m.children.allTests()].length === 0) counts.failed++;
    }
    process.stdout.write(`\n${counts.passed} passed, ${counts.failed} failed${counts.skipped ? `, ${counts.skipped} skipped` : ""}\n`);
  }
}
