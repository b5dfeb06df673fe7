import type { Platform } from "../infra/platform.ts";
import { sweepProviders } from "./jobs/providers.ts";
import { reconcileInstance } from "./jobs/reconcile-instance.ts";
import { prune } from "./jobs/retention.ts";
import { expireSandbox, tendSandboxes } from "./jobs/sandboxes.ts";
import { sweep } from "./jobs/sweep.ts";
import { tearDownTenant } from "./jobs/tenants.ts";
import { meter } from "./jobs/usage.ts";
import { jobMetrics } from "./metrics.ts";

/** The worker: every job of the catalog, each handled by its file in jobs/. */
export function startWorker(platform: Platform) {
  return platform.jobs.run(
    {
      "vps.instances": (p) => reconcileInstance(platform, p.instanceId),
      // A poll only wakes the reconciler: its job id is the instance's, so it never runs beside it.
      "vps.poll": (p) => platform.jobs.enqueue("vps.instances", p),
      "vps.providers": (p) => sweepProviders(platform, p.accountId),
      "vps.sandboxes": () => tendSandboxes(platform),
      "vps.sandbox.expire": (p) => expireSandbox(platform, p.sandboxId),
      "vps.sweep": () => sweep(platform),
      "vps.usage": () => meter(platform),
      "vps.retention": () => prune(platform),
      "vps.tenants": (p) => tearDownTenant(platform, p.tenantId),
    },
    platform.config,
    platform.log,
    jobMetrics(platform.metrics),
  );
}
