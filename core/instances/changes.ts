import type { InstanceEventMessage } from "../../contracts/channels.ts";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { Instance } from "../../prisma/generated/client.ts";
import { type Principal, visibleTo } from "../auth/principal.ts";
import { chargeOf, gpuCount, parseInput, type Shape, shape as shapeSchema } from "../catalog/shapes.ts";
import { INSTANCE_COLUMNS, type Sql } from "../kernel/db.ts";
import type { IdSource } from "../kernel/ids.ts";
import { bumpSpecs, HELD_STATES } from "../pools/hosted/hosts.ts";
import { releaseLease } from "../pools/hosted/leases.ts";
import { place, releaseAllocation } from "../pools/hosted/placement.ts";
import { type Charge, chargeQuota, releaseQuota } from "../tenancy/quota.ts";
import { specPower } from "./decide.ts";
import { assertTransition, type DesiredState, type InstanceState } from "./state.ts";

export type InstanceRow = Instance;

export interface Change {
  instance: InstanceRow;
  /** null when the request changed nothing (already asked for): no version, no event. */
  event: InstanceEventMessage | null;
  /** Nodes whose spec this change altered, with their new generation: their agents get a new spec. */
  specs?: { nodeId: string; generation: number }[];
}

export interface Ctx {
  actor: string;
  requestId?: string | null;
  now: Date;
}

/** Lock an instance row for the rest of the transaction, as the caller may see it. */
export async function lockInstance(sql: Sql, who: Principal | null, id: string): Promise<InstanceRow> {
  const [inst] = await sql.query<InstanceRow>(`SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1 FOR UPDATE`, [id]);
  if (!inst || (who && !visibleTo(who, inst.tenantId))) throw notFound("instance", id);
  return inst;
}

/** Columns a change may set, and how each is bound (jsonb values are sent as JSON text). */
const settable = {
  state: "text",
  desired_state: "text",
  flavor: "text",
  vcpus: "int",
  memory_mib: "int",
  disk_gib: "int",
  gpus: "jsonb",
  charge: "jsonb",
  charge_released: "boolean",
  allocation_id: "text",
  node_id: "text",
  addresses: "text[]",
  conditions: "jsonb",
  attempts: "int",
  excluded_nodes: "text[]",
  retry_requested: "boolean",
  spec_generation: "int",
  observed_state: "text",
  observed_error: "text",
  observed_generation: "int",
} as const;
export type InstanceSet = Partial<Record<keyof typeof settable, unknown>>;

/**
 * Apply one change to a locked instance: bump `version`, write its one event and, for requests, the audit row,
 * all in one statement. `state` moves only along the table.
 */
export async function writeChange(
  sql: Sql,
  inst: InstanceRow,
  set: InstanceSet,
  reason: string,
  ctx: Ctx,
  action?: string,
  details?: unknown,
): Promise<Change> {
  const to = (set.state as InstanceState | undefined) ?? (inst.state as InstanceState);
  if (to !== inst.state) assertTransition(inst.state as InstanceState, to);
  // The nodes it leaves and joins get a new spec generation in this same transaction; a host report is
  // stale for this instance until it echoes at least the generation of its node after this change.
  const nextNode = "node_id" in set ? (set.node_id as string | null) : inst.nodeId;
  const nextDesired = (set.desired_state as DesiredState | undefined) ?? (inst.desiredState as DesiredState);
  // A step that leaves what the host is told unchanged (provisioning → starting → running on the host's own
  // report) keeps the generation, so the report that caused it still counts and the next step follows
  // without another round trip through the agent. Anything else the host must see, and confirm, anew.
  const neutral =
    nextNode === inst.nodeId &&
    !SPEC_FIELDS.some((f) => f in set) &&
    sameSpecView(inst.state as InstanceState, inst.desiredState as DesiredState, to, nextDesired);
  const specs = neutral ? [] : await bumpSpecs(sql, [inst.nodeId, nextNode]);
  const own = specs.find((g) => g.nodeId === nextNode);
  if (own) set = { ...set, spec_generation: own.generation };
  // What the old host saw says nothing about the new one (and generations are per node).
  if (nextNode !== inst.nodeId) set = { ...set, observed_state: null, observed_error: null, observed_generation: -1 };
  const params: unknown[] = [inst.id, ctx.now, inst.state, reason, ctx.actor];
  const assignments = Object.entries(set).map(([col, value]) => {
    const type = settable[col as keyof typeof settable];
    params.push(type === "jsonb" ? JSON.stringify(value) : value);
    return `${col} = $${params.length}::${type}`;
  });
  params.push(action ?? null, ctx.requestId ?? null, JSON.stringify(details ?? {}));
  const n = params.length;
  const [row] = await sql.query<InstanceRow & { eventId: string }>(
    `WITH i AS (
       UPDATE instances SET ${[...assignments, "version = version + 1", "updated_at = $2"].join(", ")} WHERE id = $1 RETURNING *),
     e AS (
       INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at)
       SELECT id, tenant_id, pool_id, project_id, $3, state, desired_state, $4, $5, version, $2 FROM i RETURNING id),
     a AS (
       INSERT INTO audit_log (actor_id, tenant_id, action, target_id, request_id, details, at)
       SELECT $5, tenant_id, $${n - 2}, id, $${n - 1}, $${n}::jsonb, $2 FROM i WHERE $${n - 2}::text IS NOT NULL)
     SELECT ${INSTANCE_COLUMNS}, (SELECT id::text FROM e) AS "eventId" FROM i`,
    params,
  );
  if (!row) throw notFound("instance", inst.id);
  const { eventId, ...instance } = row;
  return { instance, event: eventMessage(instance, inst.state, eventId), specs };
}

/** The bus message for a change. `cursor` holds the event row's id until the writing transaction gives the event its position (infra/platform.ts). */
/** Columns whose change alters the instance's part of its node's spec. */
const SPEC_FIELDS: readonly (keyof typeof settable)[] = ["node_id", "allocation_id", "vcpus", "memory_mib", "disk_gib", "gpus", "addresses"];

/**
 * Whether the host is told the same before and after: held or not, to be removed or not, in which power
 * state. Going into or out of `lost` is never neutral: the silent host's last report must not count after it.
 */
function sameSpecView(from: InstanceState, fromDesired: DesiredState, to: InstanceState, toDesired: DesiredState): boolean {
  if (from === "lost" || to === "lost") return from === to && fromDesired === toDesired;
  const view = (state: InstanceState, desired: DesiredState) =>
    desired === "deleted" ? `remove:${state !== "deleted"}` : HELD_STATES.includes(state) ? `hold:${specPower(state, desired)}` : "none";
  return view(from, fromDesired) === view(to, toDesired);
}

export function eventMessage(inst: InstanceRow, from: string | null, cursor: string): InstanceEventMessage {
  return {
    cursor,
    instanceId: inst.id,
    tenantId: inst.tenantId,
    poolId: inst.poolId,
    projectId: inst.projectId,
    fromState: from,
    toState: inst.state,
    version: inst.version,
  };
}

const verb: Record<DesiredState, string> = { running: "start", stopped: "stop", paused: "pause", deleted: "delete" };

/**
 * start / stop / delete: record what the owner wants and let the reconciler get there. Asking again for
 * what is already asked changes nothing.
 */
export async function setDesiredState(sql: Sql, who: Principal, id: string, desired: DesiredState, ctx: Ctx): Promise<Change> {
  const inst = await lockInstance(sql, who, id);
  if (inst.desiredState === desired) return { instance: inst, event: null };
  if (inst.desiredState === "deleted") throw new AppError("PRECONDITION_FAILED", `instance ${id} is being deleted`, { state: inst.state });
  if (desired === "paused") {
    // Pausing keeps the guest's memory on a host of ours; a provider has no such verb behind our API.
    const [pool] = await sql.query<{ class: string }>(`SELECT class FROM pools WHERE id = $1`, [inst.poolId]);
    if (pool?.class !== "vps-host") throw new AppError("UNSUPPORTED", "pause is supported on hosted pools only");
  }
  return writeChange(sql, inst, { desired_state: desired }, `requested:${desired}`, ctx, `${verb[desired]}Instance`);
}

/**
 * Resize in place: hosted only, stopped only, same number of GPUs. The old claim is given back and the new
 * one taken on the same node and against quota in this transaction, so a refusal leaves the old shape held.
 */
export async function resizeInstance(sql: Sql, ids: IdSource, who: Principal, id: string, flavorName: string, ctx: Ctx): Promise<Change> {
  const inst = await lockInstance(sql, who, id);
  const [pool] = await sql.query<{ class: string; policy: { singleTenant?: boolean } }>(`SELECT class, policy FROM pools WHERE id = $1`, [inst.poolId]);
  if (pool?.class !== "vps-host") throw new AppError("UNSUPPORTED", "resize is supported on hosted pools only; provider instances keep their shape");
  if (inst.state !== "stopped" || inst.desiredState !== "stopped") {
    throw new AppError("PRECONDITION_FAILED", `resize needs a stopped instance; ${id} is ${inst.state} (desired ${inst.desiredState})`, { state: inst.state });
  }
  const [flavor] = await sql.query<Shape & { name: string }>(
    `SELECT name, vcpus, memory_mib AS "memoryMib", disk_gib AS "diskGib", gpus FROM flavors WHERE pool_id = $1 AND name = $2`,
    [inst.poolId, flavorName],
  );
  if (!flavor) throw notFound("flavor", `${flavorName} in pool ${inst.poolId}`);
  if (flavor.name === inst.flavor) return { instance: inst, event: null };
  const next: Shape = parseInput(shapeSchema, flavor, "flavor");
  const held = gpuCount({ gpus: inst.gpus as Shape["gpus"] });
  if (gpuCount(next) !== held) throw invalid(`resize keeps the GPU count: ${inst.flavor} has ${held}, ${flavor.name} has ${gpuCount(next)}`);
  // A disk only grows: shrinking it would cut off whatever the guest wrote past the new end.
  if (next.diskGib < inst.diskGib)
    throw invalid(`resize cannot shrink the disk: ${inst.flavor} has ${inst.diskGib} GiB, ${flavor.name} has ${next.diskGib} GiB`);
  if (!inst.nodeId || !inst.allocationId) throw new AppError("PRECONDITION_FAILED", `instance ${id} holds no placement`);

  await releaseAllocation(sql, inst.allocationId);
  const placed = await place(sql, ids, {
    poolId: inst.poolId,
    tenantId: inst.tenantId,
    instanceId: id,
    shape: next,
    singleTenant: pool.policy.singleTenant === true,
    onlyNodeId: inst.nodeId,
  });
  const charge = chargeOf(next);
  await releaseQuota(sql, inst.tenantId, inst.charge as Charge);
  await chargeQuota(sql, inst.tenantId, charge);
  return writeChange(
    sql,
    inst,
    {
      state: "resizing",
      flavor: flavor.name,
      vcpus: next.vcpus,
      memory_mib: next.memoryMib,
      disk_gib: next.diskGib,
      gpus: next.gpus,
      charge,
      allocation_id: placed.allocationId,
    },
    "requested:resize",
    ctx,
    "resizeInstance",
    { from: inst.flavor, to: flavor.name },
  );
}

/**
 * Move `state` one step (the reconciler's primitive) on a row the caller locked (lockInstance). Reaching
 * `deleted` releases what the instance held.
 */
export async function transition(sql: Sql, inst: InstanceRow, to: InstanceState, reason: string, ctx: Ctx): Promise<Change> {
  const extra = to === "deleted" ? await releaseResources(sql, inst) : {};
  return writeChange(sql, inst, { state: to, ...extra }, reason, ctx);
}

/**
 * Give back the allocation, the address and the quota charge. Safe to call twice: the allocation and lease
 * rows are gone after the first call and `charge_released` guards the quota.
 */
export async function releaseResources(sql: Sql, inst: InstanceRow): Promise<InstanceSet> {
  if (inst.allocationId) await releaseAllocation(sql, inst.allocationId);
  await releaseLease(sql, inst.id);
  if (!inst.chargeReleased) await releaseQuota(sql, inst.tenantId, inst.charge as Charge);
  return { allocation_id: null, charge_released: true, addresses: [] };
}
