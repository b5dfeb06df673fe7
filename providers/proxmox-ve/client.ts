import type { Machine, ProviderContext, ProviderSession } from "../../core/pools/provider/contract.ts";
import { defaultOffers, type ProxmoxConfig } from "./config.ts";
import { createMachine } from "./create.ts";
import { PveApi, PveError, type Tuning } from "./http.ts";
import { instanceTag, managedTag, splitTags } from "./labels.ts";
import { destroy, powerOff, powerOn } from "./power.ts";
import { type Row, Vms } from "./vms.ts";

/**
 * A Proxmox VE account as a ProviderSession. Machines are QEMU VMs cloned from the account's templates; the
 * external id is the VMID. A VM is ours when its description carries our marker (labels.ts); its tags only
 * narrow the search. VMs without any tag are read too, since a create that died right after the clone
 * leaves its VM untagged.
 */
export function connectProxmox(config: ProxmoxConfig, ctx: ProviderContext, tuning?: Tuning): ProviderSession {
  const api = new PveApi(config.endpoint, config.tokenId, ctx, tuning);
  const vms = new Vms(api, config);
  const offers = config.offers ?? defaultOffers;

  const mayBeOurs = (tag: string) => (r: Row) => !r.template && (splitTags(r.tags).length === 0 || splitTags(r.tags).includes(tag));

  const existing = async (externalId: string) => {
    const found = await current(externalId);
    if (!found) throw new PveError("invalid", `proxmox-ve: VM ${externalId} does not exist`, "does not exist", { code: "not_found" });
    return found;
  };
  // An id that is no VMID names no VM.
  const vmidOf = (externalId: string) => (/^\d{3,9}$/.test(externalId) ? Number(externalId) : null);
  const current = async (externalId: string) => {
    const vmid = vmidOf(externalId);
    return vmid === null ? null : vms.current(vmid);
  };

  return {
    offers: async () => offers.map((o) => ({ ...o })),

    create: (req) => createMachine(vms, [...offers], ctx.managedBy, req),

    async get(externalId) {
      const vmid = vmidOf(externalId);
      return vmid === null ? null : vms.look(vmid);
    },

    async find(instanceId) {
      const rows = (await vms.rows()).filter(mayBeOurs(instanceTag(instanceId)));
      for (const { row } of (await vms.labelled(rows)).filter((l) => l.marker.instanceId === instanceId)) {
        const found = await vms.look(row.vmid);
        if (found) return found;
      }
      return null;
    },

    async start(externalId) {
      const { ref, cur } = await existing(externalId);
      if (cur.status !== "running") await powerOn(vms, ref);
    },

    async stop(externalId) {
      const { ref, cur } = await existing(externalId);
      if (cur.status !== "stopped") await powerOff(vms, ref);
    },

    async delete(externalId) {
      const found = await current(externalId);
      if (!found || found.cur.lock === "destroyed") return;
      await destroy(vms, found.ref, found.cur.status === "running");
    },

    async list(): Promise<Machine[]> {
      const rows = (await vms.rows()).filter(mayBeOurs(managedTag));
      return (await vms.labelled(rows)).filter((l) => l.marker.managedBy === ctx.managedBy).map((l) => vms.rowMachine(l.row, l.marker));
    },

    pace: () => api.pace(),
  };
}
