import type { Tx } from "./db.ts";
import { AppError } from "./errors.ts";
import { formatIpv4, type Range } from "./ipam.ts";

/** Make the address rows of a new range: every offset but network, broadcast and gateway. */
export async function createAddresses(tx: Tx, ipPoolId: string, range: Range): Promise<void> {
  await tx.$executeRaw`
    INSERT INTO ip_addresses (ip_pool_id, "offset", address)
    SELECT ${ipPoolId}, o, host(${formatIpv4(range.network)}::inet + o)
      FROM generate_series(1, ${range.size - 2}::int) AS o
     WHERE o <> ${range.gatewayOffset}`;
}

/**
 * Lease the lowest free address of the pool's range. SKIP LOCKED lets concurrent creates take different
 * rows without waiting; an address another transaction is claiming is not free for this one.
 */
export async function leaseAddress(tx: Tx, poolId: string, instanceId: string, now: Date): Promise<string> {
  const [leased] = await tx.$queryRaw<{ address: string }[]>`
    UPDATE ip_addresses SET instance_id = ${instanceId}, leased_at = ${now}
     WHERE (ip_pool_id, "offset") = (
       SELECT a.ip_pool_id, a."offset" FROM ip_addresses a JOIN ip_pools p ON p.id = a.ip_pool_id
        WHERE p.pool_id = ${poolId} AND a.instance_id IS NULL
        ORDER BY a."offset" LIMIT 1 FOR UPDATE OF a SKIP LOCKED)
    RETURNING address`;
  if (!leased) throw new AppError("UNSCHEDULABLE", `pool ${poolId} has no free IPv4 address`, { poolId });
  return leased.address;
}

export async function releaseLease(tx: Tx, instanceId: string): Promise<string | null> {
  const [gone] = await tx.$queryRaw<{ address: string }[]>`
    UPDATE ip_addresses SET instance_id = NULL, leased_at = NULL WHERE instance_id = ${instanceId} RETURNING address`;
  return gone?.address ?? null;
}
