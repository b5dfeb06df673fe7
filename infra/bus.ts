import { createRedisEventTarget } from "@graphql-yoga/redis-event-target";
import { createPubSub } from "graphql-yoga";
import { Redis } from "ioredis";
import type { Channels } from "../core/events.ts";

/**
 * Typed pub/sub over the channel map of core/events.ts. In memory for the embedded mode; over Redis when
 * configured, so every server replica and worker sees every message. Topics carry the deployment's prefix.
 */
export interface Bus {
  publish<K extends keyof Channels>(channel: K, message: Channels[K]): void;
  subscribe<K extends keyof Channels>(channel: K): AsyncIterable<Channels[K]> & AsyncIterator<Channels[K]>;
  close(): Promise<void>;
}

export async function openBus(opts: { redisUrl?: string; prefix: string }): Promise<Bus> {
  const topic = (c: string) => `${opts.prefix}:${c}`;
  if (!opts.redisUrl) {
    const pubsub = createPubSub();
    return {
      publish: (c, m) => pubsub.publish(topic(c), m),
      subscribe: (c) => pubsub.subscribe(topic(c)) as never,
      close: async () => {},
    };
  }
  // Connect both clients before building the target, or the first messages can be lost (STACK.md, pitfall 6).
  const publishClient = new Redis(opts.redisUrl, { lazyConnect: true });
  const subscribeClient = new Redis(opts.redisUrl, { lazyConnect: true });
  await Promise.all([publishClient.connect(), subscribeClient.connect()]);
  const pubsub = createPubSub({ eventTarget: createRedisEventTarget({ publishClient, subscribeClient }) });
  return {
    publish: (c, m) => pubsub.publish(topic(c), m),
    subscribe: (c) => pubsub.subscribe(topic(c)) as never,
    close: async () => {
      publishClient.disconnect();
      subscribeClient.disconnect();
    },
  };
}
