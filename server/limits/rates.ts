import { Redis } from "ioredis";
import { RateLimiterMemory, RateLimiterRes } from "rate-limiter-flexible";
import type { Config } from "../../infra/config.ts";

/**
 * Points per credential per window. With Redis configured the counters live there, so every server replica
 * draws on one budget; if Redis cannot answer, each replica counts in memory until it can.
 */
export interface Rates {
  /** Spend `points` of `caller`'s budget: null when allowed, else how long until the window has room again. */
  take(caller: string, points: number): Promise<{ retryAfterMs: number } | null>;
  close(): Promise<void>;
}

/**
 * A server reserves a caller's points from Redis a slice at a time and spends them here, rather than asking
 * Redis on every request: a round trip to Redis cost a busy server about as much CPU as the rest of a cheap
 * request. A slice is a twentieth of the budget, so what one replica holds and may not use is at most 5 % of a
 * caller's budget; the budget is never exceeded, since points are counted in Redis before they are spent. A
 * budget under 40 points is reserved a request at a time, exactly as asked.
 */
export const SLICES = 20;

/**
 * Reserve at least ARGV[1] and up to ARGV[2] points of the window's budget ARGV[3] (ms ARGV[4]) at KEYS[1].
 * Returns the points granted (0: not even the least fits) and the ms left in the window.
 */
const RESERVE = `
local ttl = redis.call('PTTL', KEYS[1])
local used = 0
if ttl > 0 then used = tonumber(redis.call('GET', KEYS[1])) else ttl = tonumber(ARGV[4]) end
local room = tonumber(ARGV[3]) - used
if room < tonumber(ARGV[1]) then return {0, ttl} end
local grant = math.min(tonumber(ARGV[2]), room)
redis.call('SET', KEYS[1], used + grant, 'PX', ttl)
return {grant, ttl}`;

type Reserving = Redis & { bcReserve(key: string, least: number, most: number, budget: number, windowMs: number): Promise<[number, number]> };

export async function openRates(config: Pick<Config, "limits" | "redisUrl" | "redisPrefix">): Promise<Rates> {
  const { ratePoints, rateWindowSeconds } = config.limits;
  if (ratePoints === 0) return { take: async () => null, close: async () => {} };
  const memory = new RateLimiterMemory({ points: ratePoints, duration: rateWindowSeconds, keyPrefix: `${config.redisPrefix}:rate` });
  const inMemory = async (caller: string, points: number) => {
    try {
      await memory.consume(caller, points);
      return null;
    } catch (e) {
      if (e instanceof RateLimiterRes) return { retryAfterMs: Math.max(1, e.msBeforeNext) };
      throw e;
    }
  };
  if (!config.redisUrl) return { take: inMemory, close: async () => {} };

  // Reconnects by itself; while Redis is away, each replica counts in memory.
  const redis = new Redis(config.redisUrl, { lazyConnect: true, enableOfflineQueue: false, maxRetriesPerRequest: 1 }).on("error", () => {}) as Reserving;
  redis.defineCommand("bcReserve", { numberOfKeys: 1, lua: RESERVE });
  await redis.connect();
  const windowMs = rateWindowSeconds * 1000;
  const slice = Math.max(1, Math.floor(ratePoints / SLICES));
  /** Points reserved in Redis and not yet spent, per caller, until their window ends. */
  const held = new Map<string, { left: number; until: number }>();
  /** One reservation at a time per caller: the requests that wait for it spend what it brings. */
  const reserving = new Map<string, Promise<{ retryAfterMs: number } | null>>();
  /** Holds of ended windows are dropped when the map has doubled since the last sweep. */
  let sweepAt = 4096;
  const sweep = (now: number) => {
    for (const [caller, h] of held) if (h.until <= now) held.delete(caller);
    sweepAt = Math.max(4096, 2 * held.size);
  };

  /** What `caller` holds to spend at `now`: a hold from an ended window is void (its key has expired). */
  const holding = (caller: string, now: number) => {
    const h = held.get(caller);
    return h && h.until > now ? h.left : 0;
  };

  const reserve = async (caller: string, points: number): Promise<{ retryAfterMs: number } | null> => {
    const now = Date.now();
    const need = points - holding(caller, now);
    const [granted, ttl] = await redis.bcReserve(`${config.redisPrefix}:rate:${caller}`, need, Math.max(need, slice), ratePoints, windowMs);
    if (granted === 0) return { retryAfterMs: Math.max(1, ttl) };
    // Read again: requests that found enough may have spent from the hold while Redis answered.
    held.set(caller, { left: holding(caller, now) + granted, until: now + ttl });
    if (held.size > sweepAt) sweep(now);
    return null;
  };

  const take = async (caller: string, points: number): Promise<{ retryAfterMs: number } | null> => {
    for (;;) {
      const h = held.get(caller);
      if (h && h.until > Date.now() && h.left >= points) {
        h.left -= points;
        return null;
      }
      const pending = reserving.get(caller);
      if (pending) {
        await pending.catch(() => null);
        continue;
      }
      const done = reserve(caller, points).finally(() => reserving.delete(caller));
      reserving.set(caller, done);
      const refused = await done;
      if (refused) return refused;
    }
  };

  return {
    async take(caller, points) {
      try {
        return await take(caller, points);
      } catch {
        return inMemory(caller, points);
      }
    },
    async close() {
      redis.disconnect();
    },
  };
}
