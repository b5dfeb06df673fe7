import { isAppError } from "../../../contracts/errors.ts";
import { DEFAULT_RUNTIME } from "../../../contracts/runtimes.ts";
import { closeSpan, openSpan, spanOwner } from "../../books/spans.ts";
import { type InstanceSet, markDeleted, writeChange } from "../../instances/changes.ts";
import { CRASH_WINDOW_MS, decide, type Situation } from "../../instances/decide.ts";
import type { Condition, Instance } from "../../instances/model.ts";
import type { Write } from "../../kernel/write.ts";
import type { Pool } from "../driver.ts";
import { releaseLease } from "./leases.ts";
import { place, releaseAllocation } from "./placement.ts";

/**
 * One reconciler step for a hosted instance: what its host last reported (counted only once the report has
 * caught up with the instance's last change) and the state of its node decide the step (instances/decide.ts);
 * placing, recreating elsewhere and releasing are this pool class's effects, and so are the conditions that
 * say why an instance waits on its host (a crash, a refusal, a failure).
 */
export async function reconcileHosted(w: Write, inst: Instance, pool: Pool, maxRecreateAttempts: number): Promise<Instance | null> {
  // One look at the node per pass: its steps decide from the same view of it.
  const nodeId = inst.nodeId;
  const [node] = nodeId
    ? await w.look(`node:${nodeId}`, () =>
        w.sql.query<{ lost: boolean; gone: boolean; refusing: boolean; name: string }>(
          `SELECT lost_at IS NOT NULL AS lost, gone_at IS NOT NULL AS gone, state = 'refusing' AS refusing, name FROM nodes WHERE id = $1`,
          [nodeId],
        ),
      )
    : [];
  // The node's spec names the pool's runtime the same way (spec.ts).
  const refusal = node?.refusing ? `host ${node.name} does not run this pool's runtime (${pool.runtime ?? DEFAULT_RUNTIME}) and refuses its instances` : null;
  const fresh = inst.observedState !== null && inst.observedGeneration >= inst.specGeneration;
  const shape = inst.observedShape;
  const crashed = inst.state === "error" && inst.conditions.some((c) => c.type === "RuntimeError" && c.reason === "GuestCrashed");
  const situation: Situation = {
    state: inst.state,
    desired: inst.desiredState,
    placed: inst.allocationId !== null,
    node: node ? { lost: node.lost, gone: node.gone, refusal } : null,
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
    crashed,
    crashes: crashed || (fresh && inst.observedState === "crashed") ? await recentCrashes(w, inst.id) : 0,
  };
  const step = decide(situation);
  const conditions = inst.conditions;
  if (!step) {
    const next = refusalConditions(conditions, inst, refusal, false);
    return next === conditions ? null : writeChange(w, inst, { conditions: next }, refusal ? "host:runtime-missing" : "host:runtime-present");
  }

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
      await openSpan(w, placed.allocationId, spanOwner(inst));
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
  const recreate = step.effects?.includes("recreate") ?? false;
  let next = conditions;
  if (step.runtimeError)
    next = [...without(next, "RuntimeError"), { type: "RuntimeError", reason: step.conditionReason ?? "HostReported", message: step.runtimeError }];
  else if (step.to === "running" || step.to === "stopped") next = without(next, "RuntimeError");
  next = refusalConditions(next, inst, refusal, recreate);
  if (next !== conditions) set.conditions = next;
  if (recreate) {
    if (inst.allocationId) {
      await closeSpan(w, inst.allocationId);
      await releaseAllocation(w.sql, inst.allocationId);
    }
    Object.assign(set, {
      allocation_id: null,
      node_id: null,
      attempts: inst.attempts + 1,
      excluded_nodes: [...new Set([...inst.excludedNodes, inst.nodeId as string])],
      // The lease stays with the instance (same pool, same network); what the old host saw it use does not.
      addresses: inst.addresses.slice(0, 1),
    });
  }
  if (step.effects?.includes("clear-retry")) set.retry_requested = false;
  if (!step.to) return Object.keys(set).length ? writeChange(w, inst, set, step.reason) : null;
  if (step.to === "deleted") return markDeleted(w, inst, step.reason, await releaseHosted(w, inst));
  return writeChange(w, inst, { state: step.to, ...set }, step.reason);
}

/** Give back the allocation and the address. Safe to call twice: both rows are gone after the first call. */
export async function releaseHosted(w: Write, inst: Instance): Promise<InstanceSet> {
  if (inst.allocationId) {
    await closeSpan(w, inst.allocationId);
    await releaseAllocation(w.sql, inst.allocationId);
  }
  await releaseLease(w.sql, inst.id);
  return { allocation_id: null, addresses: [] };
}

const without = (cs: Condition[], type: string) => cs.filter((c) => c.type !== type);

/**
 * An instance held by a host that refuses its pool's spec says so; once it is on a host that does not refuse
 * (the same one, or another it was recreated on) it says so no more. Returns `cs` itself when nothing changes.
 */
function refusalConditions(cs: Condition[], inst: Instance, refusal: string | null, leaving: boolean): Condition[] {
  if (inst.state === "deleted") return cs;
  const waits = refusal !== null && !leaving && inst.allocationId !== null && inst.state !== "deleting";
  const has = cs.find((c) => c.reason === "RuntimeMissing");
  if (waits && has?.message !== refusal)
    return [...without(cs, "RuntimeError"), { type: "RuntimeError", reason: "RuntimeMissing", message: refusal as string }];
  if (!waits && has && refusal === null && !leaving && inst.nodeId !== null) return cs.filter((c) => c.reason !== "RuntimeMissing");
  return cs;
}

/** Crashes of the instance recorded within the window (decide.ts bounds the restarts after one). */
async function recentCrashes(w: Write, id: string): Promise<number> {
  const [row] = await w.sql.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM instance_events WHERE instance_id = $1 AND reason = 'host:crashed' AND at > $2`,
    [id, new Date(w.now.getTime() - CRASH_WINDOW_MS)],
  );
  return row?.n ?? 0;
}
