import type { Sql } from "../kernel/db.ts";
import type { SandboxTemplate } from "./templates.ts";

/**
 * A template's warm pool as it stands: ready (paused, claimable) and warming instances of its current version,
 * sandboxes made from it and how many found a warm instance, and the median create → running of its latest 100 warm claims, read from the events.
 */
export async function warmStats(sql: Sql, t: SandboxTemplate) {
  const [row] = await sql.query<{ ready: number; warming: number; claims: number; hits: number; p50: number | null }>(
    `SELECT (SELECT count(*)::int FROM sandboxes WHERE template_id = $1) AS claims,
            (SELECT count(*)::int FROM sandboxes WHERE template_id = $1 AND warm) AS hits,
            (SELECT count(*)::int FROM instances WHERE warm_template_id = $1 AND warm_template_version = $2 AND claimed_at IS NULL
               AND desired_state = 'paused' AND state = 'paused') AS ready,
            (SELECT count(*)::int FROM instances WHERE warm_template_id = $1 AND warm_template_version = $2 AND claimed_at IS NULL
               AND desired_state = 'paused' AND state <> 'paused') AS warming,
            (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FROM (
               SELECT EXTRACT(EPOCH FROM (e.at - s.created_at)) * 1000 AS ms
                 FROM (SELECT instance_id, created_at FROM sandboxes WHERE template_id = $1 AND warm ORDER BY created_at DESC LIMIT 100) s
                 JOIN LATERAL (SELECT at FROM instance_events e WHERE e.instance_id = s.instance_id AND e.to_state = 'running' AND e.at >= s.created_at
                                ORDER BY e.id LIMIT 1) e ON true) x)::float8 AS p50`,
    [t.id, t.version],
  );
  return {
    target: t.warmTarget,
    ready: row?.ready ?? 0,
    warming: row?.warming ?? 0,
    claims: row?.claims ?? 0,
    hits: row?.hits ?? 0,
    hitRate: row?.claims ? row.hits / row.claims : null,
    claimP50Ms: row?.p50 ?? null,
  };
}
