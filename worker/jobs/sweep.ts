import { instancesWithUnsettledCommands } from "../../core/commands/commands.ts";
import { positionStragglers } from "../../core/kernel/write.ts";
import { announceOrphanRemovals, markLostNodes, reannounceSpecs } from "../../core/pools/hosted/liveness.ts";
import { tenantsBeingDeleted } from "../../core/teardown/teardown.ts";
import type { Platform } from "../../infra/platform.ts";

const BATCH = 2000;

/**
 * `vps.sweep`: silent nodes become lost (and their instances are woken), orphans past the grace go into their
 * node's spec for removal, specs an agent has not acknowledged are announced again, instances with host
 * commands to settle and every instance that is not at rest are woken, and committed events left without a
 * position are given one. Wake-ups are hints; this is what makes
 * a lost one only a delay.
 */
export async function sweep(platform: Platform): Promise<void> {
  const { hosts } = platform.config;
  // Events a writer committed and then died before having them positioned are invisible to subscribers until now.
  await platform.read(positionStragglers);
  await platform.write({ actor: "sweep" }, async (w) => {
    await markLostNodes(w, hosts.lostGraceMs);
    await announceOrphanRemovals(w, hosts.orphanGraceMs);
    await reannounceSpecs(w);
    const now = w.now;
    for (const id of await instancesWithUnsettledCommands(w.sql, now, BATCH)) w.wake(id);
    // Only instances idle for a while: one that changed just now has a wake-up in flight already.
    const drifting = await w.sql.query<{ id: string }>(
      `SELECT id FROM instances
        WHERE state <> 'deleted' AND state <> desired_state AND NOT (state = 'error' AND NOT retry_requested) AND updated_at < $1
        ORDER BY updated_at LIMIT ${BATCH}`,
      [new Date(now.getTime() - Math.max(1000, hosts.sweepMs))],
    );
    for (const r of drifting) w.wake(r.id);
    // Deleted tenants whose teardown is not done: the next pass may find their last instance deleted.
    for (const id of await tenantsBeingDeleted(w.sql)) w.tearDown(id);
  });
}
