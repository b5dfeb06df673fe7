import type { Sql } from "../kernel/db.ts";

/**
 * The accounting audit: what the books hold that no live instance explains, and what live instances should
 * hold and do not, read from the rows in one statement (one snapshot, so a write committing meanwhile cannot
 * make a consistent state look drifted). Kinds:
 *
 * - `allocation.unexplained`: an allocation no live instance holds (subject: the allocation);
 * - `lease.unexplained`: an address leased to no live instance (subject: the address);
 * - `node.counters`: a node's allocated totals differ from the sum of its allocations (subject: the node);
 * - `instance.allocation-missing`: a live hosted instance placed on a node without its allocation;
 * - `instance.lease-missing`: a live hosted instance of a pool with a range and no address leased to it;
 * - `instance.charge-unreleased`: a deleted instance whose quota charge was never given back;
 * - `allocation.unmetered`: an allocation with no open meter span (its time would go unbilled);
 * - `span.unexplained`: an open meter span whose allocation is gone (it would be billed for ever);
 * - `quota.unexplained` / `quota.missing`: a tenant's usage above / below the charges of its live instances
 *   (subject: `tenant/resource`); `sandbox_warm` is checked against the tenant's templates' warm targets.
 *
 * A pool's view (`poolId`) keeps what belongs to the pool, and the quota drift of tenants that have had
 * instances in it (a charge with no instance names no pool).
 */
export interface Drift {
  kind: string;
  subject: string;
  detail: string;
}

const AUDIT = `
WITH live AS (
  SELECT i.* FROM instances i WHERE i.state <> 'deleted'
),
found AS (
  SELECT 'allocation.unexplained' AS kind, a.id AS subject, n.pool_id, a.tenant_id,
         format('%s vCPU, %s MiB, %s GiB on node %s for instance %s, which does not hold it', a.vcpus, a.memory_mib, a.disk_gib, a.node_id, a.instance_id) AS detail
    FROM allocations a JOIN nodes n ON n.id = a.node_id
   WHERE NOT EXISTS (SELECT 1 FROM live i WHERE i.id = a.instance_id AND i.allocation_id = a.id)
  UNION ALL
  SELECT 'lease.unexplained', l.address, p.pool_id, NULL,
         format('leased to %s, which is not a live instance', l.instance_id)
    FROM ip_addresses l JOIN ip_pools p ON p.id = l.ip_pool_id
   WHERE l.instance_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM live i WHERE i.id = l.instance_id)
  UNION ALL
  SELECT 'node.counters', n.id, n.pool_id, NULL,
         format('counters %s vCPU, %s MiB, %s GiB, %s instances; allocations add up to %s, %s, %s, %s',
                n.alloc_vcpus, n.alloc_memory_mib, n.alloc_disk_gib, n.alloc_instances,
                coalesce(a.v, 0), coalesce(a.m, 0), coalesce(a.d, 0), coalesce(a.c, 0))
    FROM nodes n
    LEFT JOIN (SELECT node_id, sum(vcpus) v, sum(memory_mib) m, sum(disk_gib) d, count(*) c FROM allocations GROUP BY node_id) a ON a.node_id = n.id
   WHERE (n.alloc_vcpus, n.alloc_memory_mib, n.alloc_disk_gib, n.alloc_instances) IS DISTINCT FROM (coalesce(a.v, 0), coalesce(a.m, 0), coalesce(a.d, 0), coalesce(a.c, 0))
  UNION ALL
  SELECT 'instance.allocation-missing', i.id, i.pool_id, i.tenant_id, format('placed on node %s (%s) without an allocation there', i.node_id, i.state)
    FROM live i
   WHERE i.node_id IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.id = i.allocation_id AND a.instance_id = i.id AND a.node_id = i.node_id)
  UNION ALL
  SELECT 'instance.lease-missing', i.id, i.pool_id, i.tenant_id, format('%s in a pool with range %s, and no address leased to it', i.state, p.cidr)
    FROM live i JOIN ip_pools p ON p.pool_id = i.pool_id
   WHERE NOT EXISTS (SELECT 1 FROM ip_addresses l WHERE l.instance_id = i.id)
  UNION ALL
  SELECT 'allocation.unmetered', a.id, n.pool_id, a.tenant_id, format('held by %s with no open meter span: its time is not being counted', a.instance_id)
    FROM allocations a JOIN nodes n ON n.id = a.node_id
   WHERE NOT EXISTS (SELECT 1 FROM meter_spans s WHERE s.allocation_id = a.id AND s.ended_at IS NULL)
  UNION ALL
  SELECT 'span.unexplained', s.id, i.pool_id, s.tenant_id, format('open meter span of %s for allocation %s, which is gone', s.instance_id, s.allocation_id)
    FROM meter_spans s LEFT JOIN instances i ON i.id = s.instance_id
   WHERE s.ended_at IS NULL AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.id = s.allocation_id)
  UNION ALL
  SELECT 'instance.charge-unreleased', i.id, i.pool_id, i.tenant_id, format('deleted, still charged %s', i.charge::text)
    FROM instances i
   WHERE i.state = 'deleted' AND NOT i.charge_released AND i.charge <> '{}'::jsonb
  UNION ALL
  SELECT CASE WHEN coalesce(u.used, 0) > coalesce(c.amount, 0) THEN 'quota.unexplained' ELSE 'quota.missing' END,
         coalesce(u.tenant_id, c.tenant_id) || '/' || coalesce(u.resource, c.resource), NULL, coalesce(u.tenant_id, c.tenant_id),
         format('usage %s, live instances'' charges %s', coalesce(u.used, 0), coalesce(c.amount, 0))
    FROM (SELECT * FROM quota_usage WHERE resource <> 'sandbox_warm') u
    FULL JOIN (SELECT tenant_id, c.key AS resource, sum(c.value::bigint) AS amount
                 FROM live, jsonb_each_text(charge) c WHERE NOT charge_released GROUP BY 1, 2) c
      ON c.tenant_id = u.tenant_id AND c.resource = u.resource
   WHERE coalesce(u.used, 0) <> coalesce(c.amount, 0)
  UNION ALL
  SELECT CASE WHEN u.used > t.targets THEN 'quota.unexplained' ELSE 'quota.missing' END, u.tenant_id || '/sandbox_warm', NULL, u.tenant_id,
         format('usage %s, the templates'' warm targets %s', u.used, t.targets)
    FROM quota_usage u
    CROSS JOIN LATERAL (SELECT coalesce(sum(warm_target), 0) AS targets FROM sandbox_templates s WHERE s.tenant_id = u.tenant_id) t
   WHERE u.resource = 'sandbox_warm' AND u.used <> t.targets
)
SELECT kind, subject, detail FROM found
 WHERE $1::text IS NULL OR pool_id = $1
    OR (pool_id IS NULL AND tenant_id IN (SELECT tenant_id FROM instances WHERE pool_id = $1))
 ORDER BY kind, subject`;

export function accountingDrift(sql: Sql, poolId: string | null = null): Promise<Drift[]> {
  return sql.query<Drift>(AUDIT, [poolId]);
}
