import { z } from "zod";
import { AppError, notFound } from "../../contracts/errors.ts";
import { type Principal, visibleTo } from "../auth/principal.ts";
import type { FlavorPool } from "../catalog/flavors.ts";
import { INSTANCE_COLUMNS, type Instance } from "../instances/model.ts";
import { one, type Sql, type Statement } from "../kernel/db.ts";
import { parseInput, resourceName } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import type { DriverDeps, Pool, PoolInput } from "./driver.ts";
import { driverFor } from "./registry.ts";

const poolInput = z.object({
  name: resourceName,
  class: z.string(),
  ipv4Range: z.string().nullish(),
  ipv4Gateway: z.string().nullish(),
  providerAccountId: z.string().nullish(),
  singleTenant: z.boolean().nullish(),
});

export const POOL_COLUMNS = `id, name, class, agent, runtime, provider_account_id AS "providerAccountId",
  COALESCE((policy->>'singleTenant')::boolean, false) AS "singleTenant", created_at AS "createdAt"`;

/** A pool of any class: its driver checks what the class needs (a range, an account) and keeps what it adds. */
export async function createPool(w: Write, raw: PoolInput, deps: Pick<DriverDeps, "runtimes">): Promise<Pool> {
  const input = parseInput(poolInput, raw);
  const driver = driverFor(input.class);
  const settings = await driver.prepare(w.sql, input, deps);
  if (await one(w.sql, `SELECT 1 FROM pools WHERE name = $1`, [input.name])) throw new AppError("CONFLICT", `pool ${input.name} exists`);
  const [pool] = await w.sql.query<Pool>(
    `INSERT INTO pools (id, name, class, agent, runtime, provider_account_id, policy, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8) RETURNING ${POOL_COLUMNS}`,
    [
      w.ids("pool"),
      input.name,
      input.class,
      settings.agent,
      settings.runtime,
      settings.providerAccountId,
      JSON.stringify({ singleTenant: input.singleTenant ?? false }),
      w.now,
    ],
  );
  const created = pool as Pool;
  await driver.provision(w, created, input);
  w.audit({ targetId: created.id, details: { class: created.class, ipv4Range: input.ipv4Range ?? null } });
  return created;
}

export async function listPools(sql: Sql): Promise<Pool[]> {
  return sql.query<Pool>(`SELECT ${POOL_COLUMNS} FROM pools ORDER BY name`);
}

/** A pool as a statement returns it in JSON (its timestamp as text). */
export type PoolJson = Omit<Pool, "createdAt"> & { createdAt: string };
export const poolFromJson = (p: PoolJson): Pool => ({ ...p, createdAt: new Date(p.createdAt) });

/**
 * lockInstance with the instance's pool read in the same statement (a pool's columns never change under an
 * instance, so the statement's snapshot of it is as good as any): one round trip where the caller needs both.
 * Null when there is no such instance, or `who` may not see it (or, which cannot happen while it exists, no pool).
 */
export async function lockInstanceAndPool(w: Write, who: Principal | null, id: string): Promise<{ inst: Instance; pool: Pool } | null> {
  const st = lockInstanceAndPoolStatement(id);
  return heldInstanceAndPool(await w.sql.query<InstanceAndPoolRow>(st.text, st.params), who);
}

type InstanceAndPoolRow = Instance & { pool: PoolJson | null };

/** lockInstanceAndPool's statement, for a caller that sends it with others (Sql.batch); heldInstanceAndPool reads its rows. */
export function lockInstanceAndPoolStatement(id: string): Statement {
  return {
    text: `SELECT ${INSTANCE_COLUMNS}, (SELECT row_to_json(p) FROM (SELECT ${POOL_COLUMNS} FROM pools WHERE pools.id = instances.pool_id) p) AS pool
             FROM instances WHERE id = $1 FOR UPDATE`,
    params: [id],
  };
}

export function heldInstanceAndPool(rows: unknown[], who: Principal | null): { inst: Instance; pool: Pool } | null {
  const [row] = rows as InstanceAndPoolRow[];
  if (!row?.pool || (who && !visibleTo(who, row.tenantId))) return null;
  const { pool, ...inst } = row;
  return { inst, pool: poolFromJson(pool) };
}

export async function getPool(sql: Sql, id: string): Promise<Pool | undefined> {
  return one<Pool>(sql, `SELECT ${POOL_COLUMNS} FROM pools WHERE id = $1`, [id]);
}

/** A pool the caller names or an instance belongs to: NOT_FOUND when there is none. */
export async function requirePool(sql: Sql, id: string): Promise<Pool> {
  const pool = await getPool(sql, id);
  if (!pool) throw notFound("pool", id);
  return pool;
}

/** A flavor's pool for the catalog's checks (core/catalog/flavors.ts): NOT_FOUND when there is none. */
export async function flavorPool(sql: Sql, id: string): Promise<FlavorPool> {
  const pool = await requirePool(sql, id);
  const driver = driverFor(pool.class);
  return { name: pool.name, checkFlavor: (shape) => driver.checkFlavor(shape) };
}
