import { forbidden } from "../../contracts/errors.ts";
import type { Pool as PoolRow } from "../../core/pools/driver.ts";
import { ipamOf } from "../../core/pools/hosted/leases.ts";
import { createNode, listNodes, type Node as NodeRow, setNodeCapacity, setNodeState } from "../../core/pools/hosted/nodes.ts";
import { createPool, getPool, listPools } from "../../core/pools/pools.ts";
import { mutate } from "../context.ts";
import { builder, Resources } from "./builder.ts";

export const PoolClass = builder.enumType("PoolClass", {
  values: {
    VPS_HOST: { value: "vps-host", description: "VMs on the operator's own hosts, placed by the platform." },
    PROVIDER: { value: "provider", description: "VMs on an external cloud through a provider account." },
  } as const,
});

const NodeState = builder.enumType("NodeState", {
  values: {
    READY: { value: "ready" },
    CORDONED: { value: "cordoned", description: "Keeps its instances, takes no new ones." },
    LOST: { value: "lost" },
    REFUSING: { value: "refusing", description: "Its agent lacks the pool's runtime and converges nothing of it; takes no new instances." },
  } as const,
});

const byModel = (gpus: { model: string }[]) => {
  const counts = new Map<string, number>();
  for (const g of gpus) counts.set(g.model, (counts.get(g.model) ?? 0) + 1);
  return [...counts].sort(([a], [b]) => a.localeCompare(b)).map(([model, count]) => ({ model, count }));
};

export const Node = builder.objectRef<NodeRow>("Node").implement({
  description: "A host of a hosted pool (operators only).",
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    poolId: t.exposeID("poolId"),
    state: t.field({ type: NodeState, resolve: (n) => (n.lostAt ? "lost" : n.state) }),
    gone: t.boolean({ description: "Declared gone by an operator: its instances are recreated elsewhere.", resolve: (n) => n.goneAt !== null }),
    specGeneration: t.exposeInt("specGeneration", { description: "Generation of the desired set sent to its agent." }),
    reportedGeneration: t.exposeInt("reportedGeneration", { description: "The generation its agent last reported converged." }),
    capacity: t.field({
      type: Resources,
      resolve: (n) => ({ vcpus: n.capVcpus, memoryMib: n.capMemoryMib, diskGib: n.capDiskGib, gpus: byModel(n.gpus) }),
    }),
    allocated: t.field({
      type: Resources,
      resolve: (n) => ({ vcpus: n.allocVcpus, memoryMib: n.allocMemoryMib, diskGib: n.allocDiskGib, gpus: byModel(n.gpus.filter((g) => g.allocated)) }),
    }),
    instances: t.exposeInt("allocInstances", { description: "Instances placed on it." }),
    lastReportAt: t.expose("lastReportAt", { type: "DateTime", nullable: true }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

const Ipam = builder.objectRef<{ range: string; total: number; used: number }>("Ipam").implement({
  fields: (t) => ({
    range: t.exposeString("range"),
    total: t.exposeInt("total", { description: "Leasable addresses: the range less network, broadcast and gateway." }),
    used: t.exposeInt("used"),
  }),
});

export const Pool = builder.objectRef<PoolRow>("Pool").implement({
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    class: t.field({ type: PoolClass, resolve: (p) => p.class as "vps-host" | "provider" }),
    agent: t.exposeString("agent"),
    runtime: t.exposeString("runtime", { nullable: true }),
    providerAccountId: t.exposeID("providerAccountId", { nullable: true }),
    singleTenant: t.exposeBoolean("singleTenant"),
    ipam: t.field({ type: Ipam, nullable: true, resolve: (p, _a, ctx) => ctx.platform.read((sql) => ipamOf(sql, p.id)) }),
    nodes: t.withAuth({ operator: true }).field({
      type: [Node],
      resolve: (p, _a, ctx) => ctx.platform.read((sql) => listNodes(sql, p.id)),
    }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

builder.queryFields((t) => ({
  pools: t.withAuth({ operator: true, tenantScope: "compute:pools:read" }).field({
    type: [Pool],
    resolve: (_r, _a, ctx) => ctx.platform.read(listPools),
  }),
  pool: t.withAuth({ operator: true, tenantScope: "compute:pools:read" }).field({
    type: Pool,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => (await ctx.platform.read((sql) => getPool(sql, String(id)))) ?? null,
  }),
  nodes: t.withAuth({ operator: true }).field({
    type: [Node],
    args: { poolId: t.arg.id({ required: true }) },
    resolve: (_r, { poolId }, ctx) => ctx.platform.read((sql) => listNodes(sql, String(poolId))),
  }),
}));

const CreatePoolInput = builder.inputType("CreatePoolInput", {
  fields: (t) => ({
    name: t.string({ required: true }),
    class: t.field({ type: PoolClass, required: true }),
    ipv4Range: t.string({ description: "vps-host pools: the CIDR instances lease addresses from, /16 to /30." }),
    ipv4Gateway: t.string({ description: "Defaults to the first host address of the range." }),
    providerAccountId: t.id({ description: "provider pools: the account instances are created with." }),
    singleTenant: t.boolean({ description: "Never place two tenants' instances on one node." }),
  }),
});

const GpuCapacityInput = builder.inputType("GpuCapacityInput", {
  fields: (t) => ({ model: t.string({ required: true }), count: t.int({ required: true }), pciAddresses: t.stringList() }),
});

const CapacityInput = builder.inputType("CapacityInput", {
  fields: (t) => ({
    vcpus: t.int({ required: true }),
    memoryMib: t.int({ required: true }),
    diskGib: t.int({ required: true }),
    gpus: t.field({ type: [GpuCapacityInput] }),
  }),
});

const CreateNodeInput = builder.inputType("CreateNodeInput", {
  fields: (t) => ({ poolId: t.id({ required: true }), name: t.string({ required: true }), capacity: t.field({ type: CapacityInput, required: true }) }),
});

builder.mutationFields((t) => ({
  createPool: t.withAuth({ operator: true }).field({
    type: Pool,
    args: { input: t.arg({ type: CreatePoolInput, required: true }) },
    resolve: (_r, { input }, ctx, info) =>
      mutate(ctx, info, (w) =>
        createPool(w, { ...input, providerAccountId: input.providerAccountId ? String(input.providerAccountId) : null }, ctx.platform.drivers),
      ),
  }),
  createNode: t.withAuth({ operator: true }).field({
    type: Node,
    args: { input: t.arg({ type: CreateNodeInput, required: true }) },
    resolve: (_r, { input }, ctx, info) => mutate(ctx, info, (w) => createNode(w, { ...input, poolId: String(input.poolId) })),
  }),
  setNodeCapacity: t.withAuth({ operator: true }).field({
    type: Node,
    args: { id: t.arg.id({ required: true }), capacity: t.arg({ type: CapacityInput, required: true }) },
    resolve: (_r, { id, capacity }, ctx, info) => mutate(ctx, info, (w) => setNodeCapacity(w, String(id), capacity)),
  }),
  setNodeState: t.withAuth({ operator: true }).field({
    type: Node,
    args: { id: t.arg.id({ required: true }), state: t.arg({ type: NodeState, required: true }) },
    resolve: (_r, { id, state }, ctx, info) => {
      if (state === "lost") throw forbidden("nodes become lost when they stop reporting, not by request");
      if (state === "refusing") throw forbidden("nodes refuse by their agents' reports, not by request");
      return mutate(ctx, info, (w) => setNodeState(w, String(id), state));
    },
  }),
}));
