import { z } from "zod";
import { AppError, notFound } from "../../contracts/errors.ts";
import { one, type Sql } from "../kernel/db.ts";
import { parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import type { GpuClaim } from "../tenancy/quota.ts";
import { type Shape, shape } from "./shapes.ts";

/**
 * Flavors are named shapes per pool. Instances copy the shape at admission, so editing or deleting a flavor
 * never changes what a running instance holds; it changes what the next create or resize gets.
 */
export interface Flavor {
  id: string;
  poolId: string;
  name: string;
  vcpus: number;
  memoryMib: number;
  diskGib: number;
  gpus: GpuClaim[];
  createdAt: Date;
  updatedAt: Date;
}

const COLUMNS = `id, pool_id AS "poolId", name, vcpus, memory_mib AS "memoryMib", disk_gib AS "diskGib", gpus, created_at AS "createdAt", updated_at AS "updatedAt"`;

const flavorName = z
  .string()
  .trim()
  .regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, "1 to 63 lower-case letters, digits, . _ -");

type GpuInput = { model: string; count: number }[] | null;

/** A flavor's pool, as the catalog needs it: its name, and its class's word on what it can sell. */
export interface FlavorPool {
  name: string;
  /** INVALID_INPUT for a shape the pool's class cannot sell. */
  checkFlavor(shape: Shape): void;
}

/**
 * Finds a flavor's pool (NOT_FOUND when there is none). The caller's: pool classes live outside the catalog, which
 * pools depend on (core/pools/pools.ts `flavorPool`).
 */
export type FlavorPools = (sql: Sql, poolId: string) => Promise<FlavorPool>;

export async function createFlavor(
  w: Write,
  raw: { poolId: string; name: string; vcpus: number; memoryMib: number; diskGib: number; gpus?: GpuInput },
  pools: FlavorPools,
): Promise<Flavor> {
  const { poolId, name, ...rest } = raw;
  const validName = parseInput(flavorName, name, "input.name");
  const s = parseInput(shape, { ...rest, gpus: rest.gpus ?? [] });
  const pool = await pools(w.sql, poolId);
  pool.checkFlavor(s);
  if (await one(w.sql, `SELECT 1 FROM flavors WHERE pool_id = $1 AND name = $2`, [poolId, validName]))
    throw new AppError("CONFLICT", `flavor ${validName} exists in pool ${pool.name}`);
  const [flavor] = await w.sql.query<Flavor>(
    `INSERT INTO flavors (id, pool_id, name, vcpus, memory_mib, disk_gib, gpus, created_at, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $8) RETURNING ${COLUMNS}`,
    [w.ids("flv"), poolId, validName, s.vcpus, s.memoryMib, s.diskGib, JSON.stringify(s.gpus), w.now],
  );
  const created = flavor as Flavor;
  w.audit({ targetId: created.id, details: { poolId, name: validName } });
  return created;
}

export async function updateFlavor(
  w: Write,
  id: string,
  raw: { vcpus?: number | null; memoryMib?: number | null; diskGib?: number | null; gpus?: GpuInput },
  pools: FlavorPools,
): Promise<Flavor> {
  const flavor = await one<Flavor>(w.sql, `SELECT ${COLUMNS} FROM flavors WHERE id = $1 FOR UPDATE`, [id]);
  if (!flavor) throw notFound("flavor", id);
  const pool = await pools(w.sql, flavor.poolId);
  const s = parseInput(shape, {
    vcpus: raw.vcpus ?? flavor.vcpus,
    memoryMib: raw.memoryMib ?? flavor.memoryMib,
    diskGib: raw.diskGib ?? flavor.diskGib,
    gpus: raw.gpus ?? flavor.gpus,
  });
  pool.checkFlavor(s);
  const [updated] = await w.sql.query<Flavor>(
    `UPDATE flavors SET vcpus = $2, memory_mib = $3, disk_gib = $4, gpus = $5::jsonb, updated_at = $6 WHERE id = $1 RETURNING ${COLUMNS}`,
    [id, s.vcpus, s.memoryMib, s.diskGib, JSON.stringify(s.gpus), w.now],
  );
  w.audit({ targetId: id, details: { vcpus: s.vcpus, memoryMib: s.memoryMib, diskGib: s.diskGib, gpus: s.gpus } });
  return updated as Flavor;
}

export async function deleteFlavor(w: Write, id: string): Promise<Flavor> {
  const [flavor] = await w.sql.query<Flavor>(`DELETE FROM flavors WHERE id = $1 RETURNING ${COLUMNS}`, [id]);
  if (!flavor) throw notFound("flavor", id);
  w.audit({ targetId: id, details: { poolId: flavor.poolId, name: flavor.name } });
  return flavor;
}

export async function listFlavors(sql: Sql, poolId: string): Promise<Flavor[]> {
  return sql.query<Flavor>(`SELECT ${COLUMNS} FROM flavors WHERE pool_id = $1 ORDER BY name`, [poolId]);
}

/** A pool's flavor by name, for admission and resize. */
export async function flavorByName(sql: Sql, poolId: string, name: string): Promise<Flavor | undefined> {
  return one<Flavor>(sql, `SELECT ${COLUMNS} FROM flavors WHERE pool_id = $1 AND name = $2`, [poolId, name]);
}
