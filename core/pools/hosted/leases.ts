import { AppError } from "../../../contracts/errors.ts";
import type { Sql } from "../../kernel/db.ts";
import { formatIpv4, type Range } from "./ipam.ts";

/** Make the address rows of a new range: every offset but network, broadcast and gateway. */
export async function createAddresses(sql: Sql, ipPoolId: string, range: Range): Promise<void> {
  await sql.query(
    `INSERT INTO ip_addresses (ip_pool_id, "offset", address)
     SELECT $1, o, host($2::inet + o) FROM generate_series(1, $3::int) AS o WHERE o <> $4`,
    [ipPoolId, formatIpv4(range.network), range.size - 2, range.gatewayOffset],
  );
}

/**
 * The lease: the lowest free address of the pool's range. SKIP LOCKED lets concurrent creates take different
 * rows without waiting; an address another transaction is claiming is not free for this one. The range id
 * is a scalar subquery so the partial index on free rows serves the ORDER BY (a join made PostgreSQL sort
 * every free row of a /16: 67 ms against 0.5 ms). Placeholders: pool, instance, time; nothing is leased
 * unless `gate` holds.
 */
export const leaseSql = (pool: string, instance: string, at: string, gate = "true") => `UPDATE ip_addresses SET instance_id = ${instance}, leased_at = ${at}
      WHERE ${gate} AND ip_pool_id = (SELECT id FROM ip_pools WHERE pool_id = ${pool}) AND "offset" = (
        SELECT "offset" FROM ip_addresses WHERE ip_pool_id = (SELECT id FROM ip_pools WHERE pool_id = ${pool}) AND instance_id IS NULL
         ORDER BY "offset" LIMIT 1 FOR UPDATE SKIP LOCKED)
      RETURNING address`;

export const noFreeAddress = (poolId: string) => new AppError("UNSCHEDULABLE", `pool ${poolId} has no free IPv4 address`, { poolId });

export async function leaseAddress(sql: Sql, poolId: string, instanceId: string, now: Date): Promise<string> {
  const [leased] = await sql.query<{ address: string }>(leaseSql("$1", "$2", "$3"), [poolId, instanceId, now]);
  if (!leased) throw noFreeAddress(poolId);
  return leased.address;
}

export async function releaseLease(sql: Sql, instanceId: string): Promise<string | null> {
  const [gone] = await sql.query<{ address: string }>(`UPDATE ip_addresses SET instance_id = NULL, leased_at = NULL WHERE instance_id = $1 RETURNING address`, [
    instanceId,
  ]);
  return gone?.address ?? null;
}
