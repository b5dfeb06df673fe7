import { getSnapshot, listSnapshots, restoreInstance, type Snapshot, snapshotInstance } from "../../core/lifecycle/snapshots.ts";
import { type Context, mutate } from "../context.ts";
import { builder } from "./builder.ts";
import { Instance } from "./instances.ts";

/** Snapshots of an instance's memory and disk, and restores from them (operators, for now). */

export const SnapshotState = builder.enumType("SnapshotState", {
  values: {
    CREATING: { value: "creating", description: "Its host is saving it." },
    READY: { value: "ready" },
    FAILED: { value: "failed", description: "The host could not save it, or did not in time; `error` says why." },
    DELETED: { value: "deleted" },
  } as const,
});

const InstanceSnapshot = builder.objectRef<Snapshot>("InstanceSnapshot").implement({
  description: "An instance's memory and disk as saved on its host; restoring puts the instance back there.",
  fields: (t) => ({
    id: t.exposeID("id"),
    instanceId: t.exposeID("instanceId"),
    nodeId: t.exposeID("nodeId", { description: "The host holding it: only an instance on that host can be restored from it." }),
    state: t.field({ type: SnapshotState, resolve: (s) => s.state }),
    sizeBytes: t.exposeFloat("sizeBytes", { nullable: true }),
    error: t.exposeString("error", { nullable: true }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    readyAt: t.expose("readyAt", { type: "DateTime", nullable: true }),
  }),
});

const timeoutMs = (ctx: Context) => ({ timeoutMs: ctx.platform.config.hosts.commandTimeoutMs });

builder.queryFields((t) => ({
  instanceSnapshots: t.withAuth({ operator: true }).field({
    type: [InstanceSnapshot],
    args: { instanceId: t.arg.id({ required: true }) },
    resolve: (_r, { instanceId }, ctx) => ctx.platform.read((sql) => listSnapshots(sql, String(instanceId))),
  }),
  instanceSnapshot: t.withAuth({ operator: true }).field({
    type: InstanceSnapshot,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => (await ctx.platform.read((sql) => getSnapshot(sql, String(id)))) ?? null,
  }),
}));

builder.mutationFields((t) => ({
  snapshotInstance: t.withAuth({ operator: true }).field({
    type: InstanceSnapshot,
    description: "Save a running or paused instance's memory and disk on its host; it keeps running. The snapshot becomes READY when the host is done.",
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => snapshotInstance(w, ctx.principal, String(id), timeoutMs(ctx))),
  }),
  restoreInstance: t.withAuth({ operator: true }).field({
    type: Instance,
    description: "Put a running or paused instance back to a READY snapshot of it (memory and disk); it runs on from there.",
    args: { id: t.arg.id({ required: true }), snapshotId: t.arg.id({ required: true }) },
    resolve: (_r, { id, snapshotId }, ctx, info) => mutate(ctx, info, (w) => restoreInstance(w, ctx.principal, String(id), String(snapshotId), timeoutMs(ctx))),
  }),
}));
