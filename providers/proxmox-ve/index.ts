import { defineProvider } from "../../core/pools/provider/contract.ts";
import { connectProxmox } from "./client.ts";
import { proxmoxConfigSchema } from "./config.ts";

/**
 * Proxmox VE: VMs cloned from the account's template VMs on one node, through an API token (its secret is the
 * `tokenSecret` credential). Proxmox sells no machine types, so the account lists the offers it allows.
 */
export const proxmoxVe = defineProvider({
  id: "proxmox-ve",
  displayName: "Proxmox VE",
  accountConfig: proxmoxConfigSchema,
  credentials: ["tokenSecret"],
  connect: (config, ctx) => connectProxmox(config, ctx),
});
