import type { Platform } from "../infra/platform.ts";
import { reconcileInstance } from "./jobs/reconcile-instance.ts";
import { sweep } from "./jobs/sweep.ts";

/** The worker: every job of the catalog, each handled by its file in jobs/. */
export function startWorker(platform: Platform) {
  return platform.jobs.run(
    {
      "vps.instances": (p) => reconcileInstance(platform, p.instanceId),
      "vps.sweep": () => sweep(platform),
    },
    platform.config,
    platform.log,
  );
}
