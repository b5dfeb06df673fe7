import { z } from "zod";
import { defineProvider, secretRef } from "../../core/pools/provider/contract.ts";

/** Hetzner Cloud: an API token (by reference), an optional default location and an endpoint override. */
export const hetznerCloud = defineProvider({
  id: "hetzner-cloud",
  displayName: "Hetzner Cloud",
  accountConfig: z.object({ token: secretRef, location: z.string().min(1).optional(), endpoint: z.url().optional() }).strict(),
});
