import { announceOrphanRemovals, bumpSpecs, markLostNodes } from "../../core/pools/hosted/hosts.ts";
import type { Platform } from "../../infra/platform.ts";

const BATCH = 2000;

/**
 * `vps.sweep`: silent nodes become lost (and their instances are woken), orphans past the grace go into their
 * node's spec for removal, specs an agent has not acknowledged are published again, and every instance that is
 * not at rest is woken. Wake-ups are hints; this is what makes a lost one only a delay.
 */
export async function sweep(platform: Platform): Promise<void> {
  const now = platform.now();
  const { hosts } = platform.config;
  const lost = await platform.write((sql) => markLostNodes(sql, hosts.lostGraceMs, now));
  await platform.write(async (sql, emit) => {
    const nodes = await announceOrphanRemovals(sql, hosts.orphanGraceMs, now);
    emit({ event: null, specs: await bumpSpecs(sql, nodes) });
  });
  const pending = await platform.db.transaction((sql) =>
    sql.query<{ id: string; kind: string; generation: number }>(
      `(SELECT id, 'node' AS kind, spec_generation AS generation FROM nodes
         WHERE gone_at IS NULL AND lost_at IS NULL AND reported_generation < spec_generation)
       UNION ALL
       (SELECT id, 'instance', 0 FROM instances
         WHERE state <> 'deleted' AND state <> desired_state AND NOT (state = 'error' AND NOT retry_requested)
           AND updated_at < $1
         ORDER BY updated_at LIMIT ${BATCH})`,
      // Only instances idle for a while: one that changed just now has a wake-up in flight already.
      [new Date(now.getTime() - Math.max(1000, hosts.sweepMs))],
    ),
  );
  for (const n of pending.filter((p) => p.kind === "node")) platform.bus.publish("nodeSpecs", { nodeId: n.id, generation: n.generation }, n.id);
  const wake = new Set([...lost, ...pending.filter((p) => p.kind === "instance").map((p) => p.id)]);
  for (const instanceId of wake) await platform.jobs.enqueue("vps.instances", { instanceId });
}
