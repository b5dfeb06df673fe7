import type { Reporter, SerializedError, TestModule } from "vitest/node";

/**
 * Ends the run with one plain line, `N passed, N failed[, N skipped]`, that any CI can read whatever the
 * runner's own formatting (vitest's summary is coloured and split over several lines). A failure outside any
 * test counts too: a file that did not load, a hook that threw (its tests show as skipped), an unhandled error.
 */
export default class SummaryReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<SerializedError> = []) {
    const counts = { passed: 0, failed: 0, skipped: 0 };
    for (const m of modules) {
      let failedTests = 0;
      for (const t of m.children.allTests()) {
        const state = t.result().state;
        if (state === "passed") counts.passed++;
        else if (state === "failed") failedTests++;
        else counts.skipped++;
      }
      counts.failed += failedTests;
      if (m.state() === "failed" && failedTests === 0) counts.failed++;
    }
    counts.failed += unhandledErrors.length;
    process.stdout.write(`\n${counts.passed} passed, ${counts.failed} failed${counts.skipped ? `, ${counts.skipped} skipped` : ""}\n`);
  }
}
