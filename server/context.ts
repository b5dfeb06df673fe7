import type { GraphQLResolveInfo } from "graphql";
import type { Principal } from "../core/auth/principal.ts";
import type { Write } from "../core/kernel/write.ts";
import type { Logger } from "../infra/log.ts";
import type { Platform } from "../infra/platform.ts";
import type { Frames } from "./live/execute.ts";
import type { LiveConnection, LiveHub, Replay } from "./live/hub.ts";

export interface Context {
  platform: Platform;
  principal: Principal | null;
  requestId: string;
  /** The request's logger: every line carries its request id (and on a websocket, the connection and operation ids). */
  log: Logger;
  /**
   * Set for operations on a websocket: the server's live hub, this connection, the operation's graphql-ws id and,
   * for a subscription, how its events become frames written straight to the socket (server/live/execute.ts) and
   * how its replay is read and paid for (set when the subscription is admitted: server/limits/live.ts).
   */
  live?: {
    hub: LiveHub;
    conn: LiveConnection;
    operationId?: string;
    frames?: Frames;
    replay?: Replay;
    /** A subscription's own end: aborted when it completes or its connection ends (the connection's, otherwise). */
    signal: AbortSignal;
    /** Called by the subscription's source when it is done (server/live/execute.ts). */
    complete?: () => void;
  };
}

/**
 * A mutation's body, run on the write path as the caller, with the mutation's own field name as its audit
 * action: every mutation resolver goes through here, so none can write without an audit row.
 */
export function mutate<T>(ctx: Context, info: GraphQLResolveInfo, fn: (w: Write) => Promise<T>): Promise<T> {
  return ctx.platform.write({ actor: ctx.principal?.identityId ?? "anonymous", requestId: ctx.requestId, action: info.fieldName }, fn);
}
