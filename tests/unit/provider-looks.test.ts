import { describe, expect, it } from "vitest";
import { lookAfter } from "../../core/pools/provider/sync.ts";

const POLL = { minMs: 1000, maxMs: 30_000 };

/** A run's looks at a machine busy until `readyMs` after its first wait: when the first look finds it ready, and how many looks that took. */
function seen(readyMs: number, poll = POLL) {
  let at = 0;
  for (let looks = 1; ; looks++) {
    at += lookAfter(at, poll);
    if (at >= readyMs) return { at, looks };
  }
}

describe("the provider reconciler's looks at a busy machine", () => {
  it("sees a ready machine within a third of the time it took (at least the shortest wait, at most the longest)", () => {
    // Doubling from one second saw a machine ready at 4.05 s only at 7 s, and one ready at 16 s at 31 s.
    for (let ready = 100; ready <= 3_600_000; ready = Math.ceil(ready * 1.05)) {
      const late = seen(ready).at - ready;
      expect(late, `ready at ${ready} ms`).toBeLessThanOrEqual(Math.min(POLL.maxMs, Math.max(POLL.minMs, Math.ceil(ready / 3))));
    }
    expect(seen(4050).at).toBeLessThanOrEqual(5400);
  });

  it("keeps its looks few: geometric growth, the shortest wait at first and the longest at last", () => {
    expect(seen(60_000).looks).toBeLessThanOrEqual(14);
    expect(seen(20_000).looks).toBeLessThanOrEqual(10);
    // An hour's wait is mostly looks at the longest wait: one every 30 s once ninety seconds have gone by.
    expect(seen(3_600_000).looks).toBeLessThanOrEqual(seen(90_000).looks + Math.ceil((3_600_000 - 90_000) / POLL.maxMs));
    for (const waited of [0, 10, 999, 3000, 3001, 45_000, 90_000, 10_000_000]) {
      const next = lookAfter(waited, POLL);
      expect(next).toBeGreaterThanOrEqual(POLL.minMs);
      expect(next).toBeLessThanOrEqual(POLL.maxMs);
    }
    expect(lookAfter(0, POLL)).toBe(POLL.minMs);
    expect(lookAfter(9000, POLL)).toBe(3000);
  });
});
