import { Prisma, type Tx } from "./db.ts";
import { AppError } from "./errors.ts";
import type { IdSource } from "./ids.ts";
import type { Shape } from "./shapes.ts";

export interface Placement {
  nodeId: string;
  allocationId: string;
  gpus: { id: string; model: string; index: number; pciAddress: string | null }[];
}

interface PlaceRequest {
  poolId: string;
  tenantId: string;
  instanceId: string;
  shape: Shape;
  singleTenant: boolean;
  /** Resize: the node the instance already holds; only it is considered, and its own claim is not counted. */
  onlyNodeId?: string;
}

const CANDIDATES = 8;

/**
 * Place an instance on one node of the pool, inside the caller's transaction.
 *
 * Candidates are read without locks, then claimed with a guarded UPDATE of the node's counters: PostgreSQL
 * re-evaluates the WHERE on the latest row version after waiting for the row lock, so concurrent creates can
 * never push a node past its capacity. GPUs are rows, claimed while the node's row lock is held, so they are
 * whole and never shared. Policy: best fit (the fullest node that fits), and nodes whose GPUs the request
 * does not use come last, so GPU hosts stay free for GPU work.
 */
export async function place(tx: Tx, ids: IdSource, req: PlaceRequest): Promise<Placement> {
  const { shape } = req;
  const gpuFilter = shape.gpus.map(
    (g) => Prisma.sql`AND (SELECT count(*) FROM node_gpus g WHERE g.node_id = n.id AND g.model = ${g.model} AND g.allocation_id IS NULL) >= ${g.count}`,
  );
  const requestedModels = shape.gpus.map((g) => g.model);
  const candidates = await tx.$queryRaw<{ id: string }[]>`
    SELECT n.id FROM nodes n
     WHERE n.pool_id = ${req.poolId} AND n.state = 'ready'
       ${req.onlyNodeId ? Prisma.sql`AND n.id = ${req.onlyNodeId}` : Prisma.empty}
       AND n.cap_vcpus - n.alloc_vcpus >= ${shape.vcpus}
       AND n.cap_memory_mib - n.alloc_memory_mib >= ${shape.memoryMib}
       AND n.cap_disk_gib - n.alloc_disk_gib >= ${shape.diskGib}
       AND (${!req.singleTenant} OR n.dedicated_tenant_id IS NULL OR n.dedicated_tenant_id = ${req.tenantId})
       ${gpuFilter.length ? Prisma.join(gpuFilter, " ") : Prisma.empty}
     ORDER BY (SELECT count(*) FROM node_gpus g WHERE g.node_id = n.id AND g.allocation_id IS NULL
                AND NOT (g.model = ANY(${requestedModels}::text[]))) ASC,
              n.cap_memory_mib - n.alloc_memory_mib ASC, n.id
     LIMIT ${CANDIDATES}`;

  // First pass: skip nodes another create holds, so concurrent creates spread instead of queueing on one
  // row. Second pass: wait for the busy ones, so a node that still fits is never reported full.
  const busy: string[] = [];
  for (const { id: nodeId } of candidates) {
    const placed = await tryNode(tx, ids, req, nodeId, false);
    if (placed === "busy") busy.push(nodeId);
    else if (placed) return placed;
  }
  for (const nodeId of busy) {
    const placed = await tryNode(tx, ids, req, nodeId, true);
    if (placed && placed !== "busy") return placed;
  }
  throw await unschedulable(tx, req);
}

async function tryNode(tx: Tx, ids: IdSource, req: PlaceRequest, nodeId: string, wait: boolean): Promise<Placement | null | "busy"> {
  const { shape } = req;
  // A savepoint lets a node whose GPUs went short after the counters were claimed be given back whole.
  await tx.$executeRawUnsafe("SAVEPOINT place_node");
  if (!wait) {
    const free = await tx.$queryRaw<unknown[]>`SELECT 1 FROM nodes WHERE id = ${nodeId} FOR UPDATE SKIP LOCKED`;
    if (free.length === 0) {
      await tx.$executeRawUnsafe("ROLLBACK TO SAVEPOINT place_node");
      return "busy";
    }
  }
  const claimed = await tx.$executeRaw`
    UPDATE nodes SET alloc_vcpus = alloc_vcpus + ${shape.vcpus},
                     alloc_memory_mib = alloc_memory_mib + ${shape.memoryMib},
                     alloc_disk_gib = alloc_disk_gib + ${shape.diskGib},
                     alloc_instances = alloc_instances + 1,
                     dedicated_tenant_id = CASE WHEN ${req.singleTenant} THEN ${req.tenantId} ELSE dedicated_tenant_id END
     WHERE id = ${nodeId} AND state = 'ready'
       AND cap_vcpus - alloc_vcpus >= ${shape.vcpus}
       AND cap_memory_mib - alloc_memory_mib >= ${shape.memoryMib}
       AND cap_disk_gib - alloc_disk_gib >= ${shape.diskGib}
       AND (${!req.singleTenant} OR dedicated_tenant_id IS NULL OR dedicated_tenant_id = ${req.tenantId})`;
  if (claimed === 0) {
    await tx.$executeRawUnsafe("ROLLBACK TO SAVEPOINT place_node");
    return null;
  }
  const allocationId = ids("alloc");
  await tx.allocation.create({
    data: {
      id: allocationId,
      nodeId,
      instanceId: req.instanceId,
      tenantId: req.tenantId,
      vcpus: shape.vcpus,
      memoryMib: shape.memoryMib,
      diskGib: shape.diskGib,
    },
  });
  const gpus: Placement["gpus"] = [];
  for (const g of shape.gpus) {
    const got = await tx.$queryRaw<Placement["gpus"]>`
      UPDATE node_gpus SET allocation_id = ${allocationId}
       WHERE id IN (SELECT id FROM node_gpus WHERE node_id = ${nodeId} AND model = ${g.model} AND allocation_id IS NULL
                     ORDER BY index LIMIT ${g.count} FOR UPDATE)
       RETURNING id, model, index, pci_address AS "pciAddress"`;
    if (got.length < g.count) {
      await tx.$executeRawUnsafe("ROLLBACK TO SAVEPOINT place_node");
      return null;
    }
    gpus.push(...got);
  }
  await tx.$executeRawUnsafe("RELEASE SAVEPOINT place_node");
  return { nodeId, allocationId, gpus: gpus.sort((a, b) => a.index - b.index) };
}

/** Give back what an allocation holds on its node, and delete it. */
export async function releaseAllocation(tx: Tx, allocationId: string): Promise<void> {
  const [alloc] = await tx.$queryRaw<{ node_id: string; vcpus: number; memory_mib: bigint; disk_gib: bigint }[]>`
    DELETE FROM allocations WHERE id = ${allocationId} RETURNING node_id, vcpus, memory_mib, disk_gib`;
  if (!alloc) return;
  await tx.$executeRaw`UPDATE node_gpus SET allocation_id = NULL WHERE allocation_id = ${allocationId}`;
  await tx.$executeRaw`
    UPDATE nodes SET alloc_vcpus = alloc_vcpus - ${alloc.vcpus},
                     alloc_memory_mib = alloc_memory_mib - ${alloc.memory_mib},
                     alloc_disk_gib = alloc_disk_gib - ${alloc.disk_gib},
                     alloc_instances = alloc_instances - 1,
                     dedicated_tenant_id = CASE WHEN alloc_instances = 1 THEN NULL ELSE dedicated_tenant_id END
     WHERE id = ${alloc.node_id}`;
}

/** Say why nothing fits, in words an operator can act on. */
async function unschedulable(tx: Tx, req: PlaceRequest): Promise<AppError> {
  const { shape } = req;
  const want = `${shape.vcpus} vCPU, ${shape.memoryMib} MiB, ${shape.diskGib} GiB${shape.gpus.map((g) => `, ${g.count}× ${g.model}`).join("")}`;
  const [stats] = await tx.$queryRaw<{ ready: bigint; vcpus: number | null; mem: bigint | null; disk: bigint | null }[]>`
    SELECT count(*) AS ready, max(cap_vcpus - alloc_vcpus) AS vcpus, max(cap_memory_mib - alloc_memory_mib) AS mem,
           max(cap_disk_gib - alloc_disk_gib) AS disk
      FROM nodes WHERE pool_id = ${req.poolId} AND state = 'ready'
      ${req.onlyNodeId ? Prisma.sql`AND id = ${req.onlyNodeId}` : Prisma.empty}`;
  const ready = Number(stats?.ready ?? 0);
  const where = req.onlyNodeId ? `its node ${req.onlyNodeId}` : `pool ${req.poolId}`;
  const reason =
    ready === 0
      ? `no ready node in ${where}`
      : `no node in ${where} has room for ${want} (${ready} ready; most free: ${stats?.vcpus} vCPU, ${stats?.mem} MiB, ${stats?.disk} GiB${
          req.singleTenant ? "; single-tenant pool: nodes holding other tenants are excluded" : ""
        })`;
  return new AppError("UNSCHEDULABLE", reason, { poolId: req.poolId, requested: want });
}
