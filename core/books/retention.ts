import type { Sql } from "../kernel/db.ts";

/** How long each kind of history is kept, and how many rows one delete takes. */
export interface RetentionPolicy {
  eventsDays: number;
  auditDays: number;
  commandsDays: number;
  batch: number;
}

export interface Pruned {
  events: number;
  audit: number;
  commands: number;
}

const DAY_MS = 86_400_000;

/**
 * Delete history older than the policy keeps: instance events, audit rows, and host commands settled that long
 * ago (with their exec output). Usage records are the bill and stay. Each batch is one short statement on its
 * own (no transaction spans batches), oldest rows first, so writers never queue behind the pruning for long and
 * a run that dies has done whole batches. Events move the retention horizon in the same statement that deletes
 * them: a cursor below it has lost events and is refused (`eventsHorizon`).
 */
export async function pruneHistory(sql: Sql, now: Date, policy: RetentionPolicy): Promise<Pruned> {
  const before = (days: number) => new Date(now.getTime() - days * DAY_MS);
  const pruned: Pruned = { events: 0, audit: 0, commands: 0 };
  const drain = async (kind: keyof Pruned, text: string, params: unknown[]) => {
    for (;;) {
      const [r] = await sql.query<{ n: number }>(text, params);
      pruned[kind] += r?.n ?? 0;
      if ((r?.n ?? 0) < policy.batch) return;
    }
  };
  // Positioned events only: one without a position yet is a writer's, still on its way to subscribers.
  await drain(
    "events",
    `WITH gone AS (
       DELETE FROM instance_events WHERE id IN (
         SELECT id FROM instance_events WHERE position IS NOT NULL AND at < $1 ORDER BY position LIMIT $2)
       RETURNING position),
     horizon AS (
       INSERT INTO retention_horizons (name, position, pruned_at) SELECT 'instance_events', max(position), $3 FROM gone HAVING count(*) > 0
       ON CONFLICT (name) DO UPDATE SET position = GREATEST(retention_horizons.position, EXCLUDED.position), pruned_at = EXCLUDED.pruned_at)
     SELECT count(*)::int AS n FROM gone`,
    [before(policy.eventsDays), policy.batch, now],
  );
  await drain(
    "audit",
    `WITH gone AS (DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE at < $1 ORDER BY id LIMIT $2) RETURNING id)
     SELECT count(*)::int AS n FROM gone`,
    [before(policy.auditDays), policy.batch],
  );
  await drain(
    "commands",
    `WITH gone AS (DELETE FROM host_commands WHERE id IN (SELECT id FROM host_commands WHERE settled_at < $1 ORDER BY settled_at LIMIT $2) RETURNING id),
     output AS (DELETE FROM exec_output WHERE command_id IN (SELECT id FROM gone))
     SELECT count(*)::int AS n FROM gone`,
    [before(policy.commandsDays), policy.batch],
  );
  return pruned;
}

/** The newest event position retention has deleted (0 before any): resuming below it would skip events. */
export async function eventsHorizon(sql: Sql): Promise<bigint> {
  const [row] = await sql.query<{ position: string }>(`SELECT position::text AS position FROM retention_horizons WHERE name = 'instance_events'`);
  return BigInt(row?.position ?? "0");
}
