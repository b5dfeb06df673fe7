import type { Tx } from "./db.ts";
import { AppError } from "./errors.ts";

export type Charge = Record<string, number>;

/**
 * Charge a tenant's quota. Each resource is one guarded UPDATE (the row lock serialises a tenant's concurrent
 * creates, and the WHERE is re-checked after the lock), in sorted order so two creates never deadlock.
 */
export async function chargeQuota(tx: Tx, tenantId: string, charge: Charge): Promise<void> {
  const resources = Object.keys(charge)
    .filter((r) => (charge[r] ?? 0) > 0)
    .sort();
  if (resources.length === 0) return;
  await tx.$executeRaw`
    INSERT INTO quota_usage (tenant_id, resource, used)
    SELECT ${tenantId}, r, 0 FROM unnest(${resources}::text[]) AS r
    ON CONFLICT DO NOTHING`;
  for (const resource of resources) {
    const amount = charge[resource] as number;
    const updated = await tx.$executeRaw`
      UPDATE quota_usage u SET used = u.used + ${amount}
       WHERE u.tenant_id = ${tenantId} AND u.resource = ${resource}
         AND u.used + ${amount} <= COALESCE(
               (SELECT l."limit" FROM quota_limits l WHERE l.tenant_id = ${tenantId} AND l.resource = ${resource}),
               9223372036854775807 - ${amount})`;
    if (updated === 0) {
      const [row] = await tx.$queryRaw<{ limit: bigint; used: bigint }[]>`
        SELECT l."limit", u.used FROM quota_limits l JOIN quota_usage u USING (tenant_id, resource)
         WHERE l.tenant_id = ${tenantId} AND l.resource = ${resource}`;
      throw new AppError("QUOTA_EXCEEDED", `quota ${resource} exceeded: limit ${row?.limit ?? "?"}, in use ${row?.used ?? "?"}, asked ${amount}`, {
        resource,
        limit: Number(row?.limit ?? 0),
        used: Number(row?.used ?? 0),
        requested: amount,
      });
    }
  }
}

/** Give a charge back. Called once per instance: the caller flips `charge_released` under the row lock. */
export async function releaseQuota(tx: Tx, tenantId: string, charge: Charge): Promise<void> {
  for (const resource of Object.keys(charge).sort()) {
    const amount = charge[resource] ?? 0;
    if (amount <= 0) continue;
    await tx.$executeRaw`
      UPDATE quota_usage SET used = used - ${amount} WHERE tenant_id = ${tenantId} AND resource = ${resource}`;
  }
}

/** Quota limits as the API speaks them (camelCase scalars + GPUs by model) ↔ rows by resource name. */
export interface QuotaInput {
  instances?: number | null;
  vcpus?: number | null;
  memoryMib?: number | null;
  diskGib?: number | null;
  gpus?: { model: string; count: number }[] | null;
}

export function quotaRows(q: QuotaInput): { resource: string; limit: number }[] {
  const rows: { resource: string; limit: number }[] = [];
  const scalar = { instances: q.instances, vcpus: q.vcpus, memory_mib: q.memoryMib, disk_gib: q.diskGib };
  for (const [resource, limit] of Object.entries(scalar)) if (limit != null) rows.push({ resource, limit });
  for (const g of q.gpus ?? []) rows.push({ resource: `gpu:${g.model}`, limit: g.count });
  return rows;
}
