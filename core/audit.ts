import type { Prisma, Tx } from "./db.ts";

export interface AuditEntry {
  actorId: string;
  tenantId?: string | null;
  action: string;
  targetId?: string | null;
  requestId?: string | null;
  details?: Prisma.InputJsonValue;
  at: Date;
}

/** One row per mutation that changed something, written in the same transaction as the change. */
export async function audit(tx: Tx, e: AuditEntry): Promise<void> {
  await tx.auditLog.create({
    data: {
      actorId: e.actorId,
      tenantId: e.tenantId ?? null,
      action: e.action,
      targetId: e.targetId ?? null,
      requestId: e.requestId ?? null,
      details: e.details ?? {},
      at: e.at,
    },
  });
}
