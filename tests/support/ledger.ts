import { meterUsage, WINDOW_MS } from "../../core/books/usage.ts";
import { randomIds } from "../../core/kernel/ids.ts";
import { Write } from "../../core/kernel/write.ts";
import type { Platform } from "../../infra/platform.ts";

type WithDb = Pick<Platform, "db">;

/**
 * Everything admission can touch, counted. A refused request must leave it exactly as it was; after any
 * sequence, usage must equal the charges of live instances and node counters the sum of their allocations.
 */
export async function ledger(platform: WithDb) {
  const q = <T>(sql: string) => platform.db.prisma.$queryRawUnsafe<T[]>(sql);
  const [counts] = await q<Record<string, bigint>>(`SELECT
      (SELECT count(*) FROM instances) AS instances, (SELECT count(*) FROM allocations) AS allocations,
      (SELECT count(*) FROM ip_addresses WHERE instance_id IS NOT NULL) AS leases, (SELECT count(*) FROM instance_events) AS events,
      (SELECT count(*) FROM audit_log) AS audit, (SELECT count(*) FROM node_gpus WHERE allocation_id IS NOT NULL) AS gpus_held`);
  const usage = await q<{ tenant_id: string; resource: string; used: bigint }>(
    "SELECT tenant_id, resource, used FROM quota_usage WHERE used <> 0 ORDER BY 1, 2",
  );
  const nodes = await q<{ id: string; v: number; m: bigint; d: bigint; n: number }>(
    "SELECT id, alloc_vcpus AS v, alloc_memory_mib AS m, alloc_disk_gib AS d, alloc_instances AS n FROM nodes ORDER BY id",
  );
  return JSON.parse(JSON.stringify({ counts, usage, nodes }, (_k, v) => (typeof v === "bigint" ? Number(v) : v)));
}

/** The invariants (docs/architecture.md), checked against the rows themselves. Returns the violations found. */
export async function invariantViolations(platform: WithDb): Promise<string[]> {
  const q = <T>(sql: string) => platform.db.prisma.$queryRawUnsafe<T[]>(sql);
  const out: string[] = [];
  const push = (label: string, rows: unknown[]) => {
    if (rows.length) out.push(`${label}: ${JSON.stringify(rows, (_k, v) => (typeof v === "bigint" ? Number(v) : v))}`);
  };
  push(
    "node counters differ from the sum of their allocations",
    await q(`SELECT n.id FROM nodes n LEFT JOIN (SELECT node_id, sum(vcpus) v, sum(memory_mib) m, sum(disk_gib) d, count(*) c FROM allocations GROUP BY node_id) a ON a.node_id = n.id
             WHERE n.alloc_vcpus <> coalesce(a.v, 0) OR n.alloc_memory_mib <> coalesce(a.m, 0) OR n.alloc_disk_gib <> coalesce(a.d, 0) OR n.alloc_instances <> coalesce(a.c, 0)`),
  );
  push(
    "allocation beyond capacity",
    await q("SELECT id FROM nodes WHERE alloc_vcpus > cap_vcpus OR alloc_memory_mib > cap_memory_mib OR alloc_disk_gib > cap_disk_gib"),
  );
  push(
    "deleted instance still holds something",
    await q(
      `SELECT i.id FROM instances i WHERE i.state = 'deleted' AND (i.allocation_id IS NOT NULL OR NOT i.charge_released OR EXISTS (SELECT 1 FROM ip_addresses l WHERE l.instance_id = i.id) OR EXISTS (SELECT 1 FROM allocations a WHERE a.instance_id = i.id))`,
    ),
  );
  push(
    "allocation without a live instance",
    await q(`SELECT a.id FROM allocations a LEFT JOIN instances i ON i.id = a.instance_id AND i.allocation_id = a.id WHERE i.id IS NULL`),
  );
  push(
    "lease without a live instance",
    await q(
      `SELECT l.address FROM ip_addresses l LEFT JOIN instances i ON i.id = l.instance_id AND i.state <> 'deleted' WHERE l.instance_id IS NOT NULL AND i.id IS NULL`,
    ),
  );
  push(
    "allocation without exactly one open meter span",
    await q(`SELECT a.id FROM allocations a WHERE (SELECT count(*) FROM meter_spans s WHERE s.allocation_id = a.id AND s.ended_at IS NULL) <> 1`),
  );
  push(
    "open meter span without its allocation",
    await q(`SELECT s.id FROM meter_spans s WHERE s.ended_at IS NULL AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.id = s.allocation_id)`),
  );
  push(
    "GPU held by a missing allocation",
    await q(`SELECT g.id FROM node_gpus g LEFT JOIN allocations a ON a.id = g.allocation_id WHERE g.allocation_id IS NOT NULL AND a.id IS NULL`),
  );
  push(
    "quota usage differs from live charges",
    await q(`WITH charges AS (SELECT tenant_id, c.key AS resource, sum(c.value::bigint) AS amount FROM instances, jsonb_each_text(charge) c WHERE NOT charge_released GROUP BY 1, 2)
             SELECT coalesce(u.tenant_id, c.tenant_id) AS tenant, coalesce(u.resource, c.resource) AS resource, u.used, c.amount
               FROM (SELECT * FROM quota_usage WHERE resource <> 'sandbox_warm') u FULL JOIN charges c ON c.tenant_id = u.tenant_id AND c.resource = u.resource
              WHERE coalesce(u.used, 0) <> coalesce(c.amount, 0)`),
  );
  push(
    "sandbox_warm usage differs from the tenant's templates' warm targets",
    await q(`SELECT u.tenant_id, u.used, coalesce((SELECT sum(warm_target) FROM sandbox_templates t WHERE t.tenant_id = u.tenant_id), 0) AS targets
               FROM quota_usage u WHERE u.resource = 'sandbox_warm'
                AND u.used <> coalesce((SELECT sum(warm_target) FROM sandbox_templates t WHERE t.tenant_id = u.tenant_id), 0)`),
  );
  push(
    "versions without exactly one event each",
    await q(
      `SELECT i.id, i.version, count(e.id) FROM instances i LEFT JOIN instance_events e ON e.instance_id = i.id GROUP BY i.id, i.version HAVING count(e.id) <> i.version OR count(DISTINCT e.version) <> i.version OR max(e.version) <> i.version`,
    ),
  );
  return out;
}

/**
 * Metering against its own ground truth, once every allocation is given back: what the meter spans held (each
 * span from start to end, at its shape) must be exactly what closing every window records — nothing skipped,
 * nothing counted twice — with no two spans of an instance overlapping. The windows are closed here on a clock
 * past the last span's end, by two writers at once (they must take turns); none may have closed before.
 */
export async function meteringViolations(platform: WithDb): Promise<string[]> {
  const q = <T>(sql: string) => platform.db.prisma.$queryRawUnsafe<T[]>(sql);
  const out: string[] = [];
  const push = (label: string, rows: unknown[]) => {
    if (rows.length) out.push(`${label}: ${JSON.stringify(rows, (_k, v) => (typeof v === "bigint" ? Number(v) : v))}`);
  };
  push("windows closed before the check (the run outlasted a window)", await q(`SELECT window_start FROM usage_windows`));
  push("spans still open", await q(`SELECT id, instance_id FROM meter_spans WHERE ended_at IS NULL`));
  push(
    "spans of one instance that overlap",
    await q(`SELECT a.instance_id, a.id, b.id AS other FROM meter_spans a JOIN meter_spans b
               ON a.instance_id = b.instance_id AND a.id < b.id AND a.started_at < b.ended_at AND b.started_at < a.ended_at`),
  );
  if (out.length) return out;
  const truth = await q<{ instance_id: string; meter: string; amount: bigint }>(
    `WITH s AS (SELECT *, (extract(epoch FROM (ended_at - started_at)) * 1000)::bigint AS ms FROM meter_spans)
     SELECT instance_id, meter, sum(amount)::bigint AS amount FROM (
       SELECT instance_id, 'vps.vcpu.hours' AS meter, vcpus::bigint * ms AS amount FROM s WHERE NOT warm
       UNION ALL SELECT instance_id, 'vps.memory.gib.hours', memory_mib::bigint * ms FROM s WHERE NOT warm
       UNION ALL SELECT s.instance_id, 'gpu.' || (g->>'model') || '.hours', (g->>'count')::bigint * s.ms FROM s, jsonb_array_elements(s.gpus) g WHERE NOT s.warm
       UNION ALL SELECT instance_id, 'vps.sandbox.warm', ms FROM s WHERE warm) x
     GROUP BY 1, 2 HAVING sum(amount) > 0 ORDER BY 1, 2`,
  );
  const [last] = await q<{ at: Date | null }>(`SELECT max(ended_at) AS at FROM meter_spans`);
  const now = new Date((last?.at ?? new Date()).getTime() + 3 * WINDOW_MS);
  const close = () => meterUsage((fn) => platform.db.transaction((sql) => fn(new Write(sql, randomIds, now, { actor: "usage" }))));
  await Promise.all([close(), close()]);
  const recorded = await q<{ instance_id: string; meter: string; amount: bigint }>(
    `SELECT instance_id, meter, sum(amount)::bigint AS amount FROM usage_records GROUP BY 1, 2 ORDER BY 1, 2`,
  );
  const key = (r: { instance_id: string; meter: string; amount: bigint }) => `${r.instance_id} ${r.meter} ${r.amount}`;
  const want = new Set(truth.map(key));
  const got = new Set(recorded.map(key));
  push(
    "held but not recorded (a gap)",
    [...want].filter((k) => !got.has(k)),
  );
  push(
    "recorded but not held (counted twice, or from nothing)",
    [...got].filter((k) => !want.has(k)),
  );
  push("spans left uncounted", await q(`SELECT id FROM meter_spans`));
  return out;
}
