import type { ResolvedImage } from "../catalog/images.ts";
import type { Shape } from "../catalog/shapes.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import type { PoolJson } from "../pools/pools.ts";

/**
 * What a create reads of the catalog before it can place anything: the pool, the flavor's shape in it, whether
 * the project is the tenant's, and the image where the resolver says it in SQL (absent otherwise). Null or false
 * where there is no such thing, or the tenant may not see it.
 */
export interface Catalog {
  pool: PoolJson | null;
  flavor: (Shape & { name: string }) | null;
  projectOk: boolean;
  image?: ResolvedImage | null;
}

/** What the catalog is read by (each bound once, however often the statement reads it). */
export interface CatalogKeys {
  pool: Fragment;
  flavor: Fragment;
  project: Fragment;
  tenant: Fragment;
  image: Fragment;
}

/**
 * The catalog as one jsonb value, read by the create's lookup and read again by admission's statement when the
 * lookup was remembered (`lookupCache`): the same expression both times, so "unchanged" is jsonb equality.
 */
export function catalogSql(k: CatalogKeys, image?: (imageId: Fragment, tenantId: Fragment) => Fragment): Fragment {
  return SQL`(SELECT jsonb_build_object(
       'pool', CASE WHEN p.id IS NULL THEN NULL ELSE jsonb_build_object('id', p.id, 'name', p.name, 'class', p.class, 'agent', p.agent,
         'runtime', p.runtime, 'providerAccountId', p.provider_account_id,
         'singleTenant', COALESCE((p.policy->>'singleTenant')::boolean, false), 'createdAt', p.created_at) END,
       'flavor', (SELECT jsonb_build_object('name', f.name, 'vcpus', f.vcpus, 'memoryMib', f.memory_mib, 'diskGib', f.disk_gib, 'gpus', f.gpus)
                    FROM flavors f WHERE f.pool_id = p.id AND f.name = ${k.flavor}),
       'projectOk', (${k.project}::text IS NULL OR EXISTS (SELECT 1 FROM projects WHERE id = ${k.project} AND tenant_id = ${k.tenant}))
       ${image ? SQL`, 'image', ${image(k.image, k.tenant)}` : SQL.empty})
     FROM (SELECT 1) one LEFT JOIN pools p ON p.id = ${k.pool})`;
}

/** A catalog that admits a create: everything found and visible. Only these are remembered. */
export const admits = (c: Catalog): boolean => !!c.pool && !!c.flavor && c.projectOk && c.image !== null;

export interface LookupCache {
  get(key: string): Catalog | undefined;
  set(key: string, catalog: Catalog): void;
  forget(key: string): void;
}

/**
 * Catalogs this process has read for creates, by tenant and what the create named, so a create like one before
 * it is admission's one statement instead of a lookup and then that statement (each message to PostgreSQL
 * costs both ends CPU, and admission is bound by it). Never trusted: the statement compares the catalog it reads
 * with the remembered one and takes nothing when they differ; the create is then run again from a fresh lookup
 * and the entry is forgotten. So a change to a pool, flavor, project or image needs no message to reach here.
 * Bounded: past `max` entries the oldest goes.
 */
export function lookupCache(max = 1024): LookupCache {
  const entries = new Map<string, Catalog>();
  return {
    get: (key) => entries.get(key),
    set(key, catalog) {
      entries.delete(key);
      entries.set(key, catalog);
      if (entries.size > max) entries.delete(entries.keys().next().value as string);
    },
    forget: (key) => void entries.delete(key),
  };
}
