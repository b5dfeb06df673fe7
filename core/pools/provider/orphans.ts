import type { SyncIo } from "../driver.ts";
import { storeOffers } from "./accounts.ts";
import type { Machine } from "./contract.ts";

/**
 * The provider sweep for one account: read its offers, then look for orphans — machines labelled as this
 * deployment's that no live instance owns (their instance is deleted or unknown, or it recorded another
 * machine: a twin). Each is reported when first seen and deleted once it has stayed an orphan for the grace,
 * which covers a machine made a moment ago whose instance has not recorded it yet. A machine whose live
 * instance has recorded no machine is not an orphan: that instance's reconciler adopts it.
 */
export async function sweepAccount(io: SyncIo, accountId: string, graceMs: number): Promise<{ orphans: number; removed: number }> {
  const session = await io.providers.session(accountId);
  const offers = await session.offers();
  await io.write({ actor: "providers" }, (w) => storeOffers(w.sql, accountId, offers, w.now));

  const machines = await session.list();
  const owners = await io.read((sql) =>
    sql.query<{ id: string; externalId: string | null; state: string; accountId: string | null }>(
      `SELECT i.id, i.external_id AS "externalId", i.state, p.provider_account_id AS "accountId"
         FROM instances i JOIN pools p ON p.id = i.pool_id WHERE i.id = ANY($1::text[])`,
      [machines.flatMap((m) => (m.instanceId ? [m.instanceId] : []))],
    ),
  );
  const byId = new Map(owners.map((o) => [o.id, o]));
  const isOrphan = (m: Machine) => {
    const owner = m.instanceId ? byId.get(m.instanceId) : undefined;
    if (!owner || owner.state === "deleted" || owner.accountId !== accountId) return true;
    return owner.externalId !== null && owner.externalId !== m.externalId;
  };
  const orphans = machines.filter(isOrphan);
  await wakeDrifted(io, accountId, machines);

  // Remember when each was first seen; forget machines that are gone or owned again.
  const due = await io.write({ actor: "providers" }, async (w) => {
    await w.sql.query(`DELETE FROM provider_orphans WHERE account_id = $1 AND NOT (external_id = ANY($2::text[]))`, [
      accountId,
      orphans.map((m) => m.externalId),
    ]);
    for (const m of orphans)
      await w.sql.query(
        `INSERT INTO provider_orphans (account_id, external_id, instance_id, first_seen_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (account_id, external_id) DO NOTHING`,
        [accountId, m.externalId, m.instanceId, w.now],
      );
    return w.sql.query<{ externalId: string; instanceId: string | null }>(
      `SELECT external_id AS "externalId", instance_id AS "instanceId" FROM provider_orphans WHERE account_id = $1 AND first_seen_at <= $2`,
      [accountId, new Date(w.now.getTime() - graceMs)],
    );
  });
  for (const m of orphans.filter((o) => !due.some((d) => d.externalId === o.externalId)))
    io.log.warn("provider machine without an owner", { accountId, externalId: m.externalId, instanceId: m.instanceId, removeAfterMs: graceMs });

  let removed = 0;
  for (const d of due) {
    // The list above may be a moment old, and a provider that reuses ids may have given this one to a machine
    // made since (for a live instance): delete only the machine that was seen orphaned, and only once.
    const now = await session.get(d.externalId);
    const still = now !== null && now.instanceId === d.instanceId && now.status !== "deleting";
    if (still) await session.delete(d.externalId);
    await io.write({ actor: "providers" }, (w) =>
      w.sql.query(`DELETE FROM provider_orphans WHERE account_id = $1 AND external_id = $2`, [accountId, d.externalId]),
    );
    if (!still) continue;
    io.log.warn("removed an orphan provider machine", { accountId, externalId: d.externalId, instanceId: d.instanceId });
    removed++;
  }
  return { orphans: orphans.length, removed };
}

/**
 * A machine changes behind our back (deleted, powered off in the provider's console, its id reused) while its
 * instance rests: instances of this account whose machine is missing from the list, labelled for another
 * instance, or not in the power state they record, are woken so their reconciler looks (and moves them to lost, or stopped).
 */
async function wakeDrifted(io: SyncIo, accountId: string, machines: readonly Machine[]): Promise<void> {
  const byExternal = new Map(machines.map((m) => [m.externalId, m]));
  await io.write({ actor: "providers" }, async (w) => {
    const live = await w.sql.query<{ id: string; externalId: string; state: string }>(
      `SELECT i.id, i.external_id AS "externalId", i.state FROM instances i JOIN pools p ON p.id = i.pool_id
        WHERE p.provider_account_id = $1 AND i.external_id IS NOT NULL AND i.state IN ('running', 'stopped')`,
      [accountId],
    );
    for (const i of live) {
      const m = byExternal.get(i.externalId);
      if (!m || m.instanceId !== i.id || (m.status === "running") !== (i.state === "running")) w.wake(i.id);
    }
  });
}

export async function providerAccountIds(io: Pick<SyncIo, "read">): Promise<string[]> {
  return (await io.read((sql) => sql.query<{ id: string }>(`SELECT id FROM provider_accounts ORDER BY id`))).map((r) => r.id);
}
