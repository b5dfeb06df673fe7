import { recordAccountCheck } from "../../core/pools/provider/accounts.ts";
import { isProviderError } from "../../core/pools/provider/contract.ts";
import { providerAccountIds, sweepAccount } from "../../core/pools/provider/orphans.ts";
import type { Platform } from "../../infra/platform.ts";

/**
 * `vps.providers`: each provider account's offers are read again and its orphans found and, after the grace,
 * removed (core/pools/provider/orphans.ts). One account failing (its provider down, its credential revoked)
 * is logged and leaves the others be; either way the account records how the check went, for the doctor.
 */
export async function sweepProviders(platform: Platform, accountId?: string): Promise<void> {
  const ids = accountId ? [accountId] : await providerAccountIds(platform.sync);
  for (const id of ids) {
    let failure: { kind: string; message: string } | null = null;
    try {
      await sweepAccount(platform.sync, id, platform.config.providers.orphanGraceMs);
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      failure = { kind: isProviderError(e) ? e.kind : "unknown", message };
      platform.log.warn("provider sweep failed", { accountId: id, err: message });
    }
    await platform
      .write({ actor: "providers" }, (w) => recordAccountCheck(w.sql, id, w.now, failure))
      .catch((e) => platform.log.warn("could not record a provider account's check", { accountId: id, err: String(e) }));
  }
}
