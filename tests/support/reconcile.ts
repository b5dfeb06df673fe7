import { lockInstance, markDeleted, writeChange } from "../../core/instances/changes.ts";
import type { Instance } from "../../core/instances/model.ts";
import type { InstanceState } from "../../core/instances/state.ts";
import type { Write } from "../../core/kernel/write.ts";
import { getPool } from "../../core/pools/pools.ts";
import { driverFor } from "../../core/pools/registry.ts";
import type { Platform } from "../../infra/platform.ts";

/**
 * Move a locked instance's `state` one step, as a reconciler would on a host's word. Reaching `deleted` gives
 * back what it held through its pool's driver, and its quota charge.
 */
async function transition(w: Write, inst: Instance, to: InstanceState, reason: string): Promise<Instance> {
  if (to !== "deleted") return writeChange(w, inst, { state: to }, reason);
  const pool = await getPool(w.sql, inst.poolId);
  return markDeleted(w, inst, reason, await driverFor(pool?.class ?? "").release(w, inst));
}

/**
 * What the reconciler does once a host confirms an instance gone: deleting, then deleted, which releases its
 * allocation, lease and quota. Tests of admission use it to close the loop without hosts.
 */
export async function confirmDeleted(platform: Platform, id: string): Promise<void> {
  await platform.write({ actor: "test:host" }, async (w) => {
    let inst = await lockInstance(w, null, id);
    if (inst.state !== "deleting") inst = await transition(w, inst, "deleting", "host:deleting");
    await transition(w, inst, "deleted", "host:gone");
  });
}

/** Move an instance along a path of states, as host reports would. */
export async function walk(platform: Platform, id: string, states: string[]): Promise<void> {
  for (const to of states) {
    await platform.write({ actor: "test:host" }, async (w) => transition(w, await lockInstance(w, null, id), to as InstanceState, `host:${to}`));
  }
}
