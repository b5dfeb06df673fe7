import { randomBytes } from "node:crypto";
import { createFlavor } from "../core/catalog/flavors.ts";
import { registerImage } from "../core/catalog/images.ts";
import { admitInstance } from "../core/instances/admission.ts";
import { createNode, createPool } from "../core/pools/pools.ts";
import { createApiToken, createTenant } from "../core/tenancy/tenants.ts";
import type { Platform } from "../infra/platform.ts";

/**
 * What the benchmarks run on, made through the core directly: a hosted pool of `nodes` large nodes with a
 * `small` flavor and a public image, `tenants` tenants with a token each, and `instances` admitted instances
 * (owned by the first tenant).
 */
export async function hostedFixture(platform: Platform, opts: { nodes?: number; tenants?: number; instances?: number }) {
  const ctx = { ids: platform.ids, actor: "bench", now: platform.now() };
  const fx = await platform.transact(async (tx) => {
    const pool = await createPool(tx, { ...ctx, runtime: "libvirt-kvm" }, { name: "bench", class: "vps-host", ipv4Range: "10.200.0.0/16" });
    for (let i = 0; i < (opts.nodes ?? 1); i++)
      await createNode(tx, ctx, { poolId: pool.id, name: `n${i}`, capacity: { vcpus: 4096, memoryMib: 4_194_304, diskGib: 100_000 } });
    await createFlavor(tx, ctx, { poolId: pool.id, name: "small", vcpus: 1, memoryMib: 512, diskGib: 5 });
    const image = await registerImage(
      tx,
      platform.ids,
      { identityId: "bench", tenantId: null, operator: true, scopes: new Set() },
      { name: "img", source: "https://images.invalid/i.qcow2", sha256: "a".repeat(64), format: "qcow2", public: true },
    );
    const tenants = [];
    for (let i = 0; i < Math.max(1, opts.tenants ?? 1); i++) {
      const t = await createTenant(tx, ctx, { name: `bench-${i}` });
      tenants.push({ tenant: t, ...(await createApiToken(tx, ctx, { tenantId: t.id, name: "bench" })) });
    }
    return { poolId: pool.id, imageId: image.id, tenants };
  });
  const instanceIds: string[] = [];
  const owner = fx.tenants[0] as (typeof fx.tenants)[number];
  for (let i = 0; i < (opts.instances ?? 0); i++) {
    const admitted = await platform.write((sql) =>
      admitInstance(
        sql,
        admissionDeps(platform),
        { identityId: owner.identity.id, tenantId: owner.tenant.id },
        { poolId: fx.poolId, flavor: "small", imageId: fx.imageId, idempotencyKey: `fixture-${i}` },
      ),
    );
    instanceIds.push(admitted.instance.id);
  }
  return { ...fx, instanceIds };
}

export const admissionDeps = (platform: Platform) => ({
  ids: platform.ids,
  images: platform.images,
  sealer: platform.sealer,
  runtimes: ["libvirt-kvm"],
  now: platform.now,
  newIdempotencyKey: () => randomBytes(8).toString("hex"),
});
