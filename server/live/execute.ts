import { createSourceEventStream, type DocumentNode, type ExecutionArgs, type ExecutionResult, execute } from "graphql";
import { onceFor } from "../memo.ts";

/**
 * Subscriptions run on graphql-js directly rather than through the HTTP pipeline's executor, and each event is
 * resolved once per distinct (operation, variables, identity): every subscriber that asked the same thing gets
 * the same result. A thousand watchers of one pool cost one execution per event, not a thousand. The identity
 * is part of the key because some fields (user data) depend on who asks.
 */

type Mask = (r: ExecutionResult) => ExecutionResult;

/**
 * A subscription's live events as graphql-ws `next` frames, for the hub to write straight to the socket
 * (hub.ts, EventStream): the frame for one event, a promise of it where a resolver is asynchronous, or null once
 * the subscription is over. Its payload is serialised once per event and distinct request, like its result, so
 * a thousand watchers of one pool cost one execution and one JSON text per event, and each of them a few bytes
 * of frame around it and a socket write — not graphql-ws's per-message work and a promise per delivery, which
 * were most of a fan-out's time besides the writes themselves.
 */
export type Frames = (event: object) => string | Promise<string> | null;

const docIds = new WeakMap<DocumentNode, number>();
let nextDocId = 0;
/** Results per event object: the feed hands one object to all its sinks, so they meet here. */
const shared = new WeakMap<object, Map<string, Promise<ExecutionResult>>>();
/** The same, serialised: the `payload` of a next frame, per event object and request key. */
const payloads = new WeakMap<object, Map<string, string | Promise<string>>>();

/** How many subscription sources are open: each is released when its stream ends, however it ends. */
export interface OpenSources {
  count: number;
}

export async function subscribeShared(
  args: ExecutionArgs,
  identity: string,
  mask: Mask,
  open: OpenSources,
): Promise<AsyncIterableIterator<ExecutionResult> | ExecutionResult> {
  let doc = docIds.get(args.document);
  if (doc === undefined) {
    doc = nextDocId++;
    docIds.set(args.document, doc);
  }
  const key = `${doc}\u0000${args.operationName ?? ""}\u0000${JSON.stringify(args.variableValues ?? {})}\u0000${identity}`;
  // Set before the source exists: the subscription's field hands it to the hub when it starts its stream.
  const live = (args.contextValue as { live?: { operationId?: string; frames?: Frames; complete?: () => void } } | undefined)?.live;
  let over = false;
  if (live?.operationId !== undefined) {
    const head = `{"id":${JSON.stringify(live.operationId)},"type":"next","payload":`;
    live.frames = (event) => {
      if (over) return null;
      const payload = payloadOf(event, key, args, mask);
      return typeof payload === "string" ? `${head}${payload}}` : payload.then((p) => `${head}${p}}`);
    };
  }
  const source = await createSourceEventStream(args);
  if (!(Symbol.asyncIterator in source)) {
    live?.complete?.();
    return mask(source as ExecutionResult);
  }
  open.count++;
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    open.count--;
  };
  const events = source as AsyncIterableIterator<unknown>;
  const resolve = (event: unknown): Promise<ExecutionResult> => {
    if (typeof event !== "object" || event === null) return Promise.resolve(mask(execute({ ...args, rootValue: event }) as ExecutionResult));
    return onceFor(shared, event, key, () => Promise.resolve(execute({ ...args, rootValue: event })).then(mask));
  };
  const finish = () => {
    // No frame after this: graphql-ws has forgotten the id (the client completed it, or it ended). The source
    // stops on the operation's signal, since its return() may wait behind a next() that never settles.
    over = true;
    live?.complete?.();
    const done = events.return?.();
    if (done) done.then(release, release);
    else release();
  };
  const results: AsyncIterableIterator<ExecutionResult> = {
    async next() {
      const r = await events.next();
      if (r.done) {
        over = true;
        live?.complete?.();
        release();
      }
      return r.done ? r : { done: false, value: await resolve(r.value) };
    },
    // Not awaited: an async generator queues `return` behind a pending `next`, which for a quiet subscription
    // may never settle, and graphql-ws waits for every `return` before it lets go of a closed connection. The
    // connection's end (server/live/hub.ts) is what makes the source finish; `release` counts it when it has.
    async return() {
      finish();
      return { done: true, value: undefined };
    },
    async throw(e?: unknown) {
      finish();
      throw e;
    },
    [Symbol.asyncIterator]() {
      return results;
    },
  };
  return results;
}

/** The serialised result of one event for one request key (see Frames), computed once. */
function payloadOf(event: object, key: string, args: ExecutionArgs, mask: Mask): string | Promise<string> {
  return onceFor(payloads, event, key, () => {
    const result = execute({ ...args, rootValue: event });
    return result instanceof Promise ? result.then((r) => JSON.stringify(mask(r))) : JSON.stringify(mask(result));
  });
}
