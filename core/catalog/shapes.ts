import { z } from "zod";
import { type Charge, gpuClaim } from "../tenancy/quota.ts";

/** A flavor's shape, with bounds a real host could satisfy; anything outside is a typo, not a request. */
export const shape = z
  .object({
    vcpus: z.number().int().min(1).max(512),
    memoryMib: z
      .number()
      .int()
      .min(128)
      .max(16 * 1024 * 1024),
    diskGib: z
      .number()
      .int()
      .min(1)
      .max(64 * 1024),
    gpus: z.array(gpuClaim).max(8).default([]),
  })
  .superRefine((s, ctx) => {
    const models = s.gpus.map((g) => g.model);
    if (new Set(models).size !== models.length) ctx.addIssue({ code: "custom", message: "each GPU model once", path: ["gpus"] });
  });
export type Shape = z.infer<typeof shape>;

/** Quota resources a shape consumes. Instances count one each; GPUs count per model. */
export function chargeOf(s: Shape): Charge {
  const charge: Charge = { instances: 1, vcpus: s.vcpus, memory_mib: s.memoryMib, disk_gib: s.diskGib };
  for (const g of s.gpus) charge[`gpu:${g.model}`] = g.count;
  return charge;
}

export const gpuCount = (s: Pick<Shape, "gpus">) => s.gpus.reduce((n, g) => n + g.count, 0);
