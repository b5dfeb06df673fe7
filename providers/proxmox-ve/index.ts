import { z } from "zod";
import { defineProvider, secretRef } from "../../core/pools/provider/contract.ts";

/** Proxmox VE: the cluster's API endpoint, an API token (its secret by reference), and where VMs go. */
export const proxmoxVe = defineProvider({
  id: "proxmox-ve",
  displayName: "Proxmox VE",
  accountConfig: z
    .object({
      endpoint: z.url(),
      tokenId: z.string().min(1),
      tokenSecret: secretRef,
      node: z.string().min(1).optional(),
      storage: z.string().min(1).optional(),
    })
    .strict(),
});
