import { z } from "zod";
import { forbidden } from "../../contracts/errors.ts";
import type { Tx } from "../../infra/db/prisma.ts";
import type { Principal } from "../auth/principal.ts";
import type { Sql } from "../kernel/db.ts";
import type { IdSource } from "../kernel/ids.ts";
import { parseInput } from "./shapes.ts";

export type ImageFormat = "raw" | "qcow2" | "iso";

/** What a hosted VM boots: the host downloads `url` and refuses it unless its SHA-256 is `sha256`. */
export interface ResolvedImage {
  url: string;
  sha256: string;
  format: ImageFormat;
  verified: boolean;
}

/**
 * Turns the imageId a tenant named into an image, or undefined when that tenant cannot see it. It runs in
 * the admission transaction, with that transaction's `query`.
 */
export interface ImageResolver {
  resolve(tx: Sql, tenantId: string, imageId: string): Promise<ResolvedImage | undefined>;
}

/** The default resolver: the images table, the tenant's own images and public ones. */
export const tableImages: ImageResolver = {
  async resolve(tx, tenantId, imageId) {
    const [image] = await tx.query<ResolvedImage>(
      `SELECT source AS url, sha256, format, verified FROM images
        WHERE id = $1 AND deleted_at IS NULL AND (tenant_id = $2 OR visibility = 'public')`,
      [imageId, tenantId],
    );
    return image;
  },
};

const registerInput = z.object({
  name: z.string().trim().min(1).max(128),
  // Hosts fetch images themselves: only http(s) sources they can reach, never file:// paths on the host.
  source: z.url({ protocol: /^https?$/ }).max(2048),
  sha256: z.string().regex(/^[0-9a-f]{64}$/, "64 lower-case hex digits"),
  format: z.enum(["raw", "qcow2", "iso"]),
  public: z.boolean().default(false),
  verified: z.boolean().optional(),
});
export type RegisterImageInput = z.input<typeof registerInput>;

/**
 * Tenants register private images; public ones (and the `verified` mark policies rely on) are the operator's
 * word, since every tenant would boot them.
 */
export async function registerImage(tx: Tx, ids: IdSource, who: Principal, raw: RegisterImageInput) {
  const input = parseInput(registerInput, raw);
  if (!who.operator && (input.public || input.verified)) throw forbidden("only an operator can publish or verify an image");
  return tx.image.create({
    data: {
      id: ids("img"),
      tenantId: who.operator ? null : who.tenantId,
      name: input.name,
      source: input.source,
      sha256: input.sha256,
      format: input.format,
      verified: who.operator ? (input.verified ?? true) : false,
      visibility: input.public ? "public" : "private",
    },
  });
}
