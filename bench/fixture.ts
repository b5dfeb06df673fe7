import { randomBytes } from "node:crypto";
import { createApiToken } from "../core/auth/tokens.ts";
import { createFlavor } from "../core/catalog/flavors.ts";
import { registerImage } from "../core/catalog/images.ts";
import { type AdmissionDeps, admitInstance } from "../core/instances/admission.ts";
import { createNode } from "../core/pools/hosted/nodes.ts";
import { createPool } from "../core/pools/pools.ts";
import { createTenant } from "../core/tenancy/tenants.ts";
import type { Platform } from "../infra/platform.ts";

/**
 * What the benchmarks run on, made through the core directly: a hosted pool of `nodes` large nodes with a
 * `small` flavor and a public image, `tenants` tenants with a token each, and `instances` admitted instances
 * (owned by the first tenant).
 */
export async function hostedFixture(platform: Platform, opts: { nodes?: number; tenants?: number; instances?: number }) {
  const fx = await platform.write({ actor: "bench" }, async (w) => {
    const pool = await createPool(w, { name: "bench", class: "vps-host", ipv4Range: "10.200.0.0/16" }, { runtimes: ["libvirt-kvm"] });
    for (let i = 0; i < (opts.nodes ?? 1); i++)
      await createNode(w, { poolId: pool.id, name: `n${i}`, capacity: { vcpus: 4096, memoryMib: 4_194_304, diskGib: 100_000 } });
    await createFlavor(w, { poolId: pool.id, name: "small", vcpus: 1, memoryMib: 512, diskGib: 5 });
    const image = await registerImage(
      w,
      { identityId: "bench", tenantId: null, operator: true, scopes: new Set() },
      { name: "img", source: "https://images.invalid/i.qcow2", sha256: "a".repeat(64), format: "qcow2", public: true },
    );
    const tenants = [];
    for (let i = 0; i < Math.max(1, opts.tenants ?? 1); i++) {
      const tenant = await createTenant(w, { name: `bench-${i}` });
      tenants.push({ tenant, ...(await createApiToken(w, { tenantId: tenant.id, name: "bench" })) });
    }
    return { poolId: pool.id, imageId: image.id, tenants };
  });
  const instanceIds: string[] = [];
  const owner = fx.tenants[0] as (typeof fx.tenants)[number];
  for (let i = 0; i < (opts.instances ?? 0); i++) {
    const inst = await platform.write({ actor: owner.apiToken.identityId, action: "createInstance" }, (w) =>
      admitInstance(
        w,
        admissionDeps(platform),
        { identityId: owner.apiToken.identityId, tenantId: owner.tenant.id },
        { poolId: fx.poolId, flavor: "small", imageId: fx.imageId, idempotencyKey: `fixture-${i}` },
      ),
    );
    instanceIds.push(inst.id);
  }
  return { ...fx, instanceIds };
}

export const admissionDeps = (platform: Platform): AdmissionDeps => ({
  ...platform.drivers,
  sealer: platform.sealer,
  newIdempotencyKey: () => randomBytes(8).toString("hex"),
});
