import { isAppError } from "../../contracts/errors.ts";
import type { Write } from "../kernel/write.ts";
import type { DriverDeps } from "../pools/driver.ts";
import { getPool } from "../pools/pools.ts";
import { driverFor } from "../pools/registry.ts";
import { lockInstance } from "./changes.ts";
import type { Instance } from "./model.ts";
import { settleCommands } from "./snapshots.ts";

/**
 * One look at one instance, in the Write's transaction: lock it, re-read it, settle what its host commands
 * finished, then let its pool's driver take at most one guarded step. Returns the instance when something
 * changed (null otherwise), so a stale or duplicate wake-up does nothing.
 */
export async function reconcileOnce(w: Write, deps: DriverDeps, instanceId: string): Promise<Instance | null> {
  let inst: Instance;
  try {
    inst = await lockInstance(w, null, instanceId);
  } catch (e) {
    if (isAppError(e, "NOT_FOUND")) return null;
    throw e;
  }
  const settled = await settleCommands(w, inst);
  if (settled) return settled;
  const pool = await getPool(w.sql, inst.poolId);
  if (!pool) return null;
  return driverFor(pool.class).reconcile(w, inst, pool, deps);
}
