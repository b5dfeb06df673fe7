import { z } from "zod";
import { defineProvider } from "../../core/pools/provider/contract.ts";
import { connectHetzner, DEFAULT_ENDPOINT } from "./client.ts";

/** Hetzner Cloud: one project per account (its API token), an optional location for new servers, an endpoint override. */
export const hetznerCloud = defineProvider({
  id: "hetzner-cloud",
  displayName: "Hetzner Cloud",
  accountConfig: z
    .object({
      endpoint: z.url().optional().describe(`Default ${DEFAULT_ENDPOINT}`),
      location: z.string().min(1).optional(),
    })
    .strict(),
  credentials: ["token"],
  connect: (config, ctx) => connectHetzner(config, ctx),
});
