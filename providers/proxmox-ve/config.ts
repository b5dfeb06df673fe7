import { z } from "zod";
import type { ProviderOffer } from "../../core/pools/provider/contract.ts";

// Proxmox sells no machine types, so an account lists the shapes its pools may use; these stand in when it lists none.
export const defaultOffers: readonly ProviderOffer[] = [
  { name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 },
  { name: "medium", vcpus: 2, memoryMib: 4096, diskGib: 40 },
  { name: "large", vcpus: 4, memoryMib: 8192, diskGib: 80 },
];

// PVE's own limits: VMIDs 100..999999999, token ids `user@realm!name`, node names are DNS labels.
const vmid = z.number().int().min(100).max(999_999_999);
const tokenIdPattern = /^[^\s:/@!=]+@[A-Za-z][A-Za-z0-9._-]*![A-Za-z][A-Za-z0-9._-]*$/;
const dnsLabel = /^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/;

const offer = z
  .object({
    name: z.string().regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, "an offer name is lower-case letters, digits, '.', '_' or '-'"),
    vcpus: z.number().int().min(1).max(512),
    memoryMib: z.number().int().min(16),
    diskGib: z.number().int().min(1),
  })
  .strict();

export const proxmoxConfigSchema = z
  .object({
    /** The API base, `https://host:8006/api2/json`. */
    // URL.canParse first: zod runs refinements even on a value its own url check refused.
    endpoint: z.url().refine((u) => URL.canParse(u) && /\/api2\/json\/?$/.test(new URL(u).pathname), "endpoint is the API base, ending in /api2/json"),
    tokenId: z.string().regex(tokenIdPattern, "tokenId is `user@realm!tokenname`"),
    /** The node new VMs are cloned to. */
    node: z.string().regex(dnsLabel, "node is a Proxmox node name"),
    /** Image name → VMID of the template VM that image is cloned from. */
    templates: z.record(z.string().min(1), vmid).refine((t) => Object.keys(t).length > 0, "templates names at least one image"),
    /** Where full clones put their disks; the template's storage when absent. */
    storage: z
      .string()
      .regex(/^[A-Za-z][A-Za-z0-9._-]*$/)
      .optional(),
    /** The bridge the first network card joins; the template's when absent. */
    bridge: z
      .string()
      .regex(/^[A-Za-z][A-Za-z0-9._-]*$/)
      .optional(),
    offers: z
      .array(offer)
      .min(1)
      .refine((os) => new Set(os.map((o) => o.name)).size === os.length, "offer names are unique")
      .optional(),
    /** VMIDs this account's clones take, both ends included; PVE's next free id when absent. */
    vmidRange: z
      .object({ lower: vmid, upper: vmid })
      .strict()
      .refine((r) => r.lower <= r.upper, "vmidRange.lower is at most upper")
      .optional(),
  })
  .strict();

export type ProxmoxConfig = z.infer<typeof proxmoxConfigSchema>;
