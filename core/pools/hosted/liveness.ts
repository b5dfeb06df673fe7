import type { Write } from "../../kernel/write.ts";
import { bumpSpecs } from "./generations.ts";

/**
 * The sweep's work on hosts: silence, orphans and unacknowledged specs. Each records what to wake and whom to
 * tell on the Write; nothing here waits for a host.
 */

/** Nodes silent past the grace become lost, and their instances are woken (the reconciler marks them lost). */
export async function markLostNodes(w: Write, graceMs: number): Promise<void> {
  const rows = await w.sql.query<{ id: string }>(
    `WITH lost AS (
       UPDATE nodes SET lost_at = $1 WHERE lost_at IS NULL AND gone_at IS NULL AND last_report_at < $2 RETURNING id)
     SELECT i.id FROM instances i JOIN lost ON lost.id = i.node_id WHERE i.state <> 'deleted'`,
    [w.now, new Date(w.now.getTime() - graceMs)],
  );
  for (const r of rows) w.wake(r.id);
}

/** Orphans past the grace go into their node's spec for removal. */
export async function announceOrphanRemovals(w: Write, graceMs: number): Promise<void> {
  const rows = await w.sql.query<{ node_id: string }>(`UPDATE orphans SET removal_at = $1 WHERE removal_at IS NULL AND first_seen_at < $2 RETURNING node_id`, [
    w.now,
    new Date(w.now.getTime() - graceMs),
  ]);
  await bumpSpecs(
    w,
    rows.map((r) => r.node_id),
  );
}

/** Specs a live agent has not acknowledged are announced again: the agent may have missed the message. */
export async function reannounceSpecs(w: Write): Promise<void> {
  const rows = await w.sql.query<{ id: string; generation: number }>(
    `SELECT id, spec_generation AS generation FROM nodes WHERE gone_at IS NULL AND lost_at IS NULL AND reported_generation < spec_generation`,
  );
  for (const n of rows) w.spec(n.id, n.generation);
}
