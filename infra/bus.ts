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
  // Not auto-pipelined: ioredis defers such a batch with setImmediate, past whatever I/O the loop holds, and a
  // host's command or a subscriber's hint would wait for it (measured: create → RUNNING 5 ms slower).
  const publishClient = new Redis(opts.redisUrl, { lazyConnect: true });
  const subscribeClient = new Redis(opts.redisUrl, { lazyConnect: true });
  // ioredis reconnects (and resubscribes) by itself; without a listener it prints every failed attempt while
  // Redis is away. Readiness (/readyz pings it) is where an unreachable Redis shows.
  for (const c of [publishClient, subscribeClient]) c.on("error", () => {});
  await Promise.all([publishClient.connect(), subscribeClient.connect()]);
  const pubsub = createPubSub({ eventTarget: localFirst(publishClient, subscribeClient) });
  const batch = corkedUntilTick(publishClient);
  return {
    publish: (c, m, k) => {
      batch();
      pubsub.publish(topic(c, k), m);
    },
    subscribe: (c, k) => pubsub.subscribe(topic(c, k)) as never,
    ping: async () => void (await publishClient.ping()),
    close: async () => {
      publishClient.disconnect();
      subscribeClient.disconnect();
    },
  };
}

/**
 * Holds the client's writes until the current tick's synchronous work is done (process.nextTick, before any I/O),
 * so a write's messages leave in one syscall instead of one each. Unlike ioredis's auto-pipelining, which waits
 * for setImmediate, this defers nothing past the code that published them.
 */
function corkedUntilTick(client: Redis): () => void {
  let corked: { uncork(): void } | null = null;
  return () => {
    const stream = (client as unknown as { stream?: { cork(): void; uncork(): void; writable?: boolean } }).stream;
    if (corked || !stream?.writable) return;
    stream.cork();
    corked = stream;
    process.nextTick(() => {
      corked = null;
      stream.uncork();
    });
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
  /** Per topic, this process's subscribers: each callback and the one that hears it from Redis for it. */
  const listeners = new Map<string, Map<Listener, Listener>>();
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
      const heard: Listener = (e) => {
        const [from, m] = e.detail as [string, unknown];
        if (from !== origin) cb(new CustomEvent(topic, { detail: m }));
      };
      const onTopic = listeners.get(topic) ?? new Map<Listener, Listener>();
      listeners.set(topic, onTopic);
      onTopic.set(cb, heard);
      redis.addEventListener(topic, heard as never);
    },
    removeEventListener(topic: string, l: unknown) {
      if (!l) return;
      const cb = callbackOf(l);
      const onTopic = listeners.get(topic);
      const heard = onTopic?.get(cb);
      onTopic?.delete(cb);
      if (onTopic?.size === 0) listeners.delete(topic);
      if (heard) redis.removeEventListener(topic, heard as never);
    },
    dispatchEvent(event: CustomEvent) {
      redis.dispatchEvent(event as never);
      const here = listeners.get(event.type);
      if (here?.size) {
        // One copy through JSON for all of them, as Redis's own delivery parses a message once for its listeners.
        const local = new CustomEvent(event.type, { detail: event.detail === undefined ? null : JSON.parse(JSON.stringify(event.detail)) });
        for (const cb of [...here.keys()]) cb(local);
      }
      return true;
    },
  } as EventTarget;
}
