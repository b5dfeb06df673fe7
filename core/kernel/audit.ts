import type { Tx } from "../../infra/db/prisma.ts";
import { prismaSql, type Sql } from "./db.ts";

export interface AuditEntry {
  actorId: string;
  tenantId?: string | null;
  action: string;
  targetId?: string | null;
  requestId?: string | null;
  details?: unknown;
  at: Date;
}

/** One row per mutation that changed something, written in the same transaction as the change. */
export async function audit(db: Sql | Tx, e: AuditEntry): Promise<void> {
  const sql = "query" in db ? db : prismaSql(db);
  await sql.query(`INSERT INTO audit_log (actor_id, tenant_id, action, target_id, request_id, details, at) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)`, [
    e.actorId,
    e.tenantId ?? null,
    e.action,
    e.targetId ?? null,
    e.requestId ?? null,
    JSON.stringify(e.details ?? {}),
    e.at,
  ]);
}
