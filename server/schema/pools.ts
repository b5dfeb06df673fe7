import { forbidden } from "../../contracts/errors.ts";
import { requireOperator, requireRead } from "../../core/auth/principal.ts";
import { createNode, createPool, createProviderAccount, deleteProviderAccount, ipamOf, setNodeCapacity, setNodeState } from "../../core/pools/pools.ts";
import type { Pool as PoolRow, Prisma, ProviderAccount as ProviderAccountRow } from "../../prisma/generated/client.ts";
import { writeCtx } from "../context.ts";
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
  } as const,
});

type NodeRow = Prisma.NodeGetPayload<{ include: { gpus: true } }>;

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
    state: t.field({ type: NodeState, resolve: (n) => (n.lostAt ? "lost" : (n.state as "ready")) }),
    gone: t.boolean({ description: "Declared gone by an operator: its instances are recreated elsewhere.", resolve: (n) => n.goneAt !== null }),
    specGeneration: t.exposeInt("specGeneration", { description: "Generation of the desired set sent to its agent." }),
    reportedGeneration: t.exposeInt("reportedGeneration", { description: "The generation its agent last reported converged." }),
    capacity: t.field({
      type: Resources,
      resolve: (n) => ({ vcpus: n.capVcpus, memoryMib: Number(n.capMemoryMib), diskGib: Number(n.capDiskGib), gpus: byModel(n.gpus) }),
    }),
    allocated: t.field({
      type: Resources,
      resolve: (n) => ({
        vcpus: n.allocVcpus,
        memoryMib: Number(n.allocMemoryMib),
        diskGib: Number(n.allocDiskGib),
        gpus: byModel(n.gpus.filter((g) => g.allocationId)),
      }),
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
    class: t.field({ type: PoolClass, resolve: (p) => p.class as "vps-host" }),
    agent: t.exposeString("agent"),
    runtime: t.exposeString("runtime", { nullable: true }),
    providerAccountId: t.exposeID("providerAccountId", { nullable: true }),
    singleTenant: t.boolean({ resolve: (p) => (p.policy as { singleTenant?: boolean }).singleTenant === true }),
    ipam: t.field({ type: Ipam, nullable: true, resolve: (p, _a, ctx) => ipamOf(ctx.platform.db.prisma, p.id) }),
    nodes: t.field({
      type: [Node],
      resolve: (p, _a, ctx) => {
        if (!ctx.principal?.operator) throw forbidden("nodes are visible to operators only");
        return ctx.platform.db.prisma.node.findMany({ where: { poolId: p.id }, include: { gpus: true }, orderBy: { name: "asc" } });
      },
    }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

builder.queryFields((t) => ({
  pools: t.field({
    type: [Pool],
    resolve: (_r, _a, ctx) => {
      requireRead(ctx.principal, "compute:pools:read");
      return ctx.platform.db.prisma.pool.findMany({ orderBy: { name: "asc" } });
    },
  }),
  pool: t.field({
    type: Pool,
    nullable: true,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => {
      requireRead(ctx.principal, "compute:pools:read");
      return ctx.platform.db.prisma.pool.findUnique({ where: { id: String(id) } });
    },
  }),
  nodes: t.field({
    type: [Node],
    args: { poolId: t.arg.id({ required: true }) },
    resolve: (_r, { poolId }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.db.prisma.node.findMany({ where: { poolId: String(poolId) }, include: { gpus: true }, orderBy: { name: "asc" } });
    },
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

const withGpus = { include: { gpus: true } } as const;

builder.mutationFields((t) => ({
  createPool: t.field({
    type: Pool,
    args: { input: t.arg({ type: CreatePoolInput, required: true }) },
    resolve: (_r, { input }, ctx) => {
      requireOperator(ctx.principal);
      const runtime = ctx.platform.config.vps.runtimes[0] as string;
      return ctx.platform.transact((tx) =>
        createPool(tx, { ...writeCtx(ctx), runtime }, { ...input, providerAccountId: input.providerAccountId ? String(input.providerAccountId) : null }),
      );
    },
  }),
  createNode: t.field({
    type: Node,
    args: { input: t.arg({ type: CreateNodeInput, required: true }) },
    resolve: (_r, { input }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact(async (tx) => {
        const node = await createNode(tx, writeCtx(ctx), { ...input, poolId: String(input.poolId) });
        return tx.node.findUniqueOrThrow({ where: { id: node.id }, ...withGpus });
      });
    },
  }),
  setNodeCapacity: t.field({
    type: Node,
    args: { id: t.arg.id({ required: true }), capacity: t.arg({ type: CapacityInput, required: true }) },
    resolve: (_r, { id, capacity }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact(async (tx) => {
        await setNodeCapacity(tx, writeCtx(ctx), String(id), capacity);
        return tx.node.findUniqueOrThrow({ where: { id: String(id) }, ...withGpus });
      });
    },
  }),
  setNodeState: t.field({
    type: Node,
    args: { id: t.arg.id({ required: true }), state: t.arg({ type: NodeState, required: true }) },
    resolve: (_r, { id, state }, ctx) => {
      requireOperator(ctx.principal);
      if (state === "lost") throw forbidden("nodes become lost when they stop reporting, not by request");
      return ctx.platform.transact(async (tx) => {
        await setNodeState(tx, writeCtx(ctx), String(id), state);
        return tx.node.findUniqueOrThrow({ where: { id: String(id) }, ...withGpus });
      });
    },
  }),
}));

const ProviderAccount = builder.objectRef<ProviderAccountRow>("ProviderAccount").implement({
  description: "Credentials (by secret reference) for creating VMs on an external cloud.",
  fields: (t) => ({
    id: t.exposeID("id"),
    name: t.exposeString("name"),
    provider: t.exposeString("provider"),
    config: t.expose("config", { type: "JSON", description: "Secrets appear only as references." }),
    createdAt: t.expose("createdAt", { type: "DateTime" }),
  }),
});

const CreateProviderAccountInput = builder.inputType("CreateProviderAccountInput", {
  fields: (t) => ({ name: t.string({ required: true }), provider: t.string({ required: true }), config: t.field({ type: "JSON", required: true }) }),
});

builder.queryField("providerAccounts", (t) =>
  t.field({
    type: [ProviderAccount],
    resolve: (_r, _a, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.db.prisma.providerAccount.findMany({ orderBy: { name: "asc" } });
    },
  }),
);

builder.mutationFields((t) => ({
  createProviderAccount: t.field({
    type: ProviderAccount,
    args: { input: t.arg({ type: CreateProviderAccountInput, required: true }) },
    resolve: (_r, { input }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact((tx) => createProviderAccount(tx, { ...writeCtx(ctx), providers: ctx.platform.config.vps.providers }, input));
    },
  }),
  deleteProviderAccount: t.field({
    type: ProviderAccount,
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => {
      requireOperator(ctx.principal);
      return ctx.platform.transact((tx) => deleteProviderAccount(tx, writeCtx(ctx), String(id)));
    },
  }),
}));
