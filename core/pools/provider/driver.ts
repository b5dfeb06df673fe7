import { AppError, invalid, notFound } from "../../../contracts/errors.ts";
import { one } from "../../kernel/db.ts";
import type { PoolDriver } from "../driver.ts";
import { offersOf, smallestFitting } from "./accounts.ts";
import type { ProviderSessions } from "./contract.ts";
import { providerChecks } from "./doctor.ts";
import { syncProviderInstance } from "./sync.ts";

declare module "../driver.ts" {
  /** What `sync` needs beyond the seam's: the worker's provider sessions, one per account (infra/providers.ts). */
  interface SyncIo {
    providers: ProviderSessions;
  }
}

/**
 * Provider pools (`provider`): VMs on a cloud someone else runs, through a provider account. The provider
 * places and bills: admission holds no node and no address of ours, charges quota from the flavor's shape and
 * records the smallest of the account's offers that holds it. The worker converges each instance through the
 * provider's API (`sync`, core/pools/provider/sync.ts); nothing in a request calls the provider.
 */
export const providerDriver: PoolDriver = {
  poolClass: "provider",
  label: "provider pools",
  capabilities: new Set(),

  async prepare(sql, input) {
    if (!input.providerAccountId) throw invalid("a provider pool needs a providerAccountId", { path: "input.providerAccountId" });
    if (input.ipv4Range || input.ipv4Gateway) throw invalid("a provider pool takes no ipv4Range: the provider assigns addresses", { path: "input.ipv4Range" });
    if (!(await one(sql, `SELECT 1 FROM provider_accounts WHERE id = $1`, [input.providerAccountId])))
      throw notFound("provider account", input.providerAccountId);
    return { agent: "none", runtime: null, providerAccountId: input.providerAccountId };
  },

  async provision() {},

  checkFlavor(shape) {
    if (shape.gpus.length) throw invalid("provider flavors name no GPUs; the provider's machine type decides them", { path: "input.gpus" });
  },

  async admit(w, req) {
    const accountId = req.pool.providerAccountId as string;
    const offers = await offersOf(w.sql, accountId);
    const offer = smallestFitting(offers, req.shape);
    if (!offer) {
      const { vcpus, memoryMib, diskGib } = req.shape;
      throw new AppError(
        "UNSCHEDULABLE",
        offers.length
          ? `no offer of pool ${req.pool.name}'s provider holds ${vcpus} vCPUs, ${memoryMib} MiB and ${diskGib} GiB`
          : `pool ${req.pool.name}'s provider offers are not known yet (the worker reads them from the provider)`,
      );
    }
    return { nodeId: null, allocationId: null, addresses: [], image: null, runtime: null, offer: offer.name };
  },

  async resize() {
    throw new AppError("UNSUPPORTED", "provider instances keep their shape: the provider's machine type is fixed");
  },

  async release() {
    return {};
  },

  /** Provider instances move only through `sync`, in the worker, where the provider's API can be called. */
  async reconcile() {
    return null;
  },

  sync: syncProviderInstance,

  doctor: providerChecks,
};
