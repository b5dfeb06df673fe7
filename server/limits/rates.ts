import { Redis } from "ioredis";
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from "rate-limiter-flexible";
import type { Config } from "../../infra/config.ts";

/**
 * Points per credential per window (rate-limiter-flexible). With Redis configured the counters live there, so
 * every server replica draws on one budget; if Redis cannot answer, each replica counts in memory until it can.
 */
export interface Rates {
  /** Spend `points` of `caller`'s budget: null when allowed, else how long until the window has room again. */
  take(caller: string, points: number): Promise<{ retryAfterMs: number } | null>;
  close(): Promise<void>;
}

export async function openRates(config: Pick<Config, "limits" | "redisUrl" | "redisPrefix">): Promise<Rates> {
  const { ratePoints, rateWindowSeconds } = config.limits;
  if (ratePoints === 0) return { take: async () => null, close: async () => {} };
  const opts = { points: ratePoints, duration: rateWindowSeconds, keyPrefix: `${config.redisPrefix}:rate` };
  const memory = new RateLimiterMemory(opts);
  let redis: Redis | null = null;
  let limiter: RateLimiterMemory | RateLimiterRedis = memory;
  if (config.redisUrl) {
    // Reconnects by itself; while Redis is away the insurance limiter (memory) takes over.
    redis = new Redis(config.redisUrl, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1 }).on("error", () => {});
    await redis.connect();
    limiter = new RateLimiterRedis({ ...opts, storeClient: redis, rejectIfRedisNotReady: true, insuranceLimiter: memory });
  }
  return {
    async take(caller, points) {
      try {
        await limiter.consume(caller, points);
        return null;
      } catch (e) {
        if (e instanceof RateLimiterRes) return { retryAfterMs: Math.max(1, e.msBeforeNext) };
        throw e;
      }
    },
    async close() {
      redis?.disconnect();
    },
  };
}
