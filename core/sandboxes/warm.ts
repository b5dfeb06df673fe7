import { randomUUID } from "node:crypto";
import { isAppError } from "../../contracts/errors.ts";
import { lockInstance, writeChange } from "../instances/changes.ts";
import type { Write } from "../kernel/write.ts";
import { type AdmissionDeps, admitInstance } from "../lifecycle/admission.ts";
import { envOf, type SandboxTemplate, TEMPLATE_COLUMNS } from "./templates.ts";

/**
 * The sandboxes reconciler's two duties (the `vps.sandboxes` job): deadlines and warm pools.
 *
 * A warm instance is made for a template version: admitted like any instance (placed, an address leased) but
 * charged to no tenant — it is operator capacity until claimed — and asked to wait paused. Instances of an
 * older version or of a deleted template are drained (deleted); a pool above its target gives back its newest.
 */

/**
 * Delete every sandbox past its deadline at `now` (the write's time unless a test injects one): its instance's
 * event says `sandbox:ttl`. Returns how many.
 */
export async function expireSandboxes(w: Write, sandboxId?: string, now: Date = w.now): Promise<number> {
  const due = await w.sql.query<{ instanceId: string }>(
    `SELECT s.instance_id AS "instanceId" FROM sandboxes s JOIN instances i ON i.id = s.instance_id
      WHERE s.expires_at <= $1 AND i.desired_state <> 'deleted' AND ($2::text IS NULL OR s.id = $2)
      ORDER BY s.expires_at LIMIT 500 FOR UPDATE OF i SKIP LOCKED`,
    [now, sandboxId ?? null],
  );
  for (const d of due) await writeChange(w, await lockInstance(w, null, d.instanceId), { desired_state: "deleted" }, "sandbox:ttl");
  return due.length;
}

/**
 * A claim leaves its pool one short, and the claim wakes this reconciler REFILL_DELAY_MS later to boot the
 * replacement: a boot's writes, its spec change and the host's work to define and start a domain would
 * otherwise compete with the claimed guest's resume and its RUNNING event. A periodic round that comes sooner
 * leaves such a pool alone for CLAIM_QUIET_MS after its last claim (less than the delay, so the claim's own
 * wake-up always finds the pool free to grow, whatever the two processes' clocks say).
 */
export const REFILL_DELAY_MS = 500;
const CLAIM_QUIET_MS = 250;

/** Bring one template's warm pool to its target. Returns what it did, for logs and tests. */
export async function tendPool(w: Write, deps: AdmissionDeps, t: SandboxTemplate): Promise<{ booted: number; drained: number; error?: string }> {
  const live = await w.sql.query<{ id: string; version: number; state: string; claimedRecently: boolean }>(
    `SELECT id, warm_template_version AS version, state,
            EXISTS (SELECT 1 FROM instances c WHERE c.warm_template_id = $1 AND c.claimed_at > $2) AS "claimedRecently"
       FROM instances WHERE warm_template_id = $1 AND claimed_at IS NULL AND desired_state <> 'deleted' ORDER BY created_at DESC`,
    [t.id, new Date(w.now.getTime() - CLAIM_QUIET_MS)],
  );
  const current = live.filter((i) => i.version === t.version);
  const drain = [...live.filter((i) => i.version !== t.version), ...current.slice(0, Math.max(0, current.length - t.warmTarget))];
  await drainWarm(w, drain);
  if (live[0]?.claimedRecently) return { booted: 0, drained: drain.length };
  let booted = 0;
  try {
    for (let n = current.length; n < t.warmTarget; n++) {
      // A boot refused half-way (an address leased, then no node with room) must leave nothing behind, and
      // this write goes on after the refusal: each boot gets a savepoint to fall back to.
      await w.sql.query("SAVEPOINT warm_boot");
      await admitInstance(
        w,
        deps,
        { identityId: t.createdBy, tenantId: t.tenantId },
        { poolId: t.poolId, flavor: t.flavor, imageId: t.imageId, idempotencyKey: `warm:${t.id}:${randomUUID()}` },
        {
          charge: false,
          audit: false,
          desiredState: "paused",
          sandbox: { warmTemplate: { id: t.id, version: t.version }, env: envOf(t), networkPolicy: t.network },
        },
      ).catch(async (e) => {
        await w.sql.query("ROLLBACK TO SAVEPOINT warm_boot");
        throw e;
      });
      await w.sql.query("RELEASE SAVEPOINT warm_boot");
      booted++;
    }
  } catch (e) {
    // No room (or the image went away): keep what was booted, try again next round.
    if (!isAppError(e)) throw e;
    return { booted, drained: drain.length, error: `${e.code}: ${e.message}` };
  }
  return { booted, drained: drain.length };
}

/**
 * Delete warm instances, locked one by one: a claim must not find the whole pool locked by its keeper, and one
 * claimed meanwhile is left to its sandbox.
 */
async function drainWarm(w: Write, ids: readonly { id: string }[]): Promise<void> {
  for (const { id } of ids) {
    const inst = await lockInstance(w, null, id);
    if (inst.claimedAt === null && inst.desiredState !== "deleted") await writeChange(w, inst, { desired_state: "deleted" }, "warm:drain");
  }
}

/** Warm instances whose template is gone are drained. */
export async function drainOrphanedWarm(w: Write): Promise<number> {
  const rows = await w.sql.query<{ id: string }>(
    `SELECT i.id FROM instances i WHERE i.warm_template_id IS NOT NULL AND i.claimed_at IS NULL AND i.desired_state <> 'deleted'
        AND NOT EXISTS (SELECT 1 FROM sandbox_templates t WHERE t.id = i.warm_template_id)`,
  );
  await drainWarm(w, rows);
  return rows.length;
}

export async function templatesToTend(w: Write): Promise<SandboxTemplate[]> {
  return w.sql.query<SandboxTemplate>(`SELECT ${TEMPLATE_COLUMNS} FROM sandbox_templates ORDER BY id`);
}
