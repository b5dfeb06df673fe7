import { AppError } from "../../../contracts/errors.ts";
import { one, type Sql } from "../../kernel/db.ts";
import { type Fragment, SQL } from "../../kernel/sql.ts";
import { formatIpv4, leasableCount, type Range } from "./ipam.ts";

/** Make the address rows of a new range: every offset but network, broadcast and gateway. */
export async function createAddresses(sql: Sql, ipPoolId: string, range: Range): Promise<void> {
  await sql.query(
    `INSERT INTO ip_addresses (ip_pool_id, "offset", address)
     SELECT $1, o, host($2::inet + o) FROM generate_series(1, $3::int) AS o WHERE o <> $4`,
    [ipPoolId, formatIpv4(range.network), range.size - 2, range.gatewayOffset],
  );
}

/**
 * The lease: the lowest free address of the pool's range, by the lease_address function (the
 * hold_in_functions migration: rows other creates are taking are skipped, and a lock that meets a row changed
 * under it rechecks only that small plan, not the statement it is called from). No row when no address is free,
 * or unless `gate` holds.
 */
export const leaseSql = (poolId: string, instanceId: string, at: Date, gate: Fragment = SQL`true`) =>
  SQL`SELECT a AS address FROM lease_address(${poolId}::text, ${instanceId}::text, ${at}::timestamptz, ${gate}) a WHERE a IS NOT NULL`;

export const noFreeAddress = (poolId: string) => new AppError("UNSCHEDULABLE", `pool ${poolId} has no free IPv4 address`, { poolId });

export async function leaseAddress(sql: Sql, poolId: string, instanceId: string, now: Date): Promise<string> {
  const [leased] = await sql.query<{ address: string }>(leaseSql(poolId, instanceId, now));
  if (!leased) throw noFreeAddress(poolId);
  return leased.address;
}

export async function releaseLease(sql: Sql, instanceId: string): Promise<string | null> {
  const [gone] = await sql.query<{ address: string }>(`UPDATE ip_addresses SET instance_id = NULL, leased_at = NULL WHERE instance_id = $1 RETURNING address`, [
    instanceId,
  ]);
  return gone?.address ?? null;
}

/** A hosted pool's range and how much of it is leased; null for pools without one. */
export async function ipamOf(sql: Sql, poolId: string): Promise<{ range: string; total: number; used: number } | null> {
  const row = await one<{ cidr: string; prefix: number; used: number }>(
    sql,
    `SELECT ip.cidr, ip.prefix, (SELECT count(*)::int FROM ip_addresses a WHERE a.ip_pool_id = ip.id AND a.instance_id IS NOT NULL) AS used
       FROM ip_pools ip WHERE ip.pool_id = $1`,
    [poolId],
  );
  return row ? { range: row.cidr, total: leasableCount({ size: 2 ** (32 - row.prefix) }), used: row.used } : null;
}
