import { z } from "zod";
import { AppError, notFound } from "../../../contracts/errors.ts";
import { one, type Sql } from "../../kernel/db.ts";
import { parseInput, resourceName } from "../../kernel/validation.ts";
import type { Write } from "../../kernel/write.ts";
import { gpuClaim } from "../../tenancy/quota.ts";
import { requirePool } from "../pools.ts";
import { requireCapability } from "../registry.ts";

/** A host of a hosted pool, as operators see it. Capacity and allocation are counters so placement is one guarded UPDATE. */
export interface Node {
  id: string;
  poolId: string;
  name: string;
  /** `ready` or `cordoned`, or `refusing` while its agent reports lacking the pool's runtime; `lostAt` says whether it went silent. */
  state: "ready" | "cordoned" | "refusing";
  capVcpus: number;
  capMemoryMib: number;
  capDiskGib: number;
  allocVcpus: number;
  allocMemoryMib: number;
  allocDiskGib: number;
  allocInstances: number;
  specGeneration: number;
  reportedGeneration: number;
  lostAt: Date | null;
  goneAt: Date | null;
  lastReportAt: Date | null;
  createdAt: Date;
  gpus: { model: string; allocated: boolean }[];
}

const NODE_COLUMNS = `n.id, n.pool_id AS "poolId", n.name, n.state, n.cap_vcpus AS "capVcpus", n.cap_memory_mib::float8 AS "capMemoryMib",
  n.cap_disk_gib::float8 AS "capDiskGib", n.alloc_vcpus AS "allocVcpus", n.alloc_memory_mib::float8 AS "allocMemoryMib",
  n.alloc_disk_gib::float8 AS "allocDiskGib", n.alloc_instances AS "allocInstances", n.spec_generation AS "specGeneration",
  n.reported_generation AS "reportedGeneration", n.lost_at AS "lostAt", n.gone_at AS "goneAt", n.last_report_at AS "lastReportAt",
  n.created_at AS "createdAt",
  COALESCE((SELECT jsonb_agg(jsonb_build_object('model', g.model, 'allocated', g.allocation_id IS NOT NULL) ORDER BY g.index)
              FROM node_gpus g WHERE g.node_id = n.id), '[]') AS gpus`;

export async function listNodes(sql: Sql, poolId: string): Promise<Node[]> {
  return sql.query<Node>(`SELECT ${NODE_COLUMNS} FROM nodes n WHERE n.pool_id = $1 ORDER BY n.name`, [poolId]);
}

export async function getNode(sql: Sql, id: string): Promise<Node | undefined> {
  return one<Node>(sql, `SELECT ${NODE_COLUMNS} FROM nodes n WHERE n.id = $1`, [id]);
}

export const capacityInput = z.object({
  vcpus: z.number().int().min(0).max(4096),
  memoryMib: z
    .number()
    .int()
    .min(0)
    .max(64 * 1024 * 1024),
  diskGib: z
    .number()
    .int()
    .min(0)
    .max(1024 * 1024),
  gpus: z
    .array(
      gpuClaim.extend({
        count: z.number().int().min(0).max(64),
        pciAddresses: z.array(z.string().regex(/^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/)).nullish(),
      }),
    )
    .nullish()
    .superRefine((gpus, ctx) => {
      const models = new Set<string>();
      const addresses = new Set<string>();
      for (const [i, g] of (gpus ?? []).entries()) {
        if (models.has(g.model)) ctx.addIssue({ code: "custom", path: [i, "model"], message: `GPU model ${g.model} is listed twice; give one count` });
        models.add(g.model);
        if (!g.pciAddresses) continue;
        if (g.pciAddresses.length !== g.count) {
          ctx.addIssue({
            code: "custom",
            path: [i, "pciAddresses"],
            message: `${g.count} ${g.model} GPUs need ${g.count} PCI addresses, got ${g.pciAddresses.length}`,
          });
        }
        for (const a of g.pciAddresses) {
          if (addresses.has(a)) ctx.addIssue({ code: "custom", path: [i, "pciAddresses"], message: `PCI address ${a} appears more than once` });
          addresses.add(a);
        }
      }
    }),
});
export type CapacityInput = z.input<typeof capacityInput>;

/** A node made by hand (no agent yet): its capacity is what the operator says until its agent reports. */
export async function createNode(w: Write, raw: { poolId: string; name: string; capacity: CapacityInput }): Promise<Node> {
  const input = parseInput(z.object({ poolId: z.string(), name: resourceName, capacity: capacityInput }), raw);
  const pool = await requirePool(w.sql, input.poolId);
  requireCapability(pool, "hosts", "adding a node");
  if (await one(w.sql, `SELECT 1 FROM nodes WHERE pool_id = $1 AND name = $2`, [pool.id, input.name]))
    throw new AppError("CONFLICT", `node ${input.name} exists in pool ${pool.name}`);
  const id = w.ids("node");
  await w.sql.query(`INSERT INTO nodes (id, pool_id, name, created_at) VALUES ($1, $2, $3, $4)`, [id, pool.id, input.name, w.now]);
  await applyCapacity(w, id, input.capacity);
  w.audit({ targetId: id, details: { poolId: pool.id } });
  return (await getNode(w.sql, id)) as Node;
}

export async function setNodeCapacity(w: Write, nodeId: string, raw: CapacityInput): Promise<Node> {
  const capacity = parseInput(capacityInput, raw, "capacity");
  await applyCapacity(w, nodeId, capacity);
  w.audit({ targetId: nodeId, details: { vcpus: capacity.vcpus, memoryMib: capacity.memoryMib, diskGib: capacity.diskGib } });
  return (await getNode(w.sql, nodeId)) as Node;
}

/**
 * Set what a node offers. Shrinking below what is allocated is refused: instances already placed keep what
 * they were promised. GPUs are rows; only free ones are removed.
 */
async function applyCapacity(w: Write, nodeId: string, cap: z.output<typeof capacityInput>): Promise<void> {
  const locked = await one<{ vcpus: number; memoryMib: number; diskGib: number }>(
    w.sql,
    `SELECT alloc_vcpus AS vcpus, alloc_memory_mib::float8 AS "memoryMib", alloc_disk_gib::float8 AS "diskGib" FROM nodes WHERE id = $1 FOR UPDATE`,
    [nodeId],
  );
  if (!locked) throw notFound("node", nodeId);
  if (cap.vcpus < locked.vcpus || cap.memoryMib < locked.memoryMib || cap.diskGib < locked.diskGib) {
    throw new AppError("PRECONDITION_FAILED", `capacity below what node ${nodeId} has allocated`, { allocated: locked });
  }
  await w.sql.query(`UPDATE nodes SET cap_vcpus = $2, cap_memory_mib = $3, cap_disk_gib = $4 WHERE id = $1`, [nodeId, cap.vcpus, cap.memoryMib, cap.diskGib]);
  const existing = await w.sql.query<{ id: string; model: string; index: number; held: boolean }>(
    `SELECT id, model, index, allocation_id IS NOT NULL AS held FROM node_gpus WHERE node_id = $1 ORDER BY index`,
    [nodeId],
  );
  const wanted = new Map((cap.gpus ?? []).map((g) => [g.model, g]));
  for (const model of new Set(existing.map((g) => g.model))) {
    const have = existing.filter((g) => g.model === model);
    const surplus = have.length - (wanted.get(model)?.count ?? 0);
    if (surplus <= 0) continue;
    const free = have.filter((g) => !g.held).slice(-surplus);
    if (free.length < surplus) throw new AppError("PRECONDITION_FAILED", `node ${nodeId} has ${model} GPUs in use that this capacity would remove`);
    await w.sql.query(`DELETE FROM node_gpus WHERE id = ANY($1::text[])`, [free.map((g) => g.id)]);
  }
  let nextIndex = existing.reduce((m, g) => Math.max(m, g.index + 1), 0);
  for (const [model, g] of wanted) {
    const have = existing.filter((e) => e.model === model).length;
    for (let i = have; i < g.count; i++) {
      await w.sql.query(`INSERT INTO node_gpus (id, node_id, model, index, pci_address) VALUES ($1, $2, $3, $4, $5)`, [
        w.ids("gpu"),
        nodeId,
        model,
        nextIndex++,
        g.pciAddresses?.[i] ?? null,
      ]);
    }
  }
}

export async function setNodeState(w: Write, nodeId: string, state: "ready" | "cordoned"): Promise<Node> {
  const [row] = await w.sql.query(`UPDATE nodes SET state = $2 WHERE id = $1 RETURNING id`, [nodeId, state]);
  if (!row) throw notFound("node", nodeId);
  w.audit({ targetId: nodeId, details: { state } });
  return (await getNode(w.sql, nodeId)) as Node;
}

/** An operator's word that a host will not come back: its credential stops working and its instances are recreated elsewhere. */
export async function declareNodeGone(w: Write, nodeId: string): Promise<void> {
  const [node] = await w.sql.query<{ id: string; poolId: string }>(
    `UPDATE nodes SET gone_at = COALESCE(gone_at, $2), state = 'cordoned', credential_hash = NULL WHERE id = $1 RETURNING id, pool_id AS "poolId"`,
    [nodeId, w.now],
  );
  if (!node) throw notFound("node", nodeId);
  const rows = await w.sql.query<{ id: string }>(`SELECT id FROM instances WHERE node_id = $1 AND state <> 'deleted'`, [nodeId]);
  for (const r of rows) w.wake(r.id);
  w.revoke(`node:${nodeId}`);
  w.audit({ targetId: nodeId, details: { poolId: node.poolId, instances: rows.length } });
}
