import { z } from "zod";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { Tx } from "../../infra/db/prisma.ts";
import { audit } from "../kernel/audit.ts";
import type { IdSource } from "../kernel/ids.ts";
import { parseInput, shape } from "./shapes.ts";

const flavorName = z
  .string()
  .trim()
  .regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, "1 to 63 lower-case letters, digits, . _ -");

interface Ctx {
  ids: IdSource;
  actor: string;
  now: Date;
  requestId?: string | null;
}

/**
 * Flavors are named shapes per pool. Instances copy the shape at admission, so editing or deleting a flavor
 * never changes what a running instance holds; it changes what the next create or resize gets.
 */
export async function createFlavor(
  tx: Tx,
  ctx: Ctx,
  raw: { poolId: string; name: string; vcpus: number; memoryMib: number; diskGib: number; gpus?: { model: string; count: number }[] | null },
) {
  const { poolId, name, ...rest } = raw;
  const validName = parseInput(flavorName, name, "input.name");
  const s = parseInput(shape, { ...rest, gpus: rest.gpus ?? [] });
  const pool = await tx.pool.findUnique({ where: { id: poolId } });
  if (!pool) throw notFound("pool", poolId);
  if (pool.class === "provider" && s.gpus.length) throw invalid("provider flavors name no GPUs; the provider's server type decides them");
  if (await tx.flavor.findUnique({ where: { poolId_name: { poolId, name: validName } }, select: { id: true } })) {
    throw new AppError("CONFLICT", `flavor ${validName} exists in pool ${pool.name}`);
  }
  const flavor = await tx.flavor.create({
    data: {
      id: ctx.ids("flv"),
      poolId,
      name: validName,
      vcpus: s.vcpus,
      memoryMib: s.memoryMib,
      diskGib: s.diskGib,
      gpus: s.gpus,
      createdAt: ctx.now,
      updatedAt: ctx.now,
    },
  });
  await audit(tx, {
    actorId: ctx.actor,
    action: "createFlavor",
    targetId: flavor.id,
    requestId: ctx.requestId,
    details: { poolId, name: validName },
    at: ctx.now,
  });
  return flavor;
}

export async function updateFlavor(
  tx: Tx,
  ctx: Ctx,
  id: string,
  raw: { vcpus?: number | null; memoryMib?: number | null; diskGib?: number | null; gpus?: { model: string; count: number }[] | null },
) {
  const flavor = await tx.flavor.findUnique({ where: { id } });
  if (!flavor) throw notFound("flavor", id);
  const s = parseInput(shape, {
    vcpus: raw.vcpus ?? flavor.vcpus,
    memoryMib: raw.memoryMib ?? flavor.memoryMib,
    diskGib: raw.diskGib ?? flavor.diskGib,
    gpus: raw.gpus ?? flavor.gpus,
  });
  const updated = await tx.flavor.update({
    where: { id },
    data: { vcpus: s.vcpus, memoryMib: s.memoryMib, diskGib: s.diskGib, gpus: s.gpus, updatedAt: ctx.now },
  });
  await audit(tx, { actorId: ctx.actor, action: "updateFlavor", targetId: id, requestId: ctx.requestId, at: ctx.now });
  return updated;
}

export async function deleteFlavor(tx: Tx, ctx: Ctx, id: string) {
  const flavor = await tx.flavor.findUnique({ where: { id } });
  if (!flavor) throw notFound("flavor", id);
  await tx.flavor.delete({ where: { id } });
  await audit(tx, { actorId: ctx.actor, action: "deleteFlavor", targetId: id, requestId: ctx.requestId, at: ctx.now });
  return flavor;
}
