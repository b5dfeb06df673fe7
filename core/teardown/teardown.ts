import { notFound } from "../../contracts/errors.ts";
import type { Principal } from "../auth/principal.ts";
import { OPERATOR_IDENTITY } from "../auth/tokens.ts";
import { lockInstance, writeChange } from "../instances/changes.ts";
import type { Sql } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import { deleteSandbox } from "../sandboxes/sandboxes.ts";
import { deleteSandboxSnapshot } from "../sandboxes/snapshots.ts";
import { deleteTemplate } from "../sandboxes/templates.ts";
import { TENANT_COLUMNS, type Tenant } from "../tenancy/tenants.ts";

/**
 * Deleting a tenant, in two steps. `deleteTenant` (the mutation) marks it and revokes every token of its
 * identities in one write, so its credentials stop at once and its live connections are closed. `tenantDeleted`
 * (the `vps.tenants` job, and the sweep until it is done) then asks for the deletion of everything it has —
 * templates (their warm pools drain), sandboxes (with their warm claims), snapshots, instances hosted or on a
 * provider — through the same paths a tenant's own requests take, and removes the tenant's row once none of its
 * instances is left; the rows that hang off it go with it, its usage records stay for billing.
 */

/** The platform acting on its own: sees every tenant's objects. */
const PLATFORM: Principal = { identityId: OPERATOR_IDENTITY, tenantId: null, operator: true, scopes: new Set() };

export async function deleteTenant(w: Write, id: string): Promise<Tenant> {
  const [cur] = await w.sql.query<Tenant>(`SELECT ${TENANT_COLUMNS} FROM tenants WHERE id = $1 FOR UPDATE`, [id]);
  if (!cur) throw notFound("tenant", id);
  const tokens = await w.sql.query<{ id: string }>(
    `UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, $2)
      WHERE identity_id IN (SELECT id FROM identities WHERE tenant_id = $1) RETURNING id`,
    [id, w.now],
  );
  // Announced again on a repeat: a connection that missed the first message is closed now.
  for (const t of tokens) w.revoke(`tok:${t.id}`);
  w.tearDown(id);
  if (cur.deletedAt) {
    w.unchanged();
    return cur;
  }
  const [marked] = await w.sql.query<Tenant>(`UPDATE tenants SET deleted_at = $2 WHERE id = $1 RETURNING ${TENANT_COLUMNS}`, [id, w.now]);
  w.audit({ targetId: id, tenantId: id, details: { tokensRevoked: tokens.length } });
  return marked as Tenant;
}

/**
 * One pass of the teardown: ask for the deletion of whatever the tenant still has, and remove the tenant once
 * nothing of it is live. Returns true when the tenant is gone. Safe to run again, and concurrently with the
 * reconcilers finishing what earlier passes asked for.
 */
export async function tenantDeleted(w: Write, tenantId: string, defaultWarmQuota: number): Promise<boolean> {
  const [t] = await w.sql.query<{ deletedAt: Date | null }>(`SELECT deleted_at AS "deletedAt" FROM tenants WHERE id = $1 FOR UPDATE`, [tenantId]);
  if (!t) return true;
  if (!t.deletedAt) return false; // never deleted: nothing to do
  for (const { id } of await w.sql.query<{ id: string }>(`SELECT id FROM sandbox_templates WHERE tenant_id = $1 ORDER BY id`, [tenantId]))
    await deleteTemplate(w, PLATFORM, id, defaultWarmQuota);
  for (const { id } of await w.sql.query<{ id: string }>(
    `SELECT s.id FROM sandboxes s JOIN instances i ON i.id = s.instance_id WHERE s.tenant_id = $1 AND i.desired_state <> 'deleted' ORDER BY s.id`,
    [tenantId],
  ))
    await deleteSandbox(w, PLATFORM, id, "tenant-deleted");
  for (const { id } of await w.sql.query<{ id: string }>(`SELECT id FROM sandbox_snapshots WHERE tenant_id = $1 AND deleted_at IS NULL ORDER BY id`, [
    tenantId,
  ]))
    await deleteSandboxSnapshot(w, PLATFORM, id);
  // Everything else it runs; sandboxes' instances went with their sandboxes, unclaimed warm ones drain with their templates.
  for (const { id } of await w.sql.query<{ id: string }>(
    `SELECT id FROM instances WHERE tenant_id = $1 AND desired_state <> 'deleted' AND sandbox_id IS NULL AND warm_template_id IS NULL ORDER BY id`,
    [tenantId],
  )) {
    const inst = await lockInstance(w, null, id);
    if (inst.desiredState !== "deleted") await writeChange(w, inst, { desired_state: "deleted" }, "tenant:deleted");
  }
  const [left] = await w.sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM instances WHERE tenant_id = $1 AND state <> 'deleted'`, [tenantId]);
  if ((left?.n ?? 0) > 0) return false;
  await w.sql.query(`DELETE FROM tenants WHERE id = $1`, [tenantId]);
  return true;
}

/** Tenants whose teardown is not finished (for the sweep). */
export async function tenantsBeingDeleted(sql: Sql): Promise<string[]> {
  return (await sql.query<{ id: string }>(`SELECT id FROM tenants WHERE deleted_at IS NOT NULL ORDER BY deleted_at LIMIT 100`)).map((r) => r.id);
}
