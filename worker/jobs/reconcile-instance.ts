import { reconcileOnce } from "../../core/instances/reconciler.ts";
import type { Platform } from "../../infra/platform.ts";

/** Steps per run: enough to walk pending → running, bounded so a flapping instance cannot hold a worker. */
const MAX_STEPS = 16;

/**
 * `vps.instances`: apply one guarded step per transaction until the instance has nothing left to do. Each
 * step re-reads the row under its lock, so stale and duplicate jobs do nothing.
 */
export async function reconcileInstance(platform: Platform, instanceId: string): Promise<void> {
  const deps = { ids: platform.ids, now: platform.now, maxRecreateAttempts: platform.config.hosts.maxRecreateAttempts };
  for (let step = 0; step < MAX_STEPS; step++) {
    const change = await platform.write(async (sql, emit) => {
      const c = await reconcileOnce(sql, deps, instanceId);
      emit(c);
      return c;
    });
    if (!change) return;
  }
}
