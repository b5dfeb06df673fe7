import { createSourceEventStream, type DocumentNode, type ExecutionArgs, type ExecutionResult, execute } from "graphql";

/**
 * Subscriptions run on graphql-js directly rather than through the HTTP pipeline's executor, and each event is
 * resolved once per distinct (operation, variables, identity): every subscriber that asked the same thing gets
 * the same result. A thousand watchers of one pool cost one execution per event, not a thousand. The identity
 * is part of the key because some fields (user data) depend on who asks.
 */

type Mask = (r: ExecutionResult) => ExecutionResult;

const docIds = new WeakMap<DocumentNode, number>();
let nextDocId = 0;
/** Results per event object: the feed hands one object to all its sinks, so they meet here. */
const shared = new WeakMap<object, Map<string, Promise<ExecutionResult>>>();

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
  const source = await createSourceEventStream(args);
  if (!(Symbol.asyncIterator in source)) return mask(source as ExecutionResult);
  open.count++;
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    open.count--;
  };
  let doc = docIds.get(args.document);
  if (doc === undefined) {
    doc = nextDocId++;
    docIds.set(args.document, doc);
  }
  const key = `${doc}\u0000${args.operationName ?? ""}\u0000${JSON.stringify(args.variableValues ?? {})}\u0000${identity}`;
  const events = source as AsyncIterableIterator<unknown>;
  const resolve = (event: unknown): Promise<ExecutionResult> => {
    if (typeof event !== "object" || event === null) return Promise.resolve(mask(execute({ ...args, rootValue: event }) as ExecutionResult));
    let results = shared.get(event);
    if (!results) {
      results = new Map();
      shared.set(event, results);
    }
    let result = results.get(key);
    if (!result) {
      result = Promise.resolve(execute({ ...args, rootValue: event })).then(mask);
      results.set(key, result);
    }
    return result;
  };
  const finish = () => {
    const done = events.return?.();
    if (done) done.then(release, release);
    else release();
  };
  const results: AsyncIterableIterator<ExecutionResult> = {
    async next() {
      const r = await events.next();
      if (r.done) release();
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
