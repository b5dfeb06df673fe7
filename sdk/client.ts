import type { TypedDocumentNode } from "@graphql-typed-document-node/core";
import { type DocumentNode, print } from "graphql";

export * from "./errors.ts";
export * from "./generated.ts";

import { SdkError } from "./errors.ts";

export interface ClientOptions {
  /** The GraphQL endpoint, e.g. http://127.0.0.1:4000/graphql */
  url: string;
  /** A bearer token: an API token, or the operator token. */
  token?: string;
  headers?: Record<string, string>;
  /** Another fetch (a proxy agent, a recorder); by default node:http(s) under Node (sdk/node-post.ts), the global fetch elsewhere. */
  fetch?: typeof fetch;
  /** Give up on a request (it rejects) after this long without its whole answer; no limit by default. */
  timeoutMs?: number;
}

const printed = new WeakMap<DocumentNode, string>();
const source = (doc: DocumentNode) => {
  const known = printed.get(doc);
  if (known) return known;
  const s = print(doc);
  printed.set(doc, s);
  return s;
};

type Post = (
  url: string,
  headers: Record<string, string>,
  body: string,
  signal?: AbortSignal,
  opts?: { repeatable?: boolean },
) => Promise<{ status: number; text: string }>;

/** Whether sending the document twice is harmless (a query), so a connection lost before any answer may retry it. */
const repeatable = (doc: DocumentNode) => doc.definitions.every((d) => d.kind !== "OperationDefinition" || d.operation === "query");

const viaFetch =
  (f: typeof fetch): Post =>
  async (url, headers, body, signal) => {
    const res = await f(url, { method: "POST", headers, body, ...(signal ? { signal } : {}) });
    return { status: res.status, text: await res.text() };
  };

const underNode = typeof process !== "undefined" && typeof process.versions?.node === "string";
let nodePost: Promise<Post> | undefined;

/** A typed client: every operation of sdk/operations is a document whose result and variables are typed. */
export function createClient(opts: ClientOptions) {
  const post = (): Promise<Post> | Post => {
    if (opts.fetch || !underNode) return viaFetch(opts.fetch ?? fetch);
    nodePost ??= import("./node-post.ts").then((m) => m.post);
    return nodePost;
  };
  return {
    async request<R, V extends Record<string, unknown>>(doc: TypedDocumentNode<R, V>, ...vars: V extends Record<string, never> ? [] | [V] : [V]): Promise<R> {
      const headers = {
        "content-type": "application/json",
        accept: "application/graphql-response+json, application/json",
        ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}),
        ...opts.headers,
      };
      const payload = JSON.stringify({ query: source(doc), variables: vars[0] ?? {} });
      const res = await (await post())(opts.url, headers, payload, opts.timeoutMs ? AbortSignal.timeout(opts.timeoutMs) : undefined, {
        repeatable: repeatable(doc),
      });
      const text = res.text;
      let body: { data?: R | null; errors?: SdkError["errors"] };
      try {
        body = JSON.parse(text);
      } catch {
        throw new SdkError([{ message: text.slice(0, 200) }], res.status);
      }
      if (body.errors?.length) throw new SdkError(body.errors, res.status);
      if (!body.data) throw new SdkError([], res.status);
      return body.data;
    },
  };
}
export type Client = ReturnType<typeof createClient>;

export interface WsClientOptions {
  /** The GraphQL endpoint; http(s) is turned into ws(s). */
  url: string;
  token?: string;
  /** Called on every (re)connection; the agent uses it to know it is live again. */
  onConnected?: () => void;
  /** Retries forever with backoff unless limited. */
  retryAttempts?: number;
  /** Close codes after which retrying cannot help; the subscription then fails with the close (default 4401). */
  fatalCloseCodes?: number[];
  /** `request` gives up (it rejects, and the operation is cancelled) after this long without its answer; no limit by default. */
  timeoutMs?: number;
}

/**
 * Subscriptions over graphql-ws, typed like `request`. Reconnects with exponential backoff; a subscription
 * that was live is re-established on reconnect (the server sends the current state first).
 */
export async function createWsClient(opts: WsClientOptions) {
  const { createClient: createGraphqlWs } = await import("graphql-ws");
  const WebSocketImpl = (globalThis as { WebSocket?: unknown }).WebSocket ?? (await import("ws")).WebSocket;
  let connected = false;
  const client = createGraphqlWs({
    url: opts.url.replace(/^http/, "ws"),
    webSocketImpl: WebSocketImpl,
    connectionParams: opts.token ? { authorization: `Bearer ${opts.token}` } : {},
    retryAttempts: opts.retryAttempts ?? Number.POSITIVE_INFINITY,
    shouldRetry: (e) => !(opts.fatalCloseCodes ?? [4401]).includes((e as { code?: number })?.code ?? 0),
    retryWait: async (retries) => new Promise((r) => setTimeout(r, Math.min(10_000, 250 * 2 ** retries) * (0.5 + Math.random() / 2))),
    on: {
      connected: () => {
        connected = true;
        opts.onConnected?.();
      },
      closed: () => {
        connected = false;
      },
    },
    lazy: false,
    // The subscription that fails reports it; graphql-ws would also print it to the console.
    onNonLazyError: () => {},
  });
  const ws = {
    /** Whether the socket is open now: a request made while it is not waits for the next connection. */
    connected: () => connected,
    /**
     * A query or mutation over the socket, as `request` sends it over HTTP: no request of its own to make,
     * parse and authenticate (the socket was, once). Sent again after a reconnection if it had no answer yet.
     */
    async request<R, V extends Record<string, unknown>>(doc: TypedDocumentNode<R, V>, ...vars: V extends Record<string, never> ? [] | [V] : [V]): Promise<R> {
      const it = ws.subscribe(doc, vars[0] as V | undefined);
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = new Promise<never>((_, reject) => {
        if (opts.timeoutMs) timer = setTimeout(() => reject(new Error(`no answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
      });
      try {
        const r = await Promise.race([it.next(), late]);
        if (r.done) throw new Error("the server completed the operation without a result");
        return r.value;
      } finally {
        clearTimeout(timer);
        void it.return?.();
      }
    },
    /** Yields each result; ends when the server completes it; throws an SdkError for GraphQL errors. */
    subscribe<R, V extends Record<string, unknown>>(doc: TypedDocumentNode<R, V>, variables?: V): AsyncIterableIterator<R> {
      const it = client.iterate<R>({ query: source(doc), variables: variables ?? {} });
      return {
        [Symbol.asyncIterator]() {
          return this;
        },
        async next() {
          let r: IteratorResult<{ data?: unknown; errors?: readonly unknown[] }>;
          try {
            r = await it.next();
          } catch (e) {
            // A stream that fails after it began arrives as graphql-ws's error message: the list of errors.
            if (Array.isArray(e) && e.length) throw new SdkError(e as SdkError["errors"]);
            throw e;
          }
          if (r.done) return { done: true, value: undefined };
          if (r.value.errors?.length) throw new SdkError(r.value.errors as SdkError["errors"]);
          return { done: false, value: r.value.data as R };
        },
        async return() {
          await it.return?.();
          return { done: true, value: undefined };
        },
      };
    },
    dispose: () => client.dispose(),
  };
  return ws;
}
export * from "./watch.ts";
