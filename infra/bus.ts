import { randomUUID } from "node:crypto";
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
  const pubsub = createPubSub({ eventTarget: localFirst(publishClient, subscribeClient) });
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

type Listener = (e: CustomEvent) => void;
type EventTarget = Parameters<typeof createPubSub>[0] extends infer O ? (O extends { eventTarget?: infer T } ? NonNullable<T> : never) : never;

/**
 * Redis pub/sub that hands a message to this process's own subscribers at once, as it is published, and
 * drops it when Redis brings it back: a server that commits a warm claim is usually the one holding the
 * agent's socket and the watcher's, and a round trip through Redis on each hop is time they wait. Every other
 * process hears it through Redis as before. Local subscribers get what Redis would give them (the message
 * through JSON), so no subscriber can tell where a message came from.
 */
function localFirst(publishClient: Redis, subscribeClient: Redis): EventTarget {
  const origin = randomUUID();
  const local = new Map<string, Set<Listener>>();
  /** Per topic, each subscriber's callback and the one that hears it from Redis for it. */
  const fromRedis = new Map<string, Map<Listener, Listener>>();
  const redis = createRedisEventTarget({
    publishClient,
    subscribeClient,
    serializer: { stringify: (m: unknown) => JSON.stringify([origin, m]), parse: (text: string) => JSON.parse(text) },
  });
  const callbackOf = (l: unknown) => (l && typeof l === "object" && "handleEvent" in l ? (l as { handleEvent: Listener }).handleEvent : (l as Listener));
  return {
    addEventListener(topic: string, l: unknown) {
      if (!l) return;
      const cb = callbackOf(l);
      const set = local.get(topic) ?? new Set<Listener>();
      local.set(topic, set);
      set.add(cb);
      const heard: Listener = (e) => {
        const [from, m] = e.detail as [string, unknown];
        if (from !== origin) cb(new CustomEvent(topic, { detail: m }));
      };
      const heardOn = fromRedis.get(topic) ?? new Map<Listener, Listener>();
      fromRedis.set(topic, heardOn);
      heardOn.set(cb, heard);
      redis.addEventListener(topic, heard as never);
    },
    removeEventListener(topic: string, l: unknown) {
      if (!l) return;
      const cb = callbackOf(l);
      local.get(topic)?.delete(cb);
      if (local.get(topic)?.size === 0) local.delete(topic);
      const heard = fromRedis.get(topic)?.get(cb);
      fromRedis.get(topic)?.delete(cb);
      if (fromRedis.get(topic)?.size === 0) fromRedis.delete(topic);
      if (heard) redis.removeEventListener(topic, heard as never);
    },
    dispatchEvent(event: CustomEvent) {
      redis.dispatchEvent(event as never);
      const here = local.get(event.type);
      if (here?.size) {
        const text = event.detail === undefined ? undefined : JSON.stringify(event.detail);
        for (const cb of [...here]) cb(new CustomEvent(event.type, { detail: text === undefined ? null : JSON.parse(text) }));
      }
      return true;
    },
  } as EventTarget;
}
