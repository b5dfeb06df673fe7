import { createClient as createGraphqlWs } from "graphql-ws";
import { WebSocket } from "ws";
import { type Client, InstanceEventsCursorDocument } from "../../sdk/client.ts";

/** What a test watcher saw: the events, the errors, and how its connection ended. */
export interface Watcher<T> {
  events: T[];
  errors: unknown[];
  closed: { code: number; reason: string } | null;
  socket: WebSocket | null;
  dispose(): Promise<void>;
}

/**
 * One subscription on one raw graphql-ws connection without retries, so a test sees exactly what the server
 * did: every payload, every error, the close code and reason.
 */
export function watcher<T = Record<string, unknown>>(
  httpUrl: string,
  token: string | undefined,
  query: string,
  variables: Record<string, unknown>,
  pick: (data: Record<string, unknown>) => T = (d) => Object.values(d)[0] as T,
): Watcher<T> {
  const w: Watcher<T> = { events: [], errors: [], closed: null, socket: null, dispose: async () => {} };
  const client = createGraphqlWs({
    url: httpUrl.replace(/^http/, "ws"),
    webSocketImpl: WebSocket,
    connectionParams: token ? { authorization: `Bearer ${token}` } : {},
    retryAttempts: 0,
    lazy: true,
    on: {
      connected: (socket) => {
        w.socket = socket as WebSocket;
      },
      closed: (e) => {
        const c = e as { code: number; reason: string };
        w.closed = { code: c.code, reason: String(c.reason) };
      },
    },
  });
  client.subscribe(
    { query, variables },
    {
      next: (r) => (r.errors?.length ? w.errors.push(...r.errors) : w.events.push(pick(r.data as Record<string, unknown>))),
      error: (e) => w.errors.push(e),
      complete: () => {},
    },
  );
  w.dispose = async () => client.dispose();
  return w;
}

/** The newest event's cursor: subscribing after it misses nothing that happens from now on. */
export const headCursor = async (c: Client) => (await c.request(InstanceEventsCursorDocument)).instanceEventsCursor;

export const EVENT_FIELDS = `cursor fromState toState desiredState reason actor version at instance { id state desiredState version tenantId poolId }`;
