import type { Principal } from "../core/principal.ts";
import type { Platform } from "../infra/platform.ts";

export interface Context {
  platform: Platform;
  principal: Principal | null;
  requestId: string;
}

/** The fields every core write takes from the request. */
export const writeCtx = (ctx: Context) => ({
  ids: ctx.platform.ids,
  actor: ctx.principal?.identityId ?? "anonymous",
  now: ctx.platform.now(),
  requestId: ctx.requestId,
});
