import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { print } from "graphql";
import { SdkError } from "./errors.ts";
import { InstanceChangedDocument, type InstanceEventFieldsFragment, InstanceEventsDocument } from "./generated.ts";

export interface WatchOptions {
  /** The GraphQL endpoint; http(s) is turned into ws(s). */
  url: string;
  token?: string;
  /** Resume right after this cursor (from an event, or from the `instanceEventsCursor` query). */
  after?: string | null;
  /** Called before each reconnect, with why the last connection ended. */
  onReconnect?: (why: { code: number | null; reason: string; attempt: number }) => void;
  /**
   * Called when the server cannot resume from the cursor (it is ahead of every event, as after a restore from
   * backup, or older than the history the server keeps): the watch goes on from now, and events in between are
   * missed, so re-read the state you keep.
   */
  onResync?: (why: { cursor: string | null; message: string }) => void;
  /** Reconnects in a row before giving up (default: forever). */
  maxAttempts?: number;
  /** Stops the watch: the iteration ends, even while it waits for the next event. */
  signal?: AbortSignal;
}

/** Codes after which coming back cannot help: the request or the credential is wrong. */
const FINAL = new Set([4400, 4401, 4403, 4406, 4409, 4429, 4500]);

/**
 * Every event the caller may see, resumed across disconnects: after a restart of the server, a network drop or
 * being cut off as a slow consumer, it subscribes again from the cursor of the last event it yielded, so each
 * event is seen once and in order. Ends with an SdkError (code UNAUTHENTICATED) when the credential is revoked.
 */
export function watchInstanceEvents(opts: WatchOptions & { poolId?: string; projectId?: string }): AsyncGenerator<InstanceEventFieldsFragment> {
  return resumable(opts, InstanceEventsDocument, { poolId: opts.poolId, projectId: opts.projectId }, (d) => d.instanceEvents);
}

/** The same for one instance. */
export function watchInstance(opts: WatchOptions & { id: string }): AsyncGenerator<InstanceEventFieldsFragment> {
  return resumable(opts, InstanceChangedDocument, { id: opts.id }, (d) => d.instanceChanged);
}

async function* resumable<R, V extends { after?: string | null }>(
  opts: WatchOptions,
  doc: TypedDocumentNode<R, V>,
  vars: Omit<V, "after">,
  pick: (data: R) => InstanceEventFieldsFragment,
): AsyncGenerator<InstanceEventFieldsFragment> {
  const { createClient } = await import("graphql-ws");
  const WebSocketImpl = (globalThis as { WebSocket?: unknown }).WebSocket ?? (await import("ws")).WebSocket;
  // No retries inside graphql-ws: it would subscribe again with the first cursor and repeat events.
  const client = createClient({
    url: opts.url.replace(/^http/, "ws"),
    webSocketImpl: WebSocketImpl,
    connectionParams: opts.token ? { authorization: `Bearer ${opts.token}` } : {},
    retryAttempts: 0,
    lazy: true,
    lazyCloseTimeout: 0,
    keepAlive: 10_000,
  });
  const query = print(doc);
  let after = opts.after ?? null;
  let attempt = 0;
  // Disposing ends the pending iteration; a generator's own return() would wait for the next event first.
  const abort = () => void client.dispose();
  opts.signal?.addEventListener("abort", abort, { once: true });
  try {
    while (!opts.signal?.aborted) {
      try {
        for await (const r of client.iterate<R>({ query, variables: { ...vars, after } })) {
          if (r.errors?.length) throw new SdkError(r.errors as SdkError["errors"]);
          const event = pick(r.data as R);
          after = event.cursor;
          attempt = 0;
          yield event;
        }
        return;
      } catch (e) {
        if (opts.signal?.aborted) return;
        if (e instanceof SdkError && after !== null && cursorUnknown(e)) {
          opts.onResync?.({ cursor: after, message: e.message });
          after = null;
          continue;
        }
        // Over the credential's rate or its cap on open subscriptions: come back when the server says.
        if (e instanceof SdkError && e.code === "RATE_LIMITED" && attempt < (opts.maxAttempts ?? Number.POSITIVE_INFINITY)) {
          attempt++;
          opts.onReconnect?.({ code: null, reason: e.message, attempt });
          await new Promise((r) => setTimeout(r, retryAfter(e)));
          continue;
        }
        if (e instanceof SdkError) throw e;
        const { code, reason } = closeOf(e);
        if (code === 4401) throw new SdkError([{ message: reason || "credential expired or revoked", extensions: { code: "UNAUTHENTICATED" } }]);
        if ((code !== null && FINAL.has(code)) || attempt >= (opts.maxAttempts ?? Number.POSITIVE_INFINITY)) throw e;
        attempt++;
        opts.onReconnect?.({ code, reason, attempt });
        await new Promise((r) => setTimeout(r, Math.min(5000, 100 * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2)));
      }
    }
  } finally {
    opts.signal?.removeEventListener("abort", abort);
    await client.dispose();
  }
}

/** How long a RATE_LIMITED answer asks to wait (a second when it does not say), with jitter so watchers spread out. */
function retryAfter(e: SdkError): number {
  const ms = e.errors.find((x) => typeof x.extensions?.retryAfterMs === "number")?.extensions?.retryAfterMs as number | undefined;
  return (ms ?? 1000) * (1 + Math.random() / 4);
}

/** The server's answer to a cursor it cannot resume from: subscribe again without one. */
function cursorUnknown(e: SdkError): boolean {
  return e.code === "PRECONDITION_FAILED" && e.errors.some((x) => x.extensions?.cursor !== undefined);
}

function closeOf(e: unknown): { code: number | null; reason: string } {
  const c = e as { code?: unknown; reason?: unknown; message?: unknown };
  return { code: typeof c?.code === "number" ? c.code : null, reason: String(c?.reason ?? c?.message ?? e) };
}
