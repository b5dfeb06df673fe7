import { reconcilePass } from "../../core/lifecycle/reconciler.ts";
import { driverFor } from "../../core/pools/registry.ts";
import type { Platform } from "../../infra/platform.ts";

/**
 * `vps.instances`: one reconcile pass (core/lifecycle/reconciler.ts) in one transaction; stale and duplicate jobs
 * do nothing. Instances whose driver converges through an outside API (provider pools) run its `sync` instead,
 * which says when to look again.
 */
export async function reconcileInstance(platform: Platform, instanceId: string): Promise<void> {
  const poolClass = await platform.read((sql) =>
    sql.query<{ class: string }>(`SELECT p.class FROM instances i JOIN pools p ON p.id = i.pool_id WHERE i.id = $1`, [instanceId]),
  );
  const driver = poolClass[0] ? driverFor(poolClass[0].class) : null;
  if (driver?.sync) {
    const again = await driver.sync(platform.sync, instanceId);
    if (again !== null) await platform.jobs.enqueue("vps.poll", { instanceId }, { delayMs: again });
    return;
  }
  await platform.write({ actor: "reconciler" }, (w) => reconcilePass(w, platform.drivers, instanceId));
}
