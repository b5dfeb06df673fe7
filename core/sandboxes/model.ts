import { notFound } from "../../contracts/errors.ts";
import { type Principal, visibleTo } from "../auth/principal.ts";
import { one } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";

/** A sandbox row, as the domain reads it: one instance with a deadline (core/sandboxes/sandboxes.ts). */
export interface Sandbox {
  id: string;
  tenantId: string;
  ownerIdentityId: string;
  templateId: string | null;
  templateVersion: number | null;
  fromSnapshotId: string | null;
  instanceId: string;
  idempotencyKey: string;
  requestHash: string;
  ttlSeconds: number;
  maxTtlSeconds: number;
  expiresAt: Date;
  warm: boolean;
  createdAt: Date;
}

export const SANDBOX_COLUMNS = `s.id, s.tenant_id AS "tenantId", s.owner_identity_id AS "ownerIdentityId", s.template_id AS "templateId",
  s.template_version AS "templateVersion", s.from_snapshot_id AS "fromSnapshotId", s.instance_id AS "instanceId",
  s.idempotency_key AS "idempotencyKey", s.request_hash AS "requestHash", s.ttl_seconds AS "ttlSeconds",
  s.max_ttl_seconds AS "maxTtlSeconds", s.expires_at AS "expiresAt", s.warm, s.created_at AS "createdAt"`;

/** Lock a sandbox for the rest of the transaction, as the caller may see it. */
export async function lockSandbox(w: Write, who: Principal, id: string): Promise<Sandbox> {
  const s = await one<Sandbox>(w.sql, `SELECT ${SANDBOX_COLUMNS} FROM sandboxes s WHERE s.id = $1 FOR UPDATE`, [id]);
  if (!s || !visibleTo(who, s.tenantId)) throw notFound("sandbox", id);
  return s;
}
