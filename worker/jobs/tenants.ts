import { tenantDeleted } from "../../core/teardown/teardown.ts";
import type { Platform } from "../../infra/platform.ts";

/** `vps.tenants`: one pass of a deleted tenant's teardown (core/teardown/teardown.ts). */
export async function tearDownTenant(platform: Platform, tenantId: string): Promise<void> {
  const gone = await platform.write({ actor: "tenants" }, (w) => tenantDeleted(w, tenantId, platform.config.sandboxes.defaultWarmQuota));
  if (gone) platform.log.info("tenant deleted", { tenantId });
}
