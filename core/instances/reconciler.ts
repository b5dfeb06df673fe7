import { isAppError } from "../../contracts/errors.ts";
import type { Shape } from "../catalog/shapes.ts";
import type { Sql } from "../kernel/db.ts";
import type { IdSource } from "../kernel/ids.ts";
import { place, releaseAllocation } from "../pools/hosted/placement.ts";
import { type Change, type InstanceRow, type InstanceSet, lockInstance, transition, writeChange } from "./changes.ts";
import { decide, type Situation } from "./decide.ts";
import type { DesiredState, InstanceState } from "./state.ts";

export interface ReconcilerDeps {
  ids: IdSource;
  now: () => Date;
  maxRecreateAttempts: number;
}

type Condition = { type: string; reason: string; message: string };

/**
 * One look at one instance, in the caller's transaction: lock it, re-read it, apply at most one guarded step.
 * Returns the change (null when there was nothing to do), so a stale or duplicate wake-up does nothing.
 */
export async function reconcileOnce(sql: Sql, deps: ReconcilerDeps, instanceId: string): Promise<Change | null> {
  let inst: InstanceRow;
  try {
    inst = await lockInstance(sql, null, instanceId);
  } catch (e) {
    if (isAppError(e, "NOT_FOUND")) return null;
    throw e;
  }
  const [pool] = await sql.query<{ class: string; policy: { singleTenant?: boolean } }>(`SELECT class, policy FROM pools WHERE id = $1`, [inst.poolId]);
  // Provider pools converge through their provider plugin (a later capability); nothing to do here yet.
  if (pool?.class !== "vps-host") return null;
  const [node] = inst.nodeId
    ? await sql.query<{ lost: boolean; gone: boolean }>(`SELECT lost_at IS NOT NULL AS lost, gone_at IS NOT NULL AS gone FROM nodes WHERE id = $1`, [
        inst.nodeId,
      ])
    : [];
  const fresh = inst.observedState !== null && inst.observedGeneration >= inst.specGeneration;
  const shape = inst.observedShape as { vcpus: number; memoryMib: number; diskGib: number } | null;
  const situation: Situation = {
    state: inst.state as InstanceState,
    desired: inst.desiredState as DesiredState,
    placed: inst.allocationId !== null,
    node: node ?? null,
    observed: fresh
      ? {
          state: inst.observedState as NonNullable<Situation["observed"]>["state"],
          error: inst.observedError,
          retryable: inst.observedRetryable,
          shapeMatches: !!shape && shape.vcpus === inst.vcpus && shape.memoryMib === inst.memoryMib && shape.diskGib === inst.diskGib,
        }
      : null,
    attempts: inst.attempts,
    maxAttempts: deps.maxRecreateAttempts,
    retryRequested: inst.retryRequested,
  };
  const step = decide(situation);
  if (!step) return null;
  const ctx = { actor: "reconciler", now: deps.now() };
  const conditions = inst.conditions as Condition[];

  if (step.effects?.includes("place")) {
    try {
      const placed = await place(sql, deps.ids, {
        poolId: inst.poolId,
        tenantId: inst.tenantId,
        instanceId: inst.id,
        shape: { vcpus: inst.vcpus, memoryMib: inst.memoryMib, diskGib: inst.diskGib, gpus: inst.gpus as Shape["gpus"] },
        singleTenant: pool.policy.singleTenant === true,
        excludeNodeIds: inst.excludedNodes ?? [],
      });
      return writeChange(
        sql,
        inst,
        { state: "provisioning", node_id: placed.nodeId, allocation_id: placed.allocationId, conditions: without(conditions, "Unschedulable") },
        "placed",
        ctx,
      );
    } catch (e) {
      if (!isAppError(e, "UNSCHEDULABLE")) throw e;
      const next = [...without(conditions, "Unschedulable"), { type: "Unschedulable", reason: "NoFit", message: e.message }];
      if (sameConditions(next, conditions)) return null;
      return writeChange(sql, inst, { conditions: next }, "unschedulable", ctx);
    }
  }

  const set: InstanceSet = {};
  if (step.runtimeError)
    set.conditions = [...without(conditions, "RuntimeError"), { type: "RuntimeError", reason: "HostReported", message: step.runtimeError }];
  else if (step.to === "running" || step.to === "stopped") set.conditions = without(conditions, "RuntimeError");
  if (step.effects?.includes("recreate")) {
    if (inst.allocationId) await releaseAllocation(sql, inst.allocationId);
    Object.assign(set, {
      allocation_id: null,
      node_id: null,
      attempts: inst.attempts + 1,
      excluded_nodes: [...new Set([...(inst.excludedNodes ?? []), inst.nodeId as string])],
    });
  }
  if (step.effects?.includes("clear-retry")) set.retry_requested = false;
  if (!step.to) return Object.keys(set).length ? writeChange(sql, inst, set, step.reason, ctx) : null;
  if (step.to === "deleted") return transition(sql, inst, "deleted", step.reason, ctx);
  return writeChange(sql, inst, { state: step.to, ...set }, step.reason, ctx);
}

const without = (cs: Condition[], type: string) => cs.filter((c) => c.type !== type);
const sameConditions = (a: Condition[], b: Condition[]) => JSON.stringify(a) === JSON.stringify(b);
