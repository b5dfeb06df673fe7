import { notFound } from "../../contracts/errors.ts";
import type { Principal } from "../auth/principal.ts";
import type { Sql } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";

/**
 * Metering (the `vps.usage` job): meter spans (./spans.ts) are counted into usage records window by window.
 * Windows are 5 minutes, closed in order, each exactly once: its marker row and its records commit together,
 * and one advisory lock makes two workers take turns (the second finds the window done). Each span keeps
 * `metered_until`, moved forward in the same transaction, so every millisecond a span held its allocation is
 * counted once: a span that turns up late (opened by a write whose clock lags, or that committed after its
 * window closed) is counted whole in the next window, and a span is never closed before what was counted of it.
 */
export const WINDOW_MS = 5 * 60_000;
/** A window closes this long after its end, so writes that began inside it have committed. */
export const CLOSE_AFTER_MS = 60_000;
/** Windows closed per run at most (after a long outage the next runs catch up). */
const MAX_WINDOWS_PER_RUN = 288;

export const METERS = {
  "vps.vcpu.hours": { unit: "vCPU-hours", perHour: 3_600_000 },
  "vps.memory.gib.hours": { unit: "GiB-hours", perHour: 3_600_000 * 1024 },
  "vps.sandbox.warm": { unit: "instance-hours", perHour: 3_600_000 },
} as const;
const GPU_METER = { unit: "GPU-hours", perHour: 3_600_000 };
export const meterOf = (meter: string) => (meter in METERS ? METERS[meter as keyof typeof METERS] : GPU_METER);

const floorWindow = (ms: number) => Math.floor(ms / WINDOW_MS) * WINDOW_MS;

/** The next window to close, or null when the next one is still open (or nothing was ever metered). */
async function nextWindow(sql: Sql, now: Date): Promise<Date | null> {
  const [row] = await sql.query<{ last: Date | null; first: Date | null }>(
    `SELECT (SELECT max(window_start) FROM usage_windows) AS last, (SELECT min(metered_until) FROM meter_spans) AS first`,
  );
  const start = row?.last ? row.last.getTime() + WINDOW_MS : row?.first ? floorWindow(row.first.getTime()) : null;
  if (start === null || start + WINDOW_MS + CLOSE_AFTER_MS > now.getTime()) return null;
  return new Date(start);
}

/**
 * Close one window: count what every span held up to its end into records of that window. Returns false when
 * there was none to close (or another worker closed it first).
 */
export async function closeWindow(w: Write): Promise<boolean> {
  await w.sql.query(`SELECT pg_advisory_xact_lock(hashtextextended('vps.usage', 0))`);
  const start = await nextWindow(w.sql, w.now);
  if (!start) return false;
  const end = new Date(start.getTime() + WINDOW_MS);
  await w.sql.query(
    `WITH counted AS (
       SELECT s.*, (extract(epoch FROM (least(coalesce(s.ended_at, $2), $2) - s.metered_until)) * 1000)::bigint AS ms
         FROM meter_spans s WHERE s.metered_until < $2 AND least(coalesce(s.ended_at, $2), $2) > s.metered_until),
     amounts AS (
       SELECT instance_id, tenant_id, project_id, 'vps.vcpu.hours' AS meter, vcpus::bigint * ms AS amount FROM counted WHERE NOT warm
       UNION ALL SELECT instance_id, tenant_id, project_id, 'vps.memory.gib.hours', memory_mib * ms FROM counted WHERE NOT warm
       UNION ALL SELECT c.instance_id, c.tenant_id, c.project_id, 'gpu.' || (g->>'model') || '.hours', (g->>'count')::bigint * c.ms
                   FROM counted c, jsonb_array_elements(c.gpus) g WHERE NOT c.warm
       UNION ALL SELECT instance_id, tenant_id, project_id, 'vps.sandbox.warm', ms FROM counted WHERE warm),
     recorded AS (
       INSERT INTO usage_records (window_start, meter, tenant_id, project_id, instance_id, amount)
       SELECT $1, meter, tenant_id, project_id, instance_id, sum(amount) FROM amounts GROUP BY meter, tenant_id, project_id, instance_id
       HAVING sum(amount) > 0)
     UPDATE meter_spans s SET metered_until = least(coalesce(s.ended_at, $2), $2) FROM counted c WHERE s.id = c.id`,
    [start, end],
  );
  // Spans closed and counted to their end are done with; what is counted lives on in the records.
  await w.sql.query(`DELETE FROM meter_spans WHERE ended_at IS NOT NULL AND metered_until >= ended_at`);
  await w.sql.query(`INSERT INTO usage_windows (window_start, metered_at) VALUES ($1, $2)`, [start, w.now]);
  return true;
}

/** Close every window that is due (up to a bound per run). Returns how many were closed. */
export async function meterUsage(write: (fn: (w: Write) => Promise<boolean>) => Promise<boolean>): Promise<number> {
  let closed = 0;
  while (closed < MAX_WINDOWS_PER_RUN && (await write(closeWindow))) closed++;
  return closed;
}

/** `hour` and `day` split the rows by the UTC hour or day their windows start in (the row's `start`). */
export type UsageGroup = "tenant" | "project" | "instance" | "meter" | "hour" | "day";

export interface UsageRow {
  /** The start of the hour or day the row sums, when grouped by one; else null. */
  start: Date | null;
  meter: string;
  tenantId: string | null;
  projectId: string | null;
  instanceId: string | null;
  quantity: number;
  unit: string;
}

/**
 * Usage of the windows that start in [from, to), summed per meter and the chosen groups (the meter is always
 * one: amounts of different meters do not add up). Tenants read their own; operators any tenant's, or all
 * (warm pools' rows are the operator's: no tenant).
 */
export async function usage(
  sql: Sql,
  who: Principal,
  q: { from: Date; to: Date; tenantId?: string | null; groupBy?: readonly UsageGroup[] | null },
): Promise<UsageRow[]> {
  let tenantId = q.tenantId ?? null;
  if (!who.operator) {
    if (tenantId && tenantId !== who.tenantId) throw notFound("tenant", tenantId);
    tenantId = who.tenantId;
  }
  const groups = new Set<UsageGroup>(q.groupBy?.length ? q.groupBy : ["tenant", "meter"]);
  const col = (g: UsageGroup, name: string, as: string) => (groups.has(g) ? `${name} AS "${as}"` : `NULL::text AS "${as}"`);
  // A day is finer than nothing and coarser than an hour: asked for both, the hour wins.
  const step = groups.has("hour") ? "hour" : groups.has("day") ? "day" : null;
  const start = step ? `date_trunc('${step}', window_start, 'UTC')` : "NULL::timestamptz";
  const by = [...(step ? ["1"] : []), "meter", ...(["tenant", "project", "instance"] as const).filter((g) => groups.has(g)).map((g) => `${g}_id`)];
  const rows = await sql.query<{
    start: Date | null;
    meter: string;
    tenantId: string | null;
    projectId: string | null;
    instanceId: string | null;
    amount: string;
  }>(
    `SELECT ${start} AS start, meter, ${col("tenant", "tenant_id", "tenantId")}, ${col("project", "project_id", "projectId")}, ${col("instance", "instance_id", "instanceId")},
            sum(amount)::text AS amount
       FROM usage_records
      WHERE window_start >= $1 AND window_start < $2 AND ($3::text IS NULL OR tenant_id = $3) AND ($4 OR tenant_id IS NOT NULL)
      GROUP BY ${by.join(", ")} ORDER BY ${by.join(", ")}`,
    [q.from, q.to, tenantId, who.operator],
  );
  return rows.map((r) => {
    const m = meterOf(r.meter);
    return {
      start: r.start ? new Date(r.start) : null,
      meter: r.meter,
      tenantId: r.tenantId,
      projectId: r.projectId,
      instanceId: r.instanceId,
      quantity: Number(r.amount) / m.perHour,
      unit: m.unit,
    };
  });
}

/** The same rows as CSV (RFC 4180), for billing systems that take files. */
export function usageCsv(rows: readonly UsageRow[]): string {
  const cell = (v: string | number | null) => {
    const s = v === null ? "" : String(v);
    return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  const lines = rows.map((r) => [r.meter, r.tenantId, r.projectId, r.instanceId, r.quantity, r.unit, r.start?.toISOString() ?? null].map(cell).join(","));
  return `${["meter", "tenantId", "projectId", "instanceId", "quantity", "unit", "start"].join(",")}\r\n${lines.map((l) => `${l}\r\n`).join("")}`;
}
