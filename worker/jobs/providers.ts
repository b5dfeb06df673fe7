import { providerAccountIds, sweepAccount } from "../../core/pools/provider/orphans.ts";
import type { Platform } from "../../infra/platform.ts";

/**
 * `vps.providers`: each provider account's offers are read again and its orphans found and, after the grace,
 * removed (core/pools/provider/orphans.ts). One account failing (its provider down, its credential revoked)
 * is logged and leaves the others be.
 */
export async function sweepProviders(platform: Platform, accountId?: string): Promise<void> {
  const ids = accountId ? [accountId] : await providerAccountIds(platform.sync);
  for (const id of ids) {
    try {
      await sweepAccount(platform.sync, id, platform.config.providers.orphanGraceMs);
    } catch (e) {
      platform.log.warn("provider sweep failed", { accountId: id, err: e instanceof Error ? e.message : String(e) });
    }
  }
}
