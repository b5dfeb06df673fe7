import { isAppError } from "../../../contracts/errors.ts";
import { type InstanceSet, markDeleted, writeChange } from "../../instances/changes.ts";
import { decide, type Situation } from "../../instances/decide.ts";
import type { Condition, Instance } from "../../instances/model.ts";
import type { Write } from "../../kernel/write.ts";
import type { Pool } from "../driver.ts";
import { releaseLease } from "./leases.ts";
import { place, releaseAllocation } from "./placement.ts";

/**
 * One reconciler step for a hosted instance: what its host last reported (counted only once the report has
 * caught up with the instance's last change) and the state of its node decide the step (instances/decide.ts);
 * placing, recreating elsewhere and releasing are this pool class's effects.
 */
export async function reconcileHosted(w: Write, inst: Instance, pool: Pool, maxRecreateAttempts: number): Promise<Instance | null> {
  const [node] = inst.nodeId
    ? await w.sql.query<{ lost: boolean; gone: boolean }>(`SELECT lost_at IS NOT NULL AS lost, gone_at IS NOT NULL AS gone FROM nodes WHERE id = $1`, [
        inst.nodeId,
      ])
    : [];
  const fresh = inst.observedState !== null && inst.observedGeneration >= inst.specGeneration;
  const shape = inst.observedShape;
  const situation: Situation = {
    state: inst.state,
    desired: inst.desiredState,
    placed: inst.allocationId !== null,
    node: node ?? null,
    observed:
      fresh && inst.observedState
        ? {
            state: inst.observedState,
            error: inst.observedError,
            retryable: inst.observedRetryable,
            shapeMatches: !!shape && shape.vcpus === inst.vcpus && shape.memoryMib === inst.memoryMib && shape.diskGib === inst.diskGib,
          }
        : null,
    attempts: inst.attempts,
    maxAttempts: maxRecreateAttempts,
    retryRequested: inst.retryRequested,
  };
  const step = decide(situation);
  if (!step) return null;
  const conditions = inst.conditions;

  if (step.effects?.includes("place")) {
    try {
      const placed = await place(w.sql, w.ids, {
        poolId: inst.poolId,
        tenantId: inst.tenantId,
        instanceId: inst.id,
        shape: { vcpus: inst.vcpus, memoryMib: inst.memoryMib, diskGib: inst.diskGib, gpus: inst.gpus },
        singleTenant: pool.singleTenant,
        excludeNodeIds: inst.excludedNodes,
      });
      return writeChange(
        w,
        inst,
        { state: "provisioning", node_id: placed.nodeId, allocation_id: placed.allocationId, conditions: without(conditions, "Unschedulable") },
        "placed",
      );
    } catch (e) {
      if (!isAppError(e, "UNSCHEDULABLE")) throw e;
      const next = [...without(conditions, "Unschedulable"), { type: "Unschedulable", reason: "NoFit", message: e.message }];
      if (JSON.stringify(next) === JSON.stringify(conditions)) return null;
      return writeChange(w, inst, { conditions: next }, "unschedulable");
    }
  }

  const set: InstanceSet = {};
  if (step.runtimeError)
    set.conditions = [...without(conditions, "RuntimeError"), { type: "RuntimeError", reason: "HostReported", message: step.runtimeError }];
  else if (step.to === "running" || step.to === "stopped") set.conditions = without(conditions, "RuntimeError");
  if (step.effects?.includes("recreate")) {
    if (inst.allocationId) await releaseAllocation(w.sql, inst.allocationId);
    Object.assign(set, {
      allocation_id: null,
      node_id: null,
      attempts: inst.attempts + 1,
      excluded_nodes: [...new Set([...inst.excludedNodes, inst.nodeId as string])],
    });
  }
  if (step.effects?.includes("clear-retry")) set.retry_requested = false;
  if (!step.to) return Object.keys(set).length ? writeChange(w, inst, set, step.reason) : null;
  if (step.to === "deleted") return markDeleted(w, inst, step.reason, await releaseHosted(w, inst));
  return writeChange(w, inst, { state: step.to, ...set }, step.reason);
}

/** Give back the allocation and the address. Safe to call twice: both rows are gone after the first call. */
export async function releaseHosted(w: Write, inst: Instance): Promise<InstanceSet> {
  if (inst.allocationId) await releaseAllocation(w.sql, inst.allocationId);
  await releaseLease(w.sql, inst.id);
  return { allocation_id: null, addresses: [] };
}

const without = (cs: Condition[], type: string) => cs.filter((c) => c.type !== type);
