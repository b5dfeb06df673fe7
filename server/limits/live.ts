import { setTimeout as sleep } from "node:timers/promises";
import { type ExecutionArgs, GraphQLError } from "graphql";
import type { Principal } from "../../core/auth/principal.ts";
import type { Platform } from "../../infra/platform.ts";
import type { Context } from "../context.ts";
import type { LiveHub, Replay } from "../live/hub.ts";
import { limitError } from "./document.ts";
import type { Rates } from "./rates.ts";
import { admitOperation, COST_PER_POINT, callerKey, holdRefused, pointsFor } from "./request.ts";

/**
 * What a websocket may cost (docs/architecture.md, Limits): subscriptions pay like queries. A subscription is
 * admitted as any operation is (cost budget, the caller's rate, the caller's lane for its reads), and is
 * refused past the caps on what one connection and one caller hold open on this server. Its replay (a cursor
 * behind the head) is read a page at a time on the caller's lane, each page paid for like a query of that
 * many items before it is sent; a caller out of points waits for its window rather than failing, so a replay
 * is paced, never cut short. Hosts are exempt throughout: their streams are what the platform runs on.
 */
export interface LiveLimits {
  /** Why a connection of `principal` from `address` may not open now, or null. */
  connection(hub: LiveHub, principal: Principal | null, address: string | undefined): string | null;
  /** Admit a subscription before it starts: sets its lane and replay on the context, or says why not. */
  subscription(args: ExecutionArgs): Promise<GraphQLError | null>;
}

/** The most events of one replay page, whatever the budget (a page is one statement and one pause). */
const PAGE_MAX = 100;
/** A page never costs more than this share of a caller's budget, so one page always fits in a window. */
const PAGE_SHARE = 4;

export function liveLimits(platform: Platform, rates: Rates): LiveLimits {
  const { limits } = platform.config;
  const capped = (cap: number, n: number) => cap > 0 && n > cap;
  return {
    connection(hub, principal, address) {
      if (principal?.nodeId) return null;
      const caller = callerKey(principal, address);
      if (!capped(limits.connectionsPerCaller, hub.connectionsOf(caller) + 1)) return null;
      return `too many connections for this credential (limits.connectionsPerCaller: ${limits.connectionsPerCaller})`;
    },

    async subscription(args) {
      const ctx = args.contextValue as Context;
      const refused = await admitSubscription(args, ctx);
      if (refused) holdRefused(ctx, refused);
      return refused;
    },
  };

  async function admitSubscription(args: ExecutionArgs, ctx: Context): Promise<GraphQLError | null> {
    const live = ctx.live;
    if (!live || ctx.principal?.nodeId) return null;
    const caller = live.conn.info.caller ?? callerKey(ctx.principal, undefined);
    // This subscription counts already (LiveConnection.operation, taken before it is admitted); one refused
    // stops counting at once, so a storm of refusals does not crowd out what it was refused for.
    if (capped(limits.subscriptionsPerConnection, live.conn.subscriptions)) {
      return capError(`this connection has ${limits.subscriptionsPerConnection} subscriptions open`, "subscriptionsPerConnection");
    }
    if (capped(limits.subscriptionsPerCaller, live.hub.subscriptionsOf(caller))) {
      return capError(`this credential has ${limits.subscriptionsPerCaller} subscriptions open on this server`, "subscriptionsPerCaller");
    }
    const admitted = await admitOperation(platform, rates, args, false);
    if (admitted instanceof GraphQLError) return admitted;
    if (!admitted?.caller) return null;
    ctx.platform = admitted.platform;
    live.replay = replayFor(admitted.platform, rates, admitted.caller, Math.max(1, admitted.cost), live.signal);
    return null;
  }
}

function capError(what: string, setting: "subscriptionsPerConnection" | "subscriptionsPerCaller"): GraphQLError {
  const e = limitError(`${what}, the most it may; complete one first`, setting);
  // A cap frees as subscriptions end: a retry later may pass, which is what RATE_LIMITED tells a client.
  return new GraphQLError(e.message, { extensions: { ...e.extensions, code: "RATE_LIMITED", retryAfterMs: 1000 } });
}

/** Reads on the caller's lane; pages sized so that one costs at most a PAGE_SHARE of the caller's budget. */
function replayFor(lane: Platform, rates: Rates, caller: string, costPerEvent: number, signal: AbortSignal): Replay {
  const budget = lane.config.limits.ratePoints;
  const page = budget === 0 ? PAGE_MAX : Math.max(1, Math.min(PAGE_MAX, Math.floor(((budget / PAGE_SHARE) * COST_PER_POINT) / costPerEvent)));
  return {
    read: (fn) => lane.read(fn),
    page,
    async pay(events) {
      for (;;) {
        const over = await rates.take(caller, pointsFor(events * costPerEvent));
        if (!over) return;
        // The subscription's end stops the wait; the replay then finds its stream ended and stops too.
        const ended = await sleep(over.retryAfterMs, false, { signal }).catch(() => true);
        if (ended) return;
      }
    },
  };
}
