import { AppError, invalid, notFound } from "../../../contracts/errors.ts";
import { markDeleted, writeChange } from "../../instances/changes.ts";
import { one } from "../../kernel/db.ts";
import type { PoolDriver } from "../driver.ts";

/**
 * Provider pools (`provider`): VMs on a cloud someone else runs, through a provider account. The provider
 * places and bills; we keep no node or address of ours. Until provider plugins can create machines, this
 * driver refuses creates (and charges nothing), so nothing is admitted that could not be converged and
 * deleted. Instances admitted before that (none should exist) can still be deleted.
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
    if (shape.gpus.length) throw invalid("provider flavors name no GPUs; the provider's server type decides them");
  },

  async admit(_w, req) {
    throw new AppError("UNSUPPORTED", `pool ${req.pool.name} is a provider pool: creating instances on a provider is not supported yet`);
  },

  async resize() {
    throw new AppError("UNSUPPORTED", "provider instances keep their shape");
  },

  async release() {
    return {};
  },

  async reconcile(w, inst) {
    if (inst.desiredState !== "deleted" || inst.state === "deleted") return null;
    if (inst.state !== "deleting") return writeChange(w, inst, { state: "deleting" }, "delete");
    return markDeleted(w, inst, "deleted", {});
  },
};
