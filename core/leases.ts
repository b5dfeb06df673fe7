import type { Tx } from "./db.ts";
import { AppError } from "./errors.ts";
import { formatIpv4 } from "./ipam.ts";

/**
 * Lease the lowest free address of a pool's range. The pool's ip_pools row lock serialises leasing within a
 * pool (so two creates can never pick the same address), and the (ip_pool_id, offset) key backs it up.
 */
export async function leaseAddress(tx: Tx, poolId: string, instanceId: string): Promise<string> {
  const [ipPool] = await tx.$queryRaw<{ id: string; network: bigint; prefix: number; gateway_offset: number }[]>`
    SELECT id, network, prefix, gateway_offset FROM ip_pools WHERE pool_id = ${poolId} FOR UPDATE`;
  if (!ipPool) throw new AppError("UNSCHEDULABLE", `pool ${poolId} has no IPv4 range`, { poolId });
  const last = 2 ** (32 - ipPool.prefix) - 2; // the broadcast is size - 1
  const [free] = await tx.$queryRaw<{ o: number }[]>`
    SELECT s.o FROM generate_series(1, ${last}::int) AS s(o)
     WHERE s.o <> ${ipPool.gateway_offset}
       AND NOT EXISTS (SELECT 1 FROM ip_leases l WHERE l.ip_pool_id = ${ipPool.id} AND l."offset" = s.o)
     ORDER BY s.o LIMIT 1`;
  if (!free) throw new AppError("UNSCHEDULABLE", `pool ${poolId} has no free IPv4 address`, { poolId });
  const address = formatIpv4(Number(ipPool.network) + free.o);
  await tx.ipLease.create({ data: { ipPoolId: ipPool.id, offset: free.o, address, instanceId } });
  return address;
}

export async function releaseLease(tx: Tx, instanceId: string): Promise<string | null> {
  const [gone] = await tx.$queryRaw<{ address: string }[]>`DELETE FROM ip_leases WHERE instance_id = ${instanceId} RETURNING address`;
  return gone?.address ?? null;
}
