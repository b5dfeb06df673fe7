import { createFlavor, deleteFlavor, type Flavor as FlavorRow, listFlavors, updateFlavor } from "../../core/catalog/flavors.ts";
import { flavorPool } from "../../core/pools/pools.ts";
import { mutate } from "../context.ts";
import { builder, GpuCount, GpuCountInput } from "./builder.ts";

const Flavor = builder.objectRef<FlavorRow>("Flavor").implement({
  description: "A named shape in a pool: what an instance of it claims on a node and charges to quota.",
  fields: (t) => ({
    id: t.exposeID("id"),
    poolId: t.exposeID("poolId"),
    name: t.exposeString("name"),
    vcpus: t.exposeInt("vcpus"),
    memoryMib: t.exposeInt("memoryMib"),
    diskGib: t.exposeInt("diskGib"),
    gpus: t.field({ type: [GpuCount], resolve: (f) => f.gpus }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
    updatedAt: t.expose("updatedAt", { type: "DateTime" }),
  }),
});

const CreateFlavorInput = builder.inputType("CreateFlavorInput", {
  fields: (t) => ({
    poolId: t.id({ required: true }),
    name: t.string({ required: true }),
    vcpus: t.int({ required: true }),
    memoryMib: t.int({ required: true }),
    diskGib: t.int({ required: true }),
    gpus: t.field({ type: [GpuCountInput] }),
  }),
});

const UpdateFlavorInput = builder.inputType("UpdateFlavorInput", {
  description: "Absent fields keep their value. Existing instances keep the shape they were admitted with.",
  fields: (t) => ({ vcpus: t.int(), memoryMib: t.int(), diskGib: t.int(), gpus: t.field({ type: [GpuCountInput] }) }),
});

builder.queryField("flavors", (t) =>
  t.withAuth({ operator: true, tenantScope: "compute:pools:read" }).field({
    type: [Flavor],
    args: { poolId: t.arg.id({ required: true }) },
    resolve: (_r, { poolId }, ctx) => ctx.platform.read((sql) => listFlavors(sql, String(poolId))),
  }),
);

builder.mutationFields((t) => ({
  createFlavor: t.withAuth({ operator: true }).field({
    type: Flavor,
    args: { input: t.arg({ type: CreateFlavorInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => mutate(ctx, info, (w) => createFlavor(w, { ...input, poolId: String(input.poolId) }, flavorPool)),
  }),
  updateFlavor: t.withAuth({ operator: true }).field({
    type: Flavor,
    args: { id: t.arg.id({ required: true }), input: t.arg({ type: UpdateFlavorInput, required: true }) },
    resolve: (_r, { id, input }, ctx, info) => mutate(ctx, info, (w) => updateFlavor(w, String(id), input, flavorPool)),
  }),
  deleteFlavor: t.withAuth({ operator: true }).field({
    type: Flavor,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx, info) => mutate(ctx, info, (w) => deleteFlavor(w, String(id))),
  }),
}));
