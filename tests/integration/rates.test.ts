import { randomBytes } from "node:crypto";
import { Redis } from "ioredis";
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig } from "../../infra/config.ts";
import { openRates, type Rates, SLICES } from "../../server/limits/rates.ts";
import { redisUrl } from "../support/harness.ts";

const redis = new Redis(redisUrl);
afterAll(() => redis.quit());

/** Two replicas' limiters on one Redis prefix, with `points` per window. */
async function replicas(points: number, windowSeconds = 600, url: string | undefined = redisUrl) {
  const prefix = `bct_${randomBytes(4).toString("hex")}`;
  const config = parseConfig({}, { REDIS_URL: url, REDIS_PREFIX: prefix, LIMIT_RATE_POINTS: String(points), LIMIT_RATE_WINDOW_S: String(windowSeconds) });
  const both = [await openRates(config), await openRates(config)] as const;
  return { prefix, both, close: () => Promise.all(both.map((r) => r.close())) };
}
/** Take one point at a time, alternating between the limiters, until each has been refused once. */
async function spendAll(limiters: readonly Rates[], caller: string) {
  const granted = limiters.map(() => 0);
  const refusals: (number | undefined)[] = limiters.map(() => undefined);
  for (let i = 0; refusals.includes(undefined) && i < 10_000; i++) {
    const k = i % limiters.length;
    if (refusals[k] !== undefined) continue;
    const over = await (limiters[k] as Rates).take(caller, 1);
    if (over) refusals[k] = over.retryAfterMs;
    else granted[k] = (granted[k] as number) + 1;
  }
  return { granted, refusals };
}

describe("rate budgets reserved from Redis in slices", () => {
  it("spends a caller's slice without asking Redis again, and never lets replicas together pass the budget", async () => {
    const { prefix, both, close } = await replicas(200);
    try {
      const [a] = both;
      const slice = 200 / SLICES;
      expect(await a.take("tok", 1)).toBeNull();
      const counted = async () => Number(await redis.get(`${prefix}:rate:tok`));
      expect(await counted()).toBe(slice);
      for (let i = 1; i < slice; i++) expect(await a.take("tok", 1)).toBeNull();
      expect(await counted()).toBe(slice);
      expect(await a.take("tok", 1)).toBeNull();
      expect(await counted()).toBe(2 * slice);

      const { granted, refusals } = await spendAll(both, "tok");
      const total = slice + 1 + granted.reduce((x, y) => x + y, 0);
      // Each replica can be left holding at most one slice it did not spend when the other is refused.
      expect(total).toBeLessThanOrEqual(200);
      expect(total).toBeGreaterThanOrEqual(200 - 2 * slice);
      expect(await counted()).toBe(200);
      for (const ms of refusals) expect(ms).toBeGreaterThan(590_000);
      expect(refusals).toHaveLength(2);
      // Another caller's budget is its own.
      expect(await a.take("other", 1)).toBeNull();
    } finally {
      await close();
    }
  });

  it("reserves a small budget a request at a time, so every replica sees every point spent", async () => {
    const { both, close } = await replicas(20);
    try {
      const { granted } = await spendAll(both, "tok");
      expect(granted.reduce((x, y) => x + y, 0)).toBe(20);
      // An expensive request needs room for all its points at once.
      const fresh = await replicas(20);
      try {
        expect(await fresh.both[0].take("t", 15)).toBeNull();
        expect(await fresh.both[1].take("t", 6)).not.toBeNull();
        expect(await fresh.both[1].take("t", 5)).toBeNull();
      } finally {
        await fresh.close();
      }
    } finally {
      await close();
    }
  });

  it("serves concurrent requests of one caller from one reservation, and starts a new window when the old one ends", async () => {
    const { prefix, both, close } = await replicas(400, 1);
    try {
      const [a] = both;
      const answers = await Promise.all(Array.from({ length: 20 }, () => a.take("tok", 1)));
      expect(answers.every((x) => x === null)).toBe(true);
      expect(Number(await redis.get(`${prefix}:rate:tok`))).toBe(20);
      // The key expires with its window; a hold from that window is void, and the new window counts afresh.
      const deadline = Date.now() + 5000;
      while ((await redis.exists(`${prefix}:rate:tok`)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(await a.take("tok", 1)).toBeNull();
      expect(Number(await redis.get(`${prefix}:rate:tok`))).toBe(20);
    } finally {
      await close();
    }
  });

  it("counts in memory while Redis cannot answer", async () => {
    const { both, close } = await replicas(20);
    // Disconnected: every reservation fails at once (no offline queue), as when Redis is away.
    await close();
    const { granted, refusals } = await spendAll([both[0]], "tok");
    expect(granted).toEqual([20]);
    expect(refusals[0]).toBeGreaterThan(0);
  });
});
