import { type Fragment, SQL } from "../kernel/sql.ts";
import type { Write } from "../kernel/write.ts";

/**
 * Meter spans: what metering counts (core/books/usage.ts). A span is one allocation held by one owner, from the
 * write that took it to the write that gave it back, on the write's own clock, in the same transaction as the
 * allocation itself: a rollback leaves neither. Hosted placement opens one (admission, re-placement after a
 * recreate, resize), every release of an allocation closes it, and a warm claim hands the allocation from the
 * operator (the warm span) to the tenant.
 */
export interface SpanOwner {
  instanceId: string;
  /** null: the operator's (an unclaimed warm instance). */
  tenantId: string | null;
  projectId: string | null;
  warm: boolean;
}

/** What a span's INSERT binds (spanValues), each once however often the statement reads it. */
export interface SpanValues {
  id: Fragment;
  allocationId: Fragment;
  instanceId: Fragment;
  tenantId: Fragment;
  projectId: Fragment;
  warm: Fragment;
  at: Fragment;
}

/**
 * The INSERT that opens the span of an allocation just taken; its shape (and GPUs) are the allocation's.
 * `source` (alias `a`: id, vcpus, memory_mib) and `where` may say otherwise where the allocation comes from
 * (admission's statement reads it from the row it inserts, and joins its new instance, so no instance means no
 * span). `noGpus`: the caller knows the allocation holds none (admission's common path), and the statement does
 * without the lookup.
 */
export const openSpanSql = (
  v: SpanValues,
  source = SQL`allocations a`,
  where = SQL`a.id = ${v.allocationId}`,
  noGpus = false,
) => SQL`INSERT INTO meter_spans (id, allocation_id, instance_id, tenant_id, project_id, warm, vcpus, memory_mib, gpus, started_at, metered_until)
     SELECT ${v.id}, a.id, ${v.instanceId}, ${v.tenantId}, ${v.projectId}, ${v.warm}, a.vcpus, a.memory_mib,
            ${noGpus ? SQL`'[]'::jsonb` : GPUS_OF_A},
            ${v.at}::timestamptz, ${v.at}::timestamptz
       FROM ${source} WHERE ${where}`;

/** The GPUs allocation `a` holds, by model, as a span records them. */
const GPUS_OF_A = SQL`COALESCE((SELECT jsonb_agg(jsonb_build_object('model', g.model, 'count', g.n) ORDER BY g.model)
                        FROM (SELECT model, count(*)::int AS n FROM node_gpus WHERE allocation_id = a.id GROUP BY model) g), '[]'::jsonb)`;

/** What a span's INSERT binds: each value only where the statement reads it (PostgreSQL refuses a parameter it cannot type). */
export const spanValues = (w: Write, allocationId: string, owner: SpanOwner): SpanValues => ({
  id: SQL.param(w.ids("mspan")),
  allocationId: SQL.param(allocationId),
  instanceId: SQL.param(owner.instanceId),
  tenantId: SQL.param(owner.tenantId),
  projectId: SQL.param(owner.projectId),
  warm: SQL.param(owner.warm),
  at: SQL.param(w.now),
});

export async function openSpan(w: Write, allocationId: string, owner: SpanOwner): Promise<void> {
  await w.sql.query(openSpanSql(spanValues(w, allocationId, owner)));
}

/** Close the open span of an allocation about to be given back (or handed to another owner). */
export async function closeSpan(w: Write, allocationId: string): Promise<void> {
  // Never before what was already counted of it (a writer whose clock lags the one that metered it).
  await w.sql.query(`UPDATE meter_spans SET ended_at = GREATEST($2, metered_until) WHERE allocation_id = $1 AND ended_at IS NULL`, [allocationId, w.now]);
}

/**
 * Hand an allocation to its next owner (a warm claim: the operator's span ends, the tenant's begins): both in one
 * statement, the close first (the new span's insert waits on it), at the same instant as closeSpan and openSpan.
 */
export async function handOverSpan(w: Write, allocationId: string, owner: SpanOwner): Promise<void> {
  const v = spanValues(w, allocationId, owner);
  await w.sql.query(
    SQL`WITH closed AS (UPDATE meter_spans SET ended_at = GREATEST(${v.at}::timestamptz, metered_until) WHERE allocation_id = ${v.allocationId} AND ended_at IS NULL RETURNING 1)
     ${openSpanSql(v, SQL`allocations a`, SQL`a.id = ${v.allocationId} AND (SELECT count(*) FROM closed) >= 0`)}`,
  );
}

/** What spanOwner reads of an instance (the books sit below instances, so they name only these columns). */
export interface MeteredInstance {
  id: string;
  tenantId: string;
  projectId: string | null;
  /** Set for a warm-pool instance; with `claimedAt` null it is still the operator's. */
  warmTemplateId: string | null;
  claimedAt: Date | null;
}

/** Who an instance's allocation is metered to now: the operator while it is an unclaimed warm instance. */
export const spanOwner = (inst: MeteredInstance): SpanOwner => {
  const warm = inst.warmTemplateId !== null && inst.claimedAt === null;
  return { instanceId: inst.id, tenantId: warm ? null : inst.tenantId, projectId: inst.projectId, warm };
};
