import { AppError } from "../../../contracts/errors.ts";
import type { Shape } from "../../catalog/shapes.ts";
import type { Sql } from "../../kernel/db.ts";
import type { IdSource } from "../../kernel/ids.ts";
import { type Fragment, SQL } from "../../kernel/sql.ts";

export interface Placement {
  nodeId: string;
  allocationId: string;
  /** The node's spec generation after the claim (bumped by it when the request asked). */
  specGeneration: number;
  gpus: { id: string; model: string; index: number; pciAddress: string | null }[];
}

export interface PlaceRequest {
  poolId: string;
  tenantId: string;
  instanceId: string;
  shape: Shape;
  singleTenant: boolean;
  /** Resize: only this node is considered (the instance's own claim has already been given back). */
  onlyNodeId?: string;
  /** Recreate: hosts that refused this instance before. */
  excludeNodeIds?: readonly string[];
  /**
   * Admission: the instance joins the node's desired set in this transaction, so the claim bumps the node's spec
   * generation in the same statement (generations.ts) rather than in one more round trip on the same row.
   */
  bumpSpec?: boolean;
}

const CANDIDATES = 8;

/** What a claim binds, each once however often the statement reads it (placeValues). */
interface ClaimValues {
  pool: Fragment;
  vcpus: Fragment;
  memoryMib: Fragment;
  diskGib: Fragment;
  singleTenant: Fragment;
  tenant: Fragment;
  onlyNode: Fragment;
  excluded: Fragment;
}

const placeValues = (req: PlaceRequest, onlyNodeId = req.onlyNodeId): ClaimValues => ({
  pool: SQL.param(req.poolId),
  vcpus: SQL.param(req.shape.vcpus),
  memoryMib: SQL.param(req.shape.memoryMib),
  diskGib: SQL.param(req.shape.diskGib),
  singleTenant: SQL.param(req.singleTenant),
  tenant: SQL.param(req.tenantId),
  onlyNode: SQL.param(onlyNodeId ?? null),
  excluded: SQL.param(req.excludeNodeIds ?? []),
});

const bool = (b: boolean) => (b ? SQL`true` : SQL`false`);

/**
 * The nodes of the pool a request may take (as `n`): node_fits (the hold_in_functions migration) says what a node
 * must be and have free, for claim_node as for this.
 */
const fits = (v: ClaimValues) => SQL`n.pool_id = ${v.pool} AND (${v.onlyNode}::text IS NULL OR n.id = ${v.onlyNode}) AND NOT (n.id = ANY(${v.excluded}::text[]))
  AND node_fits(n, ${v.vcpus}::int, ${v.memoryMib}::bigint, ${v.diskGib}::bigint, ${v.singleTenant}::boolean, ${v.tenant}::text)`;

/**
 * Claim a node for the request by the claim_node function (the hold_in_functions migration, which says the
 * rule): the best fit no other transaction holds, or when all are held and `wait`, one at random, waited for, so
 * waiters spread over the nodes instead of queueing on one; the fit is checked again on the row it locks. A
 * function because a lock that meets a row changed under it rechecks the plan it is in: there, a small one.
 * One row unless `guard` is false: `picked` (the node locked, null when none fits), and `id` and
 * `spec_generation` (after the claim) when the claim held.
 */
const claimSql = (bumpSpec: boolean | undefined, v: ClaimValues, wait: boolean, guard = SQL`true`) =>
  SQL`SELECT c.picked, c.id, c.spec_generation FROM claim_node(${v.pool}::text, ${v.vcpus}::int, ${v.memoryMib}::bigint, ${v.diskGib}::bigint, ${v.singleTenant}::boolean, ${v.tenant}::text,
     ${v.onlyNode}::text, ${v.excluded}::text[], ${bool(!!bumpSpec)}, ${bool(wait)}, ${guard}) c`;

/**
 * The claim's CTEs, for one statement: `claimed` (claimSql's row) and `made` (the allocation `allocationId`, for
 * the request's instance, when the claim held).
 */
const claimCtes = (req: PlaceRequest, allocationId: string, guard = SQL`true`) => {
  const v = placeValues(req);
  return SQL`claimed AS (${claimSql(req.bumpSpec, v, true, guard)}),
       made AS (INSERT INTO allocations (id, node_id, instance_id, tenant_id, vcpus, memory_mib, disk_gib)
         SELECT ${allocationId}, claimed.id, ${req.instanceId}, ${v.tenant}, ${v.vcpus}, ${v.memoryMib}, ${v.diskGib} FROM claimed WHERE claimed.id IS NOT NULL
         RETURNING id, node_id, vcpus, memory_mib)`;
};

/**
 * A placement for a caller's own statement (admission's last one, so that the node's row is locked for that
 * statement and its commit only): CTEs `claimed` and `made` as claimCtes describes, taken only where `guard`
 * holds. GPU requests are not placed this way (`place` does).
 */
export function placeInStatement(req: PlaceRequest, allocationId: string, guard: Fragment): Fragment {
  if (req.shape.gpus.length) throw new Error("GPU placements take place(), which claims the GPUs row by row");
  return claimCtes(req, allocationId, guard);
}

/**
 * Place an instance on one node of the pool, inside the caller's transaction.
 *
 * Claims are guarded UPDATEs of the node's counters: PostgreSQL re-evaluates the WHERE on the latest row
 * version after a lock wait, so concurrent creates can never push a node past its capacity (a CHECK
 * constraint backs this up). Nodes another create holds are skipped first (SKIP LOCKED) so creates spread
 * instead of queueing on one row, then waited for (one at random, so waiters spread too), so a node that still
 * fits is never reported full. GPUs are rows, claimed while the node's row lock is held: whole, never shared. Policy: best fit (the fullest node that
 * fits), and nodes whose GPUs the request does not use come last, so GPU hosts stay free for GPU work.
 */
export async function place(sql: Sql, ids: IdSource, req: PlaceRequest): Promise<Placement> {
  const s = req.shape;
  const allocationId = ids("alloc");

  if (s.gpus.length === 0) {
    // The common case in one statement: pick, lock, claim and record the allocation.
    const [claimed] = await sql.query<{ node_id: string; generation: number }>(
      SQL`WITH ${claimCtes(req, allocationId)} SELECT made.node_id, claimed.spec_generation AS generation FROM made JOIN claimed ON claimed.id = made.node_id`,
    );
    if (claimed) return { nodeId: claimed.node_id, allocationId, specGeneration: claimed.generation, gpus: [] };
    throw await unschedulable(sql, req);
  }

  const candidates = await sql.query<{ id: string }>(
    SQL`SELECT n.id FROM nodes n WHERE ${fits(placeValues(req))}
        AND NOT EXISTS (SELECT 1 FROM jsonb_to_recordset(${JSON.stringify(s.gpus)}::jsonb) AS w(model text, count int)
                         WHERE (SELECT count(*) FROM node_gpus g WHERE g.node_id = n.id AND g.model = w.model AND g.allocation_id IS NULL) < w.count)
      ORDER BY (SELECT count(*) FROM node_gpus g WHERE g.node_id = n.id AND g.allocation_id IS NULL
                 AND NOT (g.model = ANY(${s.gpus.map((g) => g.model)}::text[]))), n.cap_memory_mib - n.alloc_memory_mib, n.id
      LIMIT ${SQL.raw(String(CANDIDATES))}`,
  );
  const busy: string[] = [];
  for (const { id } of candidates) {
    const placed = await tryNode(sql, req, id, allocationId, false);
    if (placed === "busy") busy.push(id);
    else if (placed) return placed;
  }
  for (const id of busy) {
    const placed = await tryNode(sql, req, id, allocationId, true);
    if (placed && placed !== "busy") return placed;
  }
  throw await unschedulable(sql, req);
}

async function tryNode(sql: Sql, req: PlaceRequest, nodeId: string, allocationId: string, wait: boolean): Promise<Placement | null | "busy"> {
  // A savepoint lets a node whose GPUs went short after the counters were claimed be given back whole.
  await sql.query("SAVEPOINT place_node");
  const claimed = await sql.query<{ id: string; generation: number }>(
    SQL`SELECT id, spec_generation AS generation FROM (${claimSql(req.bumpSpec, placeValues(req, nodeId), wait)}) c WHERE id IS NOT NULL`,
  );
  if (claimed.length === 0) {
    await sql.query("ROLLBACK TO SAVEPOINT place_node");
    // Without waiting, "no row" may only mean another transaction held the node (a create, or a host report
    // updating it) at that instant; checking the lock afterwards races its release. Only the waiting claim,
    // which re-checks the fit on the latest row version, may say the node is full.
    return wait ? null : "busy";
  }
  const s = req.shape;
  await sql.query(`INSERT INTO allocations (id, node_id, instance_id, tenant_id, vcpus, memory_mib, disk_gib) VALUES ($1, $2, $3, $4, $5, $6, $7)`, [
    allocationId,
    nodeId,
    req.instanceId,
    req.tenantId,
    s.vcpus,
    s.memoryMib,
    s.diskGib,
  ]);
  const gpus: Placement["gpus"] = [];
  for (const g of s.gpus) {
    const got = await sql.query<Placement["gpus"][number]>(
      `UPDATE node_gpus SET allocation_id = $1
        WHERE id IN (SELECT id FROM node_gpus WHERE node_id = $2 AND model = $3 AND allocation_id IS NULL ORDER BY index LIMIT $4 FOR UPDATE)
        RETURNING id, model, index, pci_address AS "pciAddress"`,
      [allocationId, nodeId, g.model, g.count],
    );
    if (got.length < g.count) {
      await sql.query("ROLLBACK TO SAVEPOINT place_node");
      return null;
    }
    gpus.push(...got);
  }
  await sql.query("RELEASE SAVEPOINT place_node");
  return { nodeId, allocationId, specGeneration: claimed[0]?.generation as number, gpus: gpus.sort((a, b) => a.index - b.index) };
}

/** Give back what an allocation holds on its node, and delete it. */
export async function releaseAllocation(sql: Sql, allocationId: string): Promise<void> {
  await sql.query(
    `WITH a AS (DELETE FROM allocations WHERE id = $1 RETURNING node_id, vcpus, memory_mib, disk_gib),
          g AS (UPDATE node_gpus SET allocation_id = NULL WHERE allocation_id = $1)
     UPDATE nodes n SET alloc_vcpus = alloc_vcpus - a.vcpus, alloc_memory_mib = alloc_memory_mib - a.memory_mib,
            alloc_disk_gib = alloc_disk_gib - a.disk_gib, alloc_instances = alloc_instances - 1,
            dedicated_tenant_id = CASE WHEN alloc_instances = 1 THEN NULL ELSE dedicated_tenant_id END
       FROM a WHERE n.id = a.node_id`,
    [allocationId],
  );
}

/** Say why nothing fits, in words an operator can act on. */
export async function unschedulable(sql: Sql, req: PlaceRequest): Promise<AppError> {
  const s = req.shape;
  const want = `${s.vcpus} vCPU, ${s.memoryMib} MiB, ${s.diskGib} GiB${s.gpus.map((g) => `, ${g.count}× ${g.model}`).join("")}`;
  const [stats] = await sql.query<{ ready: number; vcpus: number | null; mem: string | null; disk: string | null }>(
    `SELECT count(*)::int AS ready, max(cap_vcpus - alloc_vcpus) AS vcpus, max(cap_memory_mib - alloc_memory_mib)::text AS mem,
            max(cap_disk_gib - alloc_disk_gib)::text AS disk
       FROM nodes WHERE pool_id = $1 AND state = 'ready' AND lost_at IS NULL AND gone_at IS NULL AND ($2::text IS NULL OR id = $2)
        AND NOT (id = ANY($3::text[]))`,
    [req.poolId, req.onlyNodeId ?? null, req.excludeNodeIds ?? []],
  );
  const where = req.onlyNodeId ? `its node ${req.onlyNodeId}` : `pool ${req.poolId}`;
  const reason = !stats?.ready
    ? `no ready node in ${where}`
    : `no node in ${where} has room for ${want} (${stats.ready} ready; most free: ${stats.vcpus} vCPU, ${stats.mem} MiB, ${stats.disk} GiB${
        req.singleTenant ? "; single-tenant pool: nodes holding other tenants are excluded" : ""
      })`;
  return new AppError("UNSCHEDULABLE", reason, { poolId: req.poolId, requested: want });
}
