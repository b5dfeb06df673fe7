import { AppError, notFound } from "../../contracts/errors.ts";
import { type Principal, visibleTo } from "../auth/principal.ts";
import { one, type Sql } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import { type CommandDeps, snapshotInstance } from "../lifecycle/snapshots.ts";
import { lockSandbox } from "./model.ts";

/**
 * Sandbox snapshots: a snapshot of the sandbox's instance (memory and disk, saved by its host as a command and
 * settled by the reconciler; the same id), plus its lineage — the sandbox it came from and the sandboxes
 * restored from it. A restore makes a new sandbox on the host that holds the snapshot. The snapshot lives with
 * its source instance's domain on that host: once the source sandbox is deleted, it can no longer be restored.
 */
export interface SandboxSnapshot {
  id: string;
  tenantId: string;
  sandboxId: string;
  instanceId: string;
  nodeId: string;
  state: "creating" | "ready" | "failed" | "deleted";
  sizeBytes: number | null;
  error: string | null;
  createdAt: Date;
}

const COLUMNS = `ss.id, ss.tenant_id AS "tenantId", ss.sandbox_id AS "sandboxId", ss.instance_id AS "instanceId", s.node_id AS "nodeId",
  CASE WHEN ss.deleted_at IS NOT NULL OR i.state = 'deleted' THEN 'deleted' ELSE s.state END AS state,
  s.size_bytes::float8 AS "sizeBytes", s.error, ss.created_at AS "createdAt"`;
const FROM = `sandbox_snapshots ss JOIN instance_snapshots s ON s.id = ss.id JOIN instances i ON i.id = ss.instance_id`;

export async function createSandboxSnapshot(w: Write, who: Principal, sandboxId: string, deps: CommandDeps): Promise<SandboxSnapshot> {
  const sbx = await lockSandbox(w, who, sandboxId);
  const snap = await snapshotInstance(w, who, sbx.instanceId, deps);
  await w.sql.query(`INSERT INTO sandbox_snapshots (id, tenant_id, sandbox_id, instance_id, created_at) VALUES ($1, $2, $3, $4, $5)`, [
    snap.id,
    sbx.tenantId,
    sbx.id,
    sbx.instanceId,
    w.now,
  ]);
  return (await one<SandboxSnapshot>(w.sql, `SELECT ${COLUMNS} FROM ${FROM} WHERE ss.id = $1`, [snap.id])) as SandboxSnapshot;
}

export async function getSandboxSnapshot(sql: Sql, who: Principal, id: string): Promise<SandboxSnapshot | null> {
  const s = await one<SandboxSnapshot>(sql, `SELECT ${COLUMNS} FROM ${FROM} WHERE ss.id = $1`, [id]);
  return s && visibleTo(who, s.tenantId) ? s : null;
}

export async function listSandboxSnapshots(sql: Sql, who: Principal, sandboxId: string | null): Promise<SandboxSnapshot[]> {
  return sql.query<SandboxSnapshot>(
    `SELECT ${COLUMNS} FROM ${FROM} WHERE ($1::text IS NULL OR ss.tenant_id = $1) AND ($2::text IS NULL OR ss.sandbox_id = $2)
      ORDER BY ss.created_at DESC, ss.id DESC LIMIT 500`,
    [who.operator ? null : who.tenantId, sandboxId],
  );
}

/** No more restores from it. Its files go with its source instance's domain. Again: nothing. */
export async function deleteSandboxSnapshot(w: Write, who: Principal, id: string): Promise<SandboxSnapshot> {
  const s = await one<SandboxSnapshot & { gone: boolean }>(
    w.sql,
    `SELECT ${COLUMNS}, ss.deleted_at IS NOT NULL AS gone FROM ${FROM} WHERE ss.id = $1 FOR UPDATE OF ss`,
    [id],
  );
  if (!s || !visibleTo(who, s.tenantId)) throw notFound("sandbox snapshot", id);
  const { gone, ...snap } = s;
  if (gone) {
    w.unchanged();
    return snap;
  }
  await w.sql.query(`UPDATE sandbox_snapshots SET deleted_at = $2 WHERE id = $1`, [id, w.now]);
  w.audit({ targetId: id, tenantId: s.tenantId, details: { sandboxId: s.sandboxId } });
  return { ...snap, state: "deleted" };
}

/** What a restore needs: a READY snapshot the caller sees, whose source instance (and so its files) still exists. */
export async function restorable(w: Write, who: Principal & { tenantId: string }, id: string) {
  const s = await one<SandboxSnapshot & { templateId: string | null }>(
    w.sql,
    `SELECT ${COLUMNS}, (SELECT template_id FROM sandboxes WHERE id = ss.sandbox_id) AS "templateId" FROM ${FROM} WHERE ss.id = $1 FOR SHARE OF ss`,
    [id],
  );
  if (!s || s.tenantId !== who.tenantId) throw notFound("sandbox snapshot", id);
  if (s.state !== "ready") throw new AppError("PRECONDITION_FAILED", `sandbox snapshot ${id} is ${s.state}, not ready`, { state: s.state });
  return s;
}
