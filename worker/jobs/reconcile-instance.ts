import { reconcileOnce } from "../../core/instances/reconciler.ts";
import { driverFor } from "../../core/pools/registry.ts";
import type { Platform } from "../../infra/platform.ts";

/** Steps per run: enough to walk pending → running, bounded so a flapping instance cannot hold a worker. */
const MAX_STEPS = 16;

/**
 * `vps.instances`: apply one guarded step per transaction until the instance has nothing left to do. Each
 * step re-reads the row under its lock, so stale and duplicate jobs do nothing. Instances whose driver
 * converges through an outside API (provider pools) run its `sync` instead, which says when to look again.
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
  for (let step = 0; step < MAX_STEPS; step++) {
    const changed = await platform.write({ actor: "reconciler" }, (w) => reconcileOnce(w, platform.drivers, instanceId));
    if (!changed) return;
  }
}
