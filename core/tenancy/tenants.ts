import { z } from "zod";
import { AppError, notFound } from "../../contracts/errors.ts";
import { one, type Sql } from "../kernel/db.ts";
import { displayName, parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import { ensureUsageRows, type QuotaInput, quotaInput, SCALAR_RESOURCES, setQuotaLimits } from "./quota.ts";

/** A tenant: who instances, quota and usage belong to. */
export interface Tenant {
  id: string;
  name: string;
  createdAt: Date;
  /** Set by deleteTenant: the tenant is being torn down (its row goes once nothing of it is left). */
  deletedAt: Date | null;
}

export const TENANT_COLUMNS = `id, name, created_at AS "createdAt", deleted_at AS "deletedAt"`;
const COLUMNS = TENANT_COLUMNS;

export async function createTenant(w: Write, raw: { name: string; quota?: QuotaInput | null }): Promise<Tenant> {
  const input = parseInput(z.object({ name: displayName, quota: quotaInput.nullish() }), raw);
  if (await one(w.sql, `SELECT 1 FROM tenants WHERE name = $1`, [input.name])) throw new AppError("CONFLICT", `tenant ${input.name} exists`);
  const [tenant] = await w.sql.query<Tenant>(`INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3) RETURNING ${COLUMNS}`, [
    w.ids("ten"),
    input.name,
    w.now,
  ]);
  const created = tenant as Tenant;
  await ensureUsageRows(w.sql, created.id, SCALAR_RESOURCES);
  await setQuotaLimits(w.sql, created.id, input.quota ?? {});
  w.audit({ targetId: created.id, tenantId: created.id, details: { name: created.name, quota: input.quota ?? {} } });
  return created;
}

export async function setTenantQuota(w: Write, tenantId: string, quota: QuotaInput): Promise<Tenant> {
  const tenant = await one<Tenant>(w.sql, `SELECT ${COLUMNS} FROM tenants WHERE id = $1 FOR UPDATE`, [tenantId]);
  if (!tenant) throw notFound("tenant", tenantId);
  await setQuotaLimits(w.sql, tenant.id, quota);
  w.audit({ targetId: tenant.id, tenantId: tenant.id, details: { quota } });
  return tenant;
}

export async function listTenants(sql: Sql): Promise<Tenant[]> {
  return sql.query<Tenant>(`SELECT ${COLUMNS} FROM tenants ORDER BY created_at, id`);
}

export async function getTenant(sql: Sql, id: string): Promise<Tenant | undefined> {
  return one<Tenant>(sql, `SELECT ${COLUMNS} FROM tenants WHERE id = $1`, [id]);
}
