import { reconcileOnce } from "../../core/instances/reconciler.ts";
import type { Platform } from "../../infra/platform.ts";

/** Steps per run: enough to walk pending → running, bounded so a flapping instance cannot hold a worker. */
const MAX_STEPS = 16;

/**
 * `vps.instances`: apply one guarded step per transaction until the instance has nothing left to do. Each
 * step re-reads the row under its lock, so stale and duplicate jobs do nothing.
 */
export async function reconcileInstance(platform: Platform, instanceId: string): Promise<void> {
  for (let step = 0; step < MAX_STEPS; step++) {
    const changed = await platform.write({ actor: "reconciler" }, (w) => reconcileOnce(w, platform.drivers, instanceId));
    if (!changed) return;
  }
}
