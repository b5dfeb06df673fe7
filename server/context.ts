import type { Principal } from "../core/auth/principal.ts";
import type { Platform } from "../infra/platform.ts";
import type { LiveConnection, LiveHub } from "./live/hub.ts";

export interface Context {
  platform: Platform;
  principal: Principal | null;
  requestId: string;
  /** Set for operations on a websocket: the server's live hub and this connection. */
  live?: { hub: LiveHub; conn: LiveConnection };
}

/** The fields every core write takes from the request. */
export const writeCtx = (ctx: Context) => ({
  ids: ctx.platform.ids,
  actor: ctx.principal?.identityId ?? "anonymous",
  now: ctx.platform.now(),
  requestId: ctx.requestId,
});
