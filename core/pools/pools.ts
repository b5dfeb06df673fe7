import { z } from "zod";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { Tx } from "../../infra/db/prisma.ts";
import { gpuClaim, parseInput } from "../catalog/shapes.ts";
import { audit } from "../kernel/audit.ts";
import { prismaSql } from "../kernel/db.ts";
import type { IdSource } from "../kernel/ids.ts";
import { leasableCount, parseRange } from "./hosted/ipam.ts";
import { createAddresses } from "./hosted/leases.ts";
import type { ProviderDefinition } from "./provider/contract.ts";

const name = z
  .string()
  .trim()
  .regex(/^[a-z0-9][a-z0-9-]{0,62}$/, "1 to 63 lower-case letters, digits and hyphens");

interface Ctx {
  ids: IdSource;
  actor: string;
  now: Date;
  requestId?: string | null;
}

export const poolClasses = ["vps-host", "provider"] as const;

const poolInput = z.object({
  name,
  class: z.string(),
  ipv4Range: z.string().nullish(),
  ipv4Gateway: z.string().nullish(),
  providerAccountId: z.string().nullish(),
  singleTenant: z.boolean().nullish(),
});

/** A hosted pool needs an IPv4 range and no provider account; a provider pool the reverse. */
export async function createPool(tx: Tx, ctx: Ctx & { runtime: string }, raw: z.input<typeof poolInput>) {
  const input = parseInput(poolInput, raw);
  if (!(poolClasses as readonly string[]).includes(input.class))
    throw invalid(`pool class ${input.class} is not one of ${poolClasses.join(", ")}`, { path: "input.class" });
  const hosted = input.class === "vps-host";
  if (hosted && !input.ipv4Range) throw invalid("a vps-host pool needs an ipv4Range", { path: "input.ipv4Range" });
  if (hosted && input.providerAccountId) throw invalid("a vps-host pool takes no providerAccountId", { path: "input.providerAccountId" });
  if (!hosted && !input.providerAccountId) throw invalid("a provider pool needs a providerAccountId", { path: "input.providerAccountId" });
  if (!hosted && (input.ipv4Range || input.ipv4Gateway))
    throw invalid("a provider pool takes no ipv4Range: the provider assigns addresses", { path: "input.ipv4Range" });
  const range = hosted ? parseRange(input.ipv4Range as string, input.ipv4Gateway ?? undefined) : null;
  if (input.providerAccountId && !(await tx.providerAccount.findUnique({ where: { id: input.providerAccountId }, select: { id: true } }))) {
    throw notFound("provider account", input.providerAccountId);
  }
  if (await tx.pool.findUnique({ where: { name: input.name }, select: { id: true } })) throw new AppError("CONFLICT", `pool ${input.name} exists`);
  const pool = await tx.pool.create({
    data: {
      id: ctx.ids("pool"),
      name: input.name,
      class: input.class,
      agent: hosted ? "bcd" : "none",
      runtime: hosted ? ctx.runtime : null,
      providerAccountId: input.providerAccountId ?? null,
      policy: { singleTenant: input.singleTenant ?? false },
      createdAt: ctx.now,
    },
  });
  if (range) {
    const ipPool = await tx.ipPool.create({
      data: { id: ctx.ids("ipp"), poolId: pool.id, cidr: range.cidr, network: BigInt(range.network), prefix: range.prefix, gatewayOffset: range.gatewayOffset },
    });
    await createAddresses(prismaSql(tx), ipPool.id, range);
  }
  await audit(tx, {
    actorId: ctx.actor,
    action: "createPool",
    targetId: pool.id,
    requestId: ctx.requestId,
    details: { class: pool.class, ipv4Range: range?.cidr ?? null },
    at: ctx.now,
  });
  return pool;
}

export async function ipamOf(tx: Tx, poolId: string) {
  const ip = await tx.ipPool.findUnique({ where: { poolId }, include: { _count: { select: { addresses: { where: { instanceId: { not: null } } } } } } });
  if (!ip) return null;
  return { range: ip.cidr, total: leasableCount({ size: 2 ** (32 - ip.prefix) }), used: ip._count.addresses };
}

export const capacityInput = z.object({
  vcpus: z.number().int().min(0).max(4096),
  memoryMib: z
    .number()
    .int()
    .min(0)
    .max(64 * 1024 * 1024),
  diskGib: z
    .number()
    .int()
    .min(0)
    .max(1024 * 1024),
  gpus: z
    .array(
      gpuClaim.extend({
        count: z.number().int().min(0).max(64),
        pciAddresses: z.array(z.string().regex(/^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/)).nullish(),
      }),
    )
    .nullish(),
});
export type CapacityInput = z.input<typeof capacityInput>;

export async function createNode(tx: Tx, ctx: Ctx, raw: { poolId: string; name: string; capacity: CapacityInput }) {
  const input = parseInput(z.object({ poolId: z.string(), name, capacity: capacityInput }), raw);
  const pool = await tx.pool.findUnique({ where: { id: input.poolId } });
  if (!pool) throw notFound("pool", input.poolId);
  if (pool.class !== "vps-host") throw invalid(`pool ${pool.id} is a ${pool.class} pool: only vps-host pools have nodes`);
  if (await tx.node.findUnique({ where: { poolId_name: { poolId: pool.id, name: input.name } }, select: { id: true } })) {
    throw new AppError("CONFLICT", `node ${input.name} exists in pool ${pool.name}`);
  }
  const node = await tx.node.create({ data: { id: ctx.ids("node"), poolId: pool.id, name: input.name, createdAt: ctx.now } });
  await applyCapacity(tx, ctx.ids, node.id, input.capacity);
  await audit(tx, { actorId: ctx.actor, action: "createNode", targetId: node.id, requestId: ctx.requestId, details: { poolId: pool.id }, at: ctx.now });
  return tx.node.findUniqueOrThrow({ where: { id: node.id } });
}

export async function setNodeCapacity(tx: Tx, ctx: Ctx, nodeId: string, raw: CapacityInput) {
  const capacity = parseInput(capacityInput, raw, "capacity");
  if (!(await tx.node.findUnique({ where: { id: nodeId }, select: { id: true } }))) throw notFound("node", nodeId);
  await applyCapacity(tx, ctx.ids, nodeId, capacity);
  await audit(tx, { actorId: ctx.actor, action: "setNodeCapacity", targetId: nodeId, requestId: ctx.requestId, at: ctx.now });
  return tx.node.findUniqueOrThrow({ where: { id: nodeId } });
}

/**
 * Set what a node offers. Shrinking below what is allocated is refused: instances already placed keep what
 * they were promised. GPUs are rows; only free ones are removed.
 */
export async function applyCapacity(tx: Tx, ids: IdSource, nodeId: string, cap: z.output<typeof capacityInput>) {
  const [locked] = await tx.$queryRaw<{ alloc_vcpus: number; alloc_memory_mib: bigint; alloc_disk_gib: bigint }[]>`
    SELECT alloc_vcpus, alloc_memory_mib, alloc_disk_gib FROM nodes WHERE id = ${nodeId} FOR UPDATE`;
  if (!locked) throw notFound("node", nodeId);
  if (cap.vcpus < locked.alloc_vcpus || BigInt(cap.memoryMib) < locked.alloc_memory_mib || BigInt(cap.diskGib) < locked.alloc_disk_gib) {
    throw new AppError("PRECONDITION_FAILED", `capacity below what node ${nodeId} has allocated`, {
      allocated: { vcpus: locked.alloc_vcpus, memoryMib: Number(locked.alloc_memory_mib), diskGib: Number(locked.alloc_disk_gib) },
    });
  }
  await tx.node.update({ where: { id: nodeId }, data: { capVcpus: cap.vcpus, capMemoryMib: BigInt(cap.memoryMib), capDiskGib: BigInt(cap.diskGib) } });
  const existing = await tx.nodeGpu.findMany({ where: { nodeId }, orderBy: { index: "asc" } });
  const wanted = new Map((cap.gpus ?? []).map((g) => [g.model, g]));
  for (const model of new Set(existing.map((g) => g.model))) {
    const have = existing.filter((g) => g.model === model);
    const surplus = have.length - (wanted.get(model)?.count ?? 0);
    if (surplus <= 0) continue;
    const free = have.filter((g) => !g.allocationId).slice(-surplus);
    if (free.length < surplus) throw new AppError("PRECONDITION_FAILED", `node ${nodeId} has ${model} GPUs in use that this capacity would remove`);
    await tx.nodeGpu.deleteMany({ where: { id: { in: free.map((g) => g.id) } } });
  }
  let nextIndex = existing.reduce((m, g) => Math.max(m, g.index + 1), 0);
  for (const [model, g] of wanted) {
    const have = existing.filter((e) => e.model === model).length;
    for (let i = have; i < g.count; i++) {
      await tx.nodeGpu.create({ data: { id: ids("gpu"), nodeId, model, index: nextIndex++, pciAddress: g.pciAddresses?.[i] ?? null } });
    }
  }
}

export async function setNodeState(tx: Tx, ctx: Ctx, nodeId: string, state: "ready" | "cordoned") {
  if (!(await tx.node.findUnique({ where: { id: nodeId }, select: { id: true } }))) throw notFound("node", nodeId);
  const node = await tx.node.update({ where: { id: nodeId }, data: { state } });
  await audit(tx, { actorId: ctx.actor, action: "setNodeState", targetId: nodeId, requestId: ctx.requestId, details: { state }, at: ctx.now });
  return node;
}

/** Provider accounts name a provider the deployment lists, with a config that provider accepts. */
export async function createProviderAccount(
  tx: Tx,
  ctx: Ctx & { providers: readonly ProviderDefinition[] },
  raw: { name: string; provider: string; config?: unknown },
) {
  const input = parseInput(z.object({ name, provider: z.string(), config: z.unknown() }), raw);
  const def = ctx.providers.find((p) => p.id === input.provider);
  if (!def)
    throw invalid(`provider ${input.provider} is not configured; configured: ${ctx.providers.map((p) => p.id).join(", ") || "none"}`, {
      path: "input.provider",
    });
  const config = parseInput(def.accountConfig, input.config, "input.config");
  if (await tx.providerAccount.findUnique({ where: { name: input.name }, select: { id: true } }))
    throw new AppError("CONFLICT", `provider account ${input.name} exists`);
  const account = await tx.providerAccount.create({
    data: { id: ctx.ids("pacc"), name: input.name, provider: def.id, config: config as object, createdAt: ctx.now },
  });
  await audit(tx, { actorId: ctx.actor, action: "createProviderAccount", targetId: account.id, requestId: ctx.requestId, at: ctx.now });
  return account;
}

export async function deleteProviderAccount(tx: Tx, ctx: Ctx, id: string) {
  const account = await tx.providerAccount.findUnique({ where: { id }, include: { _count: { select: { pools: true } } } });
  if (!account) throw notFound("provider account", id);
  if (account._count.pools > 0) throw new AppError("PRECONDITION_FAILED", `provider account ${account.name} is used by ${account._count.pools} pool(s)`);
  await tx.providerAccount.delete({ where: { id } });
  await audit(tx, { actorId: ctx.actor, action: "deleteProviderAccount", targetId: id, requestId: ctx.requestId, at: ctx.now });
  return account;
}
