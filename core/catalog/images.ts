import { z } from "zod";
import { forbidden } from "../../contracts/errors.ts";
import type { Principal } from "../auth/principal.ts";
import type { Sql } from "../kernel/db.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import { parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";

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
  /**
   * The same answer as an SQL expression (a jsonb ResolvedImage, or NULL), given the image id and the tenant id
   * as SQL: admission reads it with the statement it opens with, one round trip fewer per create. A resolver that
   * looks outside the database leaves it out, and is asked through `resolve`.
   */
  inStatement?(imageId: Fragment, tenantId: Fragment): Fragment;
}

const visible = (imageId: unknown, tenantId: unknown) => SQL`id = ${imageId} AND deleted_at IS NULL AND (tenant_id = ${tenantId} OR visibility = 'public')`;

/** The default resolver: the images table, the tenant's own images and public ones. */
export const tableImages: ImageResolver = {
  async resolve(tx, tenantId, imageId) {
    const [image] = await tx.query<ResolvedImage>(SQL`SELECT source AS url, sha256, format, verified FROM images WHERE ${visible(imageId, tenantId)}`);
    return image;
  },
  inStatement: (imageId, tenantId) =>
    SQL`(SELECT jsonb_build_object('url', source, 'sha256', sha256, 'format', format, 'verified', verified) FROM images WHERE ${visible(imageId, tenantId)})`,
};

/** What the deployment allows of image sources (infra/config.ts `vps.imageSources`). */
export interface ImageSourcePolicy {
  /** Plain http besides https: for a mirror on the operator's own network. */
  allowHttp: boolean;
}

// Hosts fetch images themselves, from URLs only: never file:// paths on the host. https, as the reference
// has it, unless the deployment allows http; hosts check the destination again (agent/runtimes/fetch-guard.ts).
const sourceUrl = (allowHttp: boolean) =>
  z.url({ protocol: allowHttp ? /^https?$/ : /^https$/, error: allowHttp ? "expected an http(s) URL" : "expected an https URL" }).max(2048);

const registerInput = (policy: ImageSourcePolicy) =>
  z.object({
    name: z.string().trim().min(1).max(128),
    source: sourceUrl(policy.allowHttp),
    sha256: z.string().regex(/^[0-9a-f]{64}$/, "64 lower-case hex digits"),
    format: z.enum(["raw", "qcow2", "iso"]),
    public: z.boolean().default(false),
    verified: z.boolean().optional(),
  });
const strict = registerInput({ allowHttp: false });
const lenient = registerInput({ allowHttp: true });
export type RegisterImageInput = z.input<typeof strict>;

/** An image the platform knows, as the API shows it. */
export interface Image {
  id: string;
  /** The owner; null for the operator's images. */
  tenantId: string | null;
  name: string;
  source: string;
  sha256: string;
  format: ImageFormat;
  verified: boolean;
  visibility: "public" | "private";
  createdAt: Date;
}

const COLUMNS = `id, tenant_id AS "tenantId", name, source, sha256, format, verified, visibility, created_at AS "createdAt"`;

/**
 * Tenants register private images; public ones (and the `verified` mark policies rely on) are the operator's
 * word, since every tenant would boot them.
 */
export async function registerImage(w: Write, who: Principal, raw: RegisterImageInput, policy: ImageSourcePolicy = { allowHttp: false }): Promise<Image> {
  const input = parseInput(policy.allowHttp ? lenient : strict, raw);
  if (!who.operator && (input.public || input.verified)) throw forbidden("only an operator can publish or verify an image");
  const [image] = await w.sql.query<Image>(
    `INSERT INTO images (id, tenant_id, name, source, sha256, format, verified, visibility, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING ${COLUMNS}`,
    [
      w.ids("img"),
      who.operator ? null : who.tenantId,
      input.name,
      input.source,
      input.sha256,
      input.format,
      who.operator ? (input.verified ?? true) : false,
      input.public ? "public" : "private",
      w.now,
    ],
  );
  const created = image as Image;
  w.audit({ targetId: created.id, tenantId: created.tenantId, details: { name: created.name, visibility: created.visibility } });
  return created;
}

/** The images the caller can boot: its tenant's and the public ones (operators: all). */
export async function listImages(sql: Sql, who: Principal): Promise<Image[]> {
  return who.operator
    ? sql.query<Image>(`SELECT ${COLUMNS} FROM images WHERE deleted_at IS NULL ORDER BY created_at, id`)
    : sql.query<Image>(`SELECT ${COLUMNS} FROM images WHERE deleted_at IS NULL AND (tenant_id = $1 OR visibility = 'public') ORDER BY created_at, id`, [
        who.tenantId,
      ]);
}
