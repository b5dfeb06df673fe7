import type { Sql } from "../../../core/kernel/db.ts";
import type { Platform } from "../../../infra/platform.ts";

/**
 * The rows a run of a fast-path property leaves behind, as comparable values: everything of its pool and its
 * tenants (instances, their events, host commands, allocations, leases, meter spans, nodes' counters, quota
 * usage, flavors) and every audit row written since the run's world was set up. Ids become labels (`labels`),
 * times and what is random by nature (request hashes, sealed data, sequence positions) are left out.
 */
export interface RunScope {
  poolId: string;
  tenantIds: string[];
  /** audit_log rows after this id are the run's. */
  auditAfter: string;
}

const q = (sql: Sql, text: string, params: unknown[]) => sql.query<{ row: Record<string, unknown> }>(text, params).then((rs) => rs.map((r) => r.row));

export async function runRows(platform: Platform, s: RunScope): Promise<Record<string, unknown>> {
  return platform.read(async (sql) => {
    const inPool = `SELECT id FROM instances WHERE pool_id = $1`;
    const [instances, events, commands, allocations, leases, spans, nodes, quota, flavors, audit] = await Promise.all([
      q(sql, `SELECT to_jsonb(i) - 'request_hash' - 'user_data_sealed' AS row FROM instances i WHERE pool_id = $1`, [s.poolId]),
      q(
        sql,
        `SELECT jsonb_build_object('instance', instance_id, 'from', from_state, 'to', to_state, 'desired', desired_state, 'reason', reason,
                'actor', actor, 'version', version, 'tenant', tenant_id, 'project', project_id) AS row
           FROM instance_events WHERE pool_id = $1 ORDER BY instance_id, version`,
        [s.poolId],
      ),
      q(
        sql,
        `SELECT to_jsonb(c) - 'id' || jsonb_build_object('cmd', c.id, 'started', c.started_at IS NOT NULL, 'finished', c.finished_at IS NOT NULL,
                'settled', c.settled_at IS NOT NULL) AS row
           FROM host_commands c WHERE c.node_id IN (SELECT id FROM nodes WHERE pool_id = $1) ORDER BY c.created_at, c.id`,
        [s.poolId],
      ),
      q(sql, `SELECT to_jsonb(a) AS row FROM allocations a WHERE a.node_id IN (SELECT id FROM nodes WHERE pool_id = $1) ORDER BY a.instance_id`, [s.poolId]),
      q(
        sql,
        `SELECT jsonb_build_object('address', address, 'instance', instance_id) AS row FROM ip_addresses
          WHERE ip_pool_id = (SELECT id FROM ip_pools WHERE pool_id = $1) AND instance_id IS NOT NULL ORDER BY "offset"`,
        [s.poolId],
      ),
      q(sql, `SELECT to_jsonb(m) - 'id' || jsonb_build_object('open', m.ended_at IS NULL) AS row FROM meter_spans m WHERE instance_id IN (${inPool})`, [
        s.poolId,
      ]),
      q(sql, `SELECT to_jsonb(n) - 'credential_hash' - 'reported_generation' AS row FROM nodes n WHERE pool_id = $1 ORDER BY name`, [s.poolId]),
      q(sql, `SELECT to_jsonb(u) AS row FROM quota_usage u WHERE tenant_id = ANY($1::text[]) ORDER BY tenant_id, resource`, [s.tenantIds]),
      q(sql, `SELECT to_jsonb(f) - 'id' AS row FROM flavors f WHERE pool_id = $1 ORDER BY name`, [s.poolId]),
      q(sql, `SELECT to_jsonb(a) - 'id' - 'request_id' AS row FROM audit_log a WHERE id > $1::bigint ORDER BY id`, [s.auditAfter]),
    ]);
    return { instances, events, commands, allocations, leases, spans, nodes, quota, flavors, audit };
  });
}

/**
 * Labels for the ids a run's rows and answers hold that its two sides make apart: instances by owner and
 * idempotency key, and what hangs off them (allocations, commands, in creation order per instance).
 */
export async function derivedLabels(platform: Platform, poolId: string, tenantLabel: (id: string) => string): Promise<Map<string, string>> {
  const rows = await platform.read((sql) =>
    sql.query<{ id: string; tenantId: string; key: string; allocations: string[]; commands: { id: string; kind: string }[] }>(
      `SELECT i.id, i.tenant_id AS "tenantId", i.idempotency_key AS key,
              ARRAY(SELECT DISTINCT a FROM unnest(ARRAY[i.allocation_id] || ARRAY(SELECT allocation_id FROM meter_spans WHERE instance_id = i.id)
                                                   || ARRAY(SELECT id FROM allocations WHERE instance_id = i.id)) a WHERE a IS NOT NULL) AS allocations,
              COALESCE((SELECT jsonb_agg(jsonb_build_object('id', c.id, 'kind', c.kind) ORDER BY c.created_at, c.id) FROM host_commands c
                         WHERE c.instance_id = i.id), '[]') AS commands
         FROM instances i WHERE i.pool_id = $1`,
      [poolId],
    ),
  );
  const labels = new Map<string, string>();
  for (const r of rows) {
    const inst = `inst:${tenantLabel(r.tenantId)}:${r.key}`;
    labels.set(r.id, inst);
    for (const [k, a] of r.allocations.sort().entries()) labels.set(a, `alloc:${inst}${k ? `#${k}` : ""}`);
    for (const [k, c] of r.commands.entries()) labels.set(c.id, `cmd:${inst}:${c.kind}#${k}`);
  }
  return labels;
}

// Times differ between the two sides by nature; so do whatever random ids no label names.
const TIME_KEY = /(^at$|_at$|At$|Time$|^deadline$|^since$|^position$|^metered_until$|^lease_until$)/;
const ANY_ID = /\b(ten|idn|tok|prj|pool|ipp|node|gpu|alloc|flv|img|pacc|join|cmd|snap|stpl|sbx|mspan)_[a-z2-7]{8,}\b|\binst_[a-z2-7]{52}\b/g;

/** `value` with every labelled id replaced by its label (in strings too: error messages name ids) and times left out. */
export function normalise(value: unknown, labels: Map<string, string>): unknown {
  const ids = [...labels.keys()].sort((a, b) => b.length - a.length);
  const pattern = ids.length ? new RegExp(ids.map((id) => id.replace(/[^a-z0-9_]/gi, "\\$&")).join("|"), "g") : null;
  const text = (s: string) => {
    const exact = labels.get(s);
    if (exact) return exact;
    const labelled = pattern ? s.replace(pattern, (id) => labels.get(id) as string) : s;
    return labelled.replace(ANY_ID, (id) => `${id.slice(0, id.indexOf("_"))}_?`);
  };
  const walk = (v: unknown): unknown => {
    if (typeof v === "string") return text(v);
    if (Array.isArray(v)) return v.map(walk);
    if (v instanceof Date) return "<time>";
    if (v && typeof v === "object")
      return Object.fromEntries(
        Object.entries(v)
          .filter(([k]) => !TIME_KEY.test(k))
          .map(([k, x]) => [k, walk(x)]),
      );
    return v;
  };
  return walk(value);
}

/** Rows keyed by a labelled column and sorted by it, so that the order ids happen to sort in does not matter. */
export function byLabel(rows: unknown[], key: string): unknown[] {
  return [...(rows as Record<string, unknown>[])].sort((a, b) => String(a[key]).localeCompare(String(b[key])));
}
