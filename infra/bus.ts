import { createRedisEventTarget } from "@graphql-yoga/redis-event-target";
import { createPubSub } from "graphql-yoga";
import { Redis } from "ioredis";
import type { Channels } from "../contracts/channels.ts";

/**
 * Typed pub/sub over the channel map of contracts/channels.ts. In memory for the embedded mode; over Redis when
 * configured, so every server replica and worker sees every message. Topics carry the deployment's prefix.
 */
export interface Bus {
  /** `key` narrows a channel to one subject (a node's specs), so subscribers hear only theirs. */
  publish<K extends keyof Channels>(channel: K, message: Channels[K], key?: string): void;
  subscribe<K extends keyof Channels>(channel: K, key?: string): AsyncIterable<Channels[K]> & AsyncIterator<Channels[K]>;
  /** Resolves when the bus can carry a message now (Redis answers); for /readyz. */
  ping(): Promise<void>;
  close(): Promise<void>;
}

export async function openBus(opts: { redisUrl?: string; prefix: string }): Promise<Bus> {
  const topic = (c: string, key?: string) => (key ? `${opts.prefix}:${c}:${key}` : `${opts.prefix}:${c}`);
  if (!opts.redisUrl) {
    const pubsub = createPubSub();
    return {
      publish: (c, m, k) => pubsub.publish(topic(c, k), m),
      subscribe: (c, k) => pubsub.subscribe(topic(c, k)) as never,
      ping: async () => {},
      close: async () => {},
    };
  }
  // Connect both clients before building the target, or the first messages can be lost (docs/architecture.md, Pitfalls).
  const publishClient = new Redis(opts.redisUrl, { lazyConnect: true });
  const subscribeClient = new Redis(opts.redisUrl, { lazyConnect: true });
  // ioredis reconnects (and resubscribes) by itself; without a listener it prints every failed attempt while
  // Redis is away. Readiness (/readyz pings it) is where an unreachable Redis shows.
  for (const c of [publishClient, subscribeClient]) c.on("error", () => {});
  await Promise.all([publishClient.connect(), subscribeClient.connect()]);
  const pubsub = createPubSub({ eventTarget: createRedisEventTarget({ publishClient, subscribeClient }) });
  return {
    publish: (c, m, k) => pubsub.publish(topic(c, k), m),
    subscribe: (c, k) => pubsub.subscribe(topic(c, k)) as never,
    ping: async () => void (await publishClient.ping()),
    close: async () => {
      publishClient.disconnect();
      subscribeClient.disconnect();
    },
  };
}
