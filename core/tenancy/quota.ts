import { z } from "zod";
import { AppError } from "../../contracts/errors.ts";
import type { Sql } from "../kernel/db.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import { parseInput } from "../kernel/validation.ts";

export type Charge = Record<string, number>;

/** GPUs are whole and named by model, e.g. `nvidia-l40s`; quota counts them by model (`gpu:<model>`). */
export const gpuModel = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, "GPU models are lower-case letters, digits, . _ -");
export const gpuClaim = z.object({ model: gpuModel, count: z.number().int().min(1).max(16) });
export type GpuClaim = z.infer<typeof gpuClaim>;

/** The resources every tenant has a usage row for from its creation; GPU models get theirs on first use. */
export const SCALAR_RESOURCES = ["disk_gib", "instances", "memory_mib", "vcpus"] as const;

export async function ensureUsageRows(sql: Sql, tenantId: string, resources: readonly string[]): Promise<void> {
  await sql.query(`INSERT INTO quota_usage (tenant_id, resource, used) SELECT $1, r, 0 FROM unnest($2::text[]) AS r ON CONFLICT DO NOTHING`, [
    tenantId,
    resources,
  ]);
}

/** The rows a charge raises, in resource order (the order a tenant's quota rows are locked in). */
export function chargeRows(charge: Charge): { resources: string[]; amounts: number[] } {
  const resources = Object.keys(charge)
    .filter((r) => (charge[r] ?? 0) > 0)
    .sort();
  return { resources, amounts: resources.map((r) => charge[r] as number) };
}

/** GPU models get their usage row on first use; the scalar resources have theirs already. */
export const needsUsageRows = (resources: readonly string[]) => resources.some((r) => !(SCALAR_RESOURCES as readonly string[]).includes(r));

/**
 * The guarded charge (the `charge_quota` function, migration `charge_quota`): a row is only raised while it stays
 * within its limit, and the row locks serialise a tenant's concurrent creates (the WHERE is re-checked after a
 * lock wait). Returns the resources it raised; fewer than asked means a limit was hit. Nothing is charged where
 * `guard` is false.
 */
export const chargeSql = (tenantId: string, resources: readonly string[], amounts: readonly number[], guard: Fragment = SQL`true`) =>
  SQL`SELECT c AS resource FROM charge_quota(${tenantId}::text, ${resources}::text[], ${amounts}::bigint[], ${guard}) c`;

/**
 * Charge a tenant's quota in one guarded UPDATE (chargeSql). Fewer rows updated than asked means a limit was
 * hit: the caller's transaction is aborted by the error.
 */
export async function chargeQuota(sql: Sql, tenantId: string, charge: Charge): Promise<void> {
  const { resources, amounts } = chargeRows(charge);
  if (resources.length === 0) return;
  if (needsUsageRows(resources)) await ensureUsageRows(sql, tenantId, resources);
  const raised = await sql.query<{ resource: string }>(chargeSql(tenantId, resources, amounts));
  if (raised.length < resources.length)
    throw await quotaRefusal(
      sql,
      tenantId,
      charge,
      raised.map((r) => r.resource),
    );
}

/** Why a charge that raised only `raised` of its rows was refused: the first resource over its limit. */
export async function quotaRefusal(sql: Sql, tenantId: string, charge: Charge, raised: readonly string[]): Promise<Error> {
  const { resources } = chargeRows(charge);
  const over = resources.find((r) => !raised.includes(r)) as string;
  const [row] = await sql.query<{ limit: string | null; used: string | null }>(
    `SELECT (SELECT "limit"::text FROM quota_limits WHERE tenant_id = $1 AND resource = $2) AS "limit",
            (SELECT used::text FROM quota_usage WHERE tenant_id = $1 AND resource = $2) AS used`,
    [tenantId, over],
  );
  if (row?.limit == null) return new Error(`quota usage row for ${over} of tenant ${tenantId} is missing`);
  const asked = charge[over] as number;
  return new AppError("QUOTA_EXCEEDED", `quota ${over} exceeded: limit ${row.limit}, in use ${row.used}, asked ${asked}`, {
    resource: over,
    limit: Number(row.limit),
    used: Number(row.used),
    requested: asked,
  });
}

/** Give a charge back. Called once per instance: the caller flips `charge_released` under the row lock. */
export async function releaseQuota(sql: Sql, tenantId: string, charge: Charge): Promise<void> {
  const { resources, amounts } = chargeRows(charge);
  if (resources.length === 0) return;
  await sql.query(
    `UPDATE quota_usage u SET used = u.used - w.amount FROM unnest($2::text[], $3::bigint[]) AS w(resource, amount)
      WHERE u.tenant_id = $1 AND u.resource = w.resource`,
    [tenantId, resources, amounts],
  );
}

/** Quota limits as the API speaks them (camelCase scalars + GPUs by model) ↔ rows by resource name. */
export interface QuotaInput {
  instances?: number | null;
  vcpus?: number | null;
  memoryMib?: number | null;
  diskGib?: number | null;
  /** Warm sandbox instances over all the tenant's templates (their warm targets added up). */
  sandboxWarm?: number | null;
  gpus?: { model: string; count: number }[] | null;
}

function quotaRows(q: QuotaInput): { resource: string; limit: number }[] {
  const rows: { resource: string; limit: number }[] = [];
  const scalar = { instances: q.instances, vcpus: q.vcpus, memory_mib: q.memoryMib, disk_gib: q.diskGib, sandbox_warm: q.sandboxWarm };
  for (const [resource, limit] of Object.entries(scalar)) if (limit != null) rows.push({ resource, limit });
  for (const g of q.gpus ?? []) rows.push({ resource: `gpu:${g.model}`, limit: g.count });
  return rows;
}

const limit = z.number().int().min(0).max(1_000_000_000).nullish();
export const quotaInput = z.object({
  instances: limit,
  vcpus: limit,
  memoryMib: limit,
  diskGib: limit,
  sandboxWarm: limit,
  gpus: z.array(gpuClaim.extend({ count: z.number().int().min(0).max(1_000_000) })).nullish(),
});

/** Replace a tenant's limits. Lowering a limit below what is in use is allowed: it only stops new charges. */
export async function setQuotaLimits(sql: Sql, tenantId: string, raw: QuotaInput): Promise<void> {
  const rows = quotaRows(parseInput(quotaInput, raw, "input.quota"));
  await sql.query(`DELETE FROM quota_limits WHERE tenant_id = $1`, [tenantId]);
  if (rows.length)
    await sql.query(`INSERT INTO quota_limits (tenant_id, resource, "limit") SELECT $1, r, l FROM unnest($2::text[], $3::bigint[]) AS t(r, l)`, [
      tenantId,
      rows.map((r) => r.resource),
      rows.map((r) => r.limit),
    ]);
}

export interface QuotaItem {
  resource: string;
  /** null: unlimited. */
  limit: number | null;
  used: number;
}

/** Limits and usage by resource. */
export async function quotaOf(sql: Sql, tenantId: string): Promise<QuotaItem[]> {
  return sql.query<QuotaItem>(
    `SELECT COALESCE(l.resource, u.resource) AS resource, l."limit"::float8 AS "limit", COALESCE(u.used, 0)::float8 AS used
       FROM quota_limits l FULL JOIN quota_usage u ON u.tenant_id = l.tenant_id AND u.resource = l.resource
      WHERE COALESCE(l.tenant_id, u.tenant_id) = $1 ORDER BY 1`,
    [tenantId],
  );
}
