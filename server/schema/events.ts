import { AppError } from "../../contracts/errors.ts";
import { eventsHorizon } from "../../core/books/retention.ts";
import { cursorOf, type EventFilter, eventFilter, headPosition, instanceFilter, parseCursor, type WatchedEvent } from "../../core/instances/events.ts";
import type { Context } from "../context.ts";
import { builder } from "./builder.ts";
import { DesiredState, Instance, InstanceState } from "./instances.ts";

/** Live state: instance events over graphql-ws, resumable from a cursor (server/live/hub.ts). */

const InstanceEvent = builder.objectRef<WatchedEvent>("InstanceEvent").implement({
  description: "One change of an instance's state or desired state, in commit order.",
  fields: (t) => ({
    cursor: t.string({
      description: "Opaque. Pass it as `after` to resume right after this event.",
      resolve: (e) => cursorOf(e.position),
    }),
    instance: t.field({ type: Instance, description: "The instance as it is when the event is delivered.", resolve: (e) => e.instance }),
    fromState: t.field({
      type: InstanceState,
      nullable: true,
      description: "Null for the event that created it.",
      resolve: (e) => e.fromState as "pending" | null,
    }),
    toState: t.field({ type: InstanceState, resolve: (e) => e.toState as "pending" }),
    desiredState: t.field({ type: DesiredState, resolve: (e) => e.desiredState as "running" }),
    reason: t.exposeString("reason", {
      description: "Why: `created`, `requested:<desired>`, or the reconciler's reason (host report, lost host, recreate, …).",
    }),
    actor: t.exposeString("actor", { description: "An identity id, `reconciler`, or `node:<id>`." }),
    version: t.exposeInt("version", { description: "The instance's version after the change: per instance, every event in order, no gaps." }),
    at: t.expose("at", { type: "DateTime" }),
  }),
});

/**
 * The event feed for a filter, from a cursor (refused when the cursor is ahead of every event, or older than the
 * history retention keeps). Shared with sandboxEvents. `asIs`: the subscription's field resolves each event as
 * it is (no stream of its own in between), so its live tail can go to the socket as frames (live/execute.ts).
 */
export async function watch(ctx: Context, filter: EventFilter, after: string | null | undefined, opts: { asIs?: boolean } = {}) {
  if (!ctx.live) throw new AppError("UNSUPPORTED", "subscriptions run over the websocket (graphql-ws) on the same URL");
  const from = after ? parseCursor(after) : null;
  // A cursor no event has reached (the database was restored from a backup, or the cursor is made up) would
  // silently skip every event up to it. The SDK answers this by subscribing again from now.
  if (from !== null && (await ctx.live.hub.isAhead(from, (fn) => ctx.platform.read(fn)))) {
    throw new AppError("PRECONDITION_FAILED", `cursor ${after} is ahead of the newest event; subscribe again without one (from now) and re-read state`, {
      cursor: "ahead",
    });
  }
  // A cursor below what retention has deleted would skip the pruned events. "0" asks for all there is, so it
  // is not refused: it replays what is kept.
  if (from !== null && from > 0n && from < (await ctx.platform.read(eventsHorizon))) {
    throw new AppError(
      "PRECONDITION_FAILED",
      `cursor ${after} is older than the event history kept (retention); subscribe again without one (from now) and re-read state`,
      { cursor: "expired" },
    );
  }
  const { hub, conn, frames, replay, signal } = ctx.live;
  return hub.watch(conn, filter, from, { frames: opts.asIs ? frames : undefined, replay, signal });
}

const readsInstances = { operator: true, tenantScope: "compute:instances:read" } as const;

builder.queryFields((t) => ({
  instanceEventsCursor: t.withAuth(readsInstances).string({
    description: "The cursor of the newest event. Read state, then subscribe with `after` set to this, and nothing that happens in between is missed.",
    resolve: async (_r, _a, ctx) => cursorOf(await ctx.platform.read(headPosition)),
  }),
}));

builder.subscriptionFields((t) => ({
  instanceEvents: t.withAuth(readsInstances).field({
    type: InstanceEvent,
    description:
      "Every change of the instances the caller can see (tenants: their tenant's; operators: all), narrowed by pool or project. " +
      "With `after`, the events missed since that cursor come first, then the live stream: no gap, no repeat.",
    args: { poolId: t.arg.id(), projectId: t.arg.id(), after: t.arg.string() },
    subscribe: (_r, args, ctx) => {
      const filter = eventFilter(ctx.principal, {
        poolId: args.poolId ? String(args.poolId) : null,
        projectId: args.projectId ? String(args.projectId) : null,
      });
      return watch(ctx, filter, args.after, { asIs: true });
    },
    resolve: (e) => e,
  }),
  instanceChanged: t.withAuth(readsInstances).field({
    type: InstanceEvent,
    description: "The changes of one instance; NOT_FOUND unless the caller can read it. `after` resumes as for instanceEvents.",
    args: { id: t.arg.id({ required: true }), after: t.arg.string() },
    subscribe: async (_r, args, ctx) => {
      const filter = await ctx.platform.read((sql) => instanceFilter(sql, ctx.principal, String(args.id)));
      return watch(ctx, filter, args.after, { asIs: true });
    },
    resolve: (e) => e,
  }),
}));
