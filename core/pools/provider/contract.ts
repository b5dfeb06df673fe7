import { z } from "zod";

/**
 * What a provider plugin declares: its id (what provider accounts name) and the shape of an account's config.
 * The implementation (create, get, delete against the cloud's API) registers against the same id in worker/.
 */
export interface ProviderDefinition {
  id: string;
  displayName: string;
  accountConfig: z.ZodType<Record<string, unknown>>;
}

export const defineProvider = (def: ProviderDefinition): ProviderDefinition => def;

/** A secret is referenced, never stored inline: `{ secretRef: "env:HCLOUD_TOKEN" }`. */
const secretRef = z.object({ secretRef: z.string().min(1) }).strict();

export const hetznerCloud = defineProvider({
  id: "hetzner-cloud",
  displayName: "Hetzner Cloud",
  accountConfig: z.object({ token: secretRef, location: z.string().min(1).optional(), endpoint: z.url().optional() }).strict(),
});

export const proxmox = defineProvider({
  id: "proxmox",
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

/** The definitions the env (`PROVIDERS=hetzner-cloud,proxmox`) can name. */
export const builtinProviders: readonly ProviderDefinition[] = [hetznerCloud, proxmox];
