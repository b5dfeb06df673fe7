import { z } from "zod";
import { allowEntry } from "../../contracts/egress.ts";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { NetworkPolicy } from "../../contracts/host.ts";
import { type Principal, visibleTo } from "../auth/principal.ts";
import type { ImageResolver } from "../catalog/images.ts";
import { one, type Sql } from "../kernel/db.ts";
import { parseInput, resourceName } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import { requirePool } from "../pools/pools.ts";
import { requireCapability } from "../pools/registry.ts";
import { chargeQuota, releaseQuota } from "../tenancy/quota.ts";

/**
 * Sandbox templates: a tenant's recipe (hosted pool, flavor, image, env, egress policy, lifetime) and the size
 * of its warm pool. Every update bumps `version`; the warm-pool reconciler drains instances of older versions.
 * The warm targets of a tenant's templates are charged to its `sandbox_warm` quota resource, so no tenant can
 * make the operator hold unbounded idle capacity: the operator sets the limit, and without one the deployment's
 * default applies.
 */
export interface SandboxTemplate {
  id: string;
  tenantId: string;
  name: string;
  version: number;
  poolId: string;
  flavor: string;
  imageId: string;
  env: { name: string; value: string }[];
  network: NetworkPolicy;
  ttlSeconds: number;
  maxTtlSeconds: number;
  warmTarget: number;
  createdBy: string;
  createdAt: Date;
  updatedAt: Date;
}

/** A template's environment as the host spec carries it. */
export const envOf = (t: Pick<SandboxTemplate, "env">) => Object.fromEntries(t.env.map((e) => [e.name, e.value]));

export const TEMPLATE_COLUMNS = `id, tenant_id AS "tenantId", name, version, pool_id AS "poolId", flavor, image_id AS "imageId", env, network,
  ttl_seconds AS "ttlSeconds", max_ttl_seconds AS "maxTtlSeconds", warm_target AS "warmTarget",
  created_by AS "createdBy", created_at AS "createdAt", updated_at AS "updatedAt"`;

/** The quota resource the warm targets are charged to. */
export const WARM_RESOURCE = "sandbox_warm";
const MAX_TTL = 7 * 24 * 3600;

const network = z
  // Entries are stored in their canonical form (contracts/egress.ts), the one every host's ruleset accepts.
  .object({ egress: z.enum(["none", "allowlist", "all"]), allow: z.array(allowEntry).max(256).nullish() })
  .transform((n) => ({ egress: n.egress, allow: n.egress === "allowlist" ? (n.allow ?? []) : [] }));

const envVar = z.object({
  name: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, "a shell variable name"),
  value: z
    .string()
    .max(4096)
    .refine((v) => !v.includes("\u0000"), "no NUL characters"),
});

const fields = {
  poolId: z.string().min(1),
  flavor: z.string().min(1).max(64),
  imageId: z.string().min(1).max(256),
  env: z
    .array(envVar)
    .max(64)
    .refine((e) => new Set(e.map((v) => v.name)).size === e.length, "each name once"),
  network,
  ttlSeconds: z.number().int().min(1).max(MAX_TTL),
  maxTtlSeconds: z.number().int().min(1).max(MAX_TTL),
  warm: z.number().int().min(0).max(100),
};
const createInput = z.object({
  name: resourceName,
  ...fields,
  env: fields.env.nullish(),
  network: fields.network.nullish(),
  maxTtlSeconds: fields.maxTtlSeconds.nullish(),
  warm: fields.warm.nullish(),
});
const updateInput = z.object(
  Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, v.nullish()])) as {
    [K in keyof typeof fields]: z.ZodOptional<z.ZodNullable<(typeof fields)[K]>>;
  },
);

export type CreateTemplateInput = z.input<typeof createInput>;
export type UpdateTemplateInput = z.input<typeof updateInput>;

export interface TemplateDeps {
  images: ImageResolver;
  /** `sandbox_warm` limit for tenants the operator set none for. */
  defaultWarmQuota: number;
}

/** Pool, flavor and image must make a sandbox: a hosted pool (it can pause), a flavor of it, an image the tenant sees. */
async function checkTarget(sql: Sql, deps: TemplateDeps, tenantId: string, t: { poolId: string; flavor: string; imageId: string }) {
  const pool = await requirePool(sql, t.poolId);
  requireCapability(pool, "pause", "sandboxes");
  if (!(await one(sql, `SELECT 1 FROM flavors WHERE pool_id = $1 AND name = $2`, [t.poolId, t.flavor])))
    throw notFound("flavor", `${t.flavor} in pool ${t.poolId}`);
  if (!(await deps.images.resolve(sql, tenantId, t.imageId))) throw notFound("image", t.imageId);
}

/** Move the tenant's `sandbox_warm` usage by `delta`, against its limit or the deployment's default. */
async function chargeWarm(sql: Sql, tenantId: string, delta: number, defaultLimit: number): Promise<void> {
  if (delta < 0) return releaseQuota(sql, tenantId, { [WARM_RESOURCE]: -delta });
  if (delta === 0) return;
  await sql.query(`INSERT INTO quota_limits (tenant_id, resource, "limit") VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, [
    tenantId,
    WARM_RESOURCE,
    defaultLimit,
  ]);
  await chargeQuota(sql, tenantId, { [WARM_RESOURCE]: delta });
}

export async function createTemplate(w: Write, deps: TemplateDeps, who: Principal & { tenantId: string }, raw: CreateTemplateInput): Promise<SandboxTemplate> {
  const input = parseInput(createInput, raw);
  const maxTtl = input.maxTtlSeconds ?? Math.max(input.ttlSeconds, 3600);
  if (input.ttlSeconds > maxTtl) throw invalid("input.ttlSeconds: at most maxTtlSeconds", { path: "input.ttlSeconds" });
  await checkTarget(w.sql, deps, who.tenantId, input);
  if (await one(w.sql, `SELECT 1 FROM sandbox_templates WHERE tenant_id = $1 AND name = $2`, [who.tenantId, input.name]))
    throw new AppError("CONFLICT", `sandbox template ${input.name} exists`);
  const warm = input.warm ?? 0;
  await chargeWarm(w.sql, who.tenantId, warm, deps.defaultWarmQuota);
  const [row] = await w.sql.query<SandboxTemplate>(
    `INSERT INTO sandbox_templates (id, tenant_id, name, pool_id, flavor, image_id, env, network, ttl_seconds, max_ttl_seconds, warm_target,
       created_by, created_at, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9, $10, $11, $12, $13, $13) RETURNING ${TEMPLATE_COLUMNS}`,
    [
      w.ids("stpl"),
      who.tenantId,
      input.name,
      input.poolId,
      input.flavor,
      input.imageId,
      JSON.stringify(input.env ?? []),
      JSON.stringify(input.network ?? { egress: "all", allow: [] }),
      input.ttlSeconds,
      maxTtl,
      warm,
      who.identityId,
      w.now,
    ],
  );
  const t = row as SandboxTemplate;
  w.audit({ targetId: t.id, tenantId: t.tenantId, details: { name: t.name, warm } });
  if (warm > 0) w.wakeSandboxes();
  return t;
}

export async function lockTemplate(w: Write, who: Principal, id: string): Promise<SandboxTemplate> {
  const t = await one<SandboxTemplate>(w.sql, `SELECT ${TEMPLATE_COLUMNS} FROM sandbox_templates WHERE id = $1 FOR UPDATE`, [id]);
  if (!t || !visibleTo(who, t.tenantId)) throw notFound("sandbox template", id);
  return t;
}

/** Any change is a new version: sandboxes keep the version they were made from, warm instances of older ones are drained. */
export async function updateTemplate(w: Write, deps: TemplateDeps, who: Principal, id: string, raw: UpdateTemplateInput): Promise<SandboxTemplate> {
  const cur = await lockTemplate(w, who, id);
  const input = parseInput(updateInput, raw);
  const next = {
    poolId: input.poolId ?? cur.poolId,
    flavor: input.flavor ?? cur.flavor,
    imageId: input.imageId ?? cur.imageId,
    env: input.env ?? cur.env,
    network: input.network ?? cur.network,
    ttlSeconds: input.ttlSeconds ?? cur.ttlSeconds,
    maxTtlSeconds: input.maxTtlSeconds ?? cur.maxTtlSeconds,
    warm: input.warm ?? cur.warmTarget,
  };
  if (next.ttlSeconds > next.maxTtlSeconds) throw invalid("input.ttlSeconds: at most maxTtlSeconds", { path: "input.ttlSeconds" });
  await checkTarget(w.sql, deps, cur.tenantId, next);
  await chargeWarm(w.sql, cur.tenantId, next.warm - cur.warmTarget, deps.defaultWarmQuota);
  const [row] = await w.sql.query<SandboxTemplate>(
    `UPDATE sandbox_templates SET version = version + 1, pool_id = $2, flavor = $3, image_id = $4, env = $5::jsonb, network = $6::jsonb,
       ttl_seconds = $7, max_ttl_seconds = $8, warm_target = $9, updated_at = $10 WHERE id = $1 RETURNING ${TEMPLATE_COLUMNS}`,
    [id, next.poolId, next.flavor, next.imageId, JSON.stringify(next.env), JSON.stringify(next.network), next.ttlSeconds, next.maxTtlSeconds, next.warm, w.now],
  );
  const t = row as SandboxTemplate;
  w.audit({ targetId: id, tenantId: t.tenantId, details: { version: t.version } });
  w.wakeSandboxes();
  return t;
}

/** Sandboxes made from it run on to their deadline; its warm instances are drained. */
export async function deleteTemplate(w: Write, who: Principal, id: string, defaultWarmQuota: number): Promise<SandboxTemplate> {
  const cur = await lockTemplate(w, who, id);
  await chargeWarm(w.sql, cur.tenantId, -cur.warmTarget, defaultWarmQuota);
  await w.sql.query(`DELETE FROM sandbox_templates WHERE id = $1`, [id]);
  w.audit({ targetId: id, tenantId: cur.tenantId, details: { name: cur.name } });
  w.wakeSandboxes();
  return cur;
}

export async function getTemplate(sql: Sql, who: Principal, id: string): Promise<SandboxTemplate | null> {
  const t = await one<SandboxTemplate>(sql, `SELECT ${TEMPLATE_COLUMNS} FROM sandbox_templates WHERE id = $1`, [id]);
  return t && visibleTo(who, t.tenantId) ? t : null;
}

export async function listTemplates(sql: Sql, who: Principal): Promise<SandboxTemplate[]> {
  return who.operator
    ? sql.query<SandboxTemplate>(`SELECT ${TEMPLATE_COLUMNS} FROM sandbox_templates ORDER BY tenant_id, name`)
    : sql.query<SandboxTemplate>(`SELECT ${TEMPLATE_COLUMNS} FROM sandbox_templates WHERE tenant_id = $1 ORDER BY name`, [who.tenantId]);
}
