import { z } from "zod";

/**
 * The provider contract: what a provider plugin (providers/<id>/) declares so that provider accounts can name
 * it — its id and the shape of an account's config. The operations on the cloud's API (create, get, start,
 * stop, delete, list) join this contract with the provider pools capability.
 */
export interface ProviderDefinition {
  id: string;
  displayName: string;
  accountConfig: z.ZodType<Record<string, unknown>>;
}

export const defineProvider = (def: ProviderDefinition): ProviderDefinition => def;

/** A secret is referenced, never stored inline: `{ secretRef: "env:HCLOUD_TOKEN" }`. */
export const secretRef = z.object({ secretRef: z.string().min(1) }).strict();
