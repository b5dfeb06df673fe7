import { audit } from "./audit.ts";
import type { Prisma, Tx } from "./db.ts";
import { AppError, invalid, notFound } from "./errors.ts";
import { type InstanceEventMessage, recordEvent } from "./events.ts";
import type { IdSource } from "./ids.ts";
import { releaseLease } from "./leases.ts";
import { place, releaseAllocation } from "./placement.ts";
import { type Principal, visibleTo } from "./principal.ts";
import { type Charge, chargeQuota, releaseQuota } from "./quota.ts";
import { chargeOf, gpuCount, parseInput, type Shape, shape as shapeSchema } from "./shapes.ts";
import { assertTransition, type DesiredState, type InstanceState } from "./state.ts";

export type InstanceRow = Prisma.InstanceGetPayload<object>;

export interface Change {
  instance: InstanceRow;
  /** null when the request changed nothing (already asked for): no version, no event. */
  event: InstanceEventMessage | null;
}

interface Ctx {
  actor: string;
  requestId?: string | null;
  now: Date;
}

/** Lock an instance row for the rest of the transaction, as the caller may see it. */
export async function lockInstance(tx: Tx, who: Principal | null, id: string): Promise<InstanceRow> {
  const [row] = await tx.$queryRaw<{ id: string }[]>`SELECT id FROM instances WHERE id = ${id} FOR UPDATE`;
  const inst = row ? await tx.instance.findUnique({ where: { id } }) : null;
  if (!inst || (who && !visibleTo(who, inst.tenantId))) throw notFound("instance", id);
  return inst;
}

/** Bump the version and write exactly one event for it. `state` moves only along the table. */
async function commitChange(tx: Tx, inst: InstanceRow, data: Prisma.InstanceUpdateInput, reason: string, ctx: Ctx): Promise<Change> {
  const to = (data.state as InstanceState | undefined) ?? (inst.state as InstanceState);
  if (to !== inst.state) assertTransition(inst.state as InstanceState, to);
  const updated = await tx.instance.update({ where: { id: inst.id }, data: { ...data, version: inst.version + 1, updatedAt: ctx.now } });
  const event = await recordEvent(tx, updated, { from: inst.state, reason, actor: ctx.actor, at: ctx.now });
  return { instance: updated, event };
}

/**
 * start / stop / delete: record what the owner wants and let the reconciler get there. Asking again for
 * what is already asked changes nothing.
 */
export async function setDesiredState(tx: Tx, who: Principal, id: string, desired: DesiredState, ctx: Ctx): Promise<Change> {
  const inst = await lockInstance(tx, who, id);
  if (inst.desiredState === desired) return { instance: inst, event: null };
  if (inst.desiredState === "deleted") throw new AppError("PRECONDITION_FAILED", `instance ${id} is being deleted`, { state: inst.state });
  const change = await commitChange(tx, inst, { desiredState: desired }, `requested:${desired}`, ctx);
  await audit(tx, { actorId: ctx.actor, tenantId: inst.tenantId, action: `${verb[desired]}Instance`, targetId: id, requestId: ctx.requestId, at: ctx.now });
  return change;
}
const verb: Record<DesiredState, string> = { running: "start", stopped: "stop", paused: "pause", deleted: "delete" };

/**
 * Resize in place: hosted only, stopped only, same number of GPUs. The old claim is given back and the new
 * one taken on the same node and against quota in this transaction, so a refusal leaves the old shape held.
 */
export async function resizeInstance(tx: Tx, ids: IdSource, who: Principal, id: string, flavorName: string, ctx: Ctx): Promise<Change> {
  const inst = await lockInstance(tx, who, id);
  const pool = await tx.pool.findUniqueOrThrow({ where: { id: inst.poolId } });
  if (pool.class !== "vps-host") throw new AppError("UNSUPPORTED", "resize is supported on hosted pools only; provider instances keep their shape");
  if (inst.state !== "stopped" || inst.desiredState !== "stopped") {
    throw new AppError("PRECONDITION_FAILED", `resize needs a stopped instance; ${id} is ${inst.state} (desired ${inst.desiredState})`, { state: inst.state });
  }
  const flavor = await tx.flavor.findUnique({ where: { poolId_name: { poolId: pool.id, name: flavorName } } });
  if (!flavor) throw notFound("flavor", `${flavorName} in pool ${pool.id}`);
  if (flavor.name === inst.flavor) return { instance: inst, event: null };
  const next: Shape = parseInput(shapeSchema, { ...flavor, gpus: flavor.gpus }, "flavor");
  const current = inst.gpus as Shape["gpus"];
  if (gpuCount(next) !== gpuCount({ gpus: current })) {
    throw invalid(`resize keeps the GPU count: ${inst.flavor} has ${gpuCount({ gpus: current })}, ${flavor.name} has ${gpuCount(next)}`);
  }
  if (!inst.nodeId || !inst.allocationId) throw new AppError("PRECONDITION_FAILED", `instance ${id} holds no placement`);

  await releaseAllocation(tx, inst.allocationId);
  const singleTenant = (pool.policy as { singleTenant?: boolean }).singleTenant === true;
  const placed = await place(tx, ids, { poolId: pool.id, tenantId: inst.tenantId, instanceId: id, shape: next, singleTenant, onlyNodeId: inst.nodeId });
  const charge = chargeOf(next);
  await releaseQuota(tx, inst.tenantId, inst.charge as Charge);
  await chargeQuota(tx, inst.tenantId, charge);

  const change = await commitChange(
    tx,
    inst,
    {
      state: "resizing",
      flavor: flavor.name,
      vcpus: next.vcpus,
      memoryMib: next.memoryMib,
      diskGib: next.diskGib,
      gpus: next.gpus,
      charge,
      allocationId: placed.allocationId,
    },
    "requested:resize",
    ctx,
  );
  await audit(tx, {
    actorId: ctx.actor,
    tenantId: inst.tenantId,
    action: "resizeInstance",
    targetId: id,
    requestId: ctx.requestId,
    details: { from: inst.flavor, to: flavor.name },
    at: ctx.now,
  });
  return change;
}

/**
 * Move `state` one step (the reconciler's primitive). The row must already be locked by the caller's
 * transaction (lockInstance). Reaching `deleted` releases what the instance held.
 */
export async function transition(tx: Tx, inst: InstanceRow, to: InstanceState, reason: string, ctx: Ctx): Promise<Change> {
  const extra: Prisma.InstanceUpdateInput = {};
  if (to === "deleted") Object.assign(extra, await releaseResources(tx, inst));
  return commitChange(tx, inst, { state: to, ...extra }, reason, ctx);
}

/**
 * Give back the allocation, the address and the quota charge. Safe to call twice: the allocation and lease
 * rows are gone after the first call and `chargeReleased` guards the quota.
 */
export async function releaseResources(tx: Tx, inst: InstanceRow): Promise<Prisma.InstanceUpdateInput> {
  if (inst.allocationId) await releaseAllocation(tx, inst.allocationId);
  await releaseLease(tx, inst.id);
  if (!inst.chargeReleased) await releaseQuota(tx, inst.tenantId, inst.charge as Charge);
  return { allocationId: null, chargeReleased: true, addresses: [] };
}
