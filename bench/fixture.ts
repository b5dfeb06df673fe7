import { randomBytes } from "node:crypto";
import { createApiToken } from "../core/auth/tokens.ts";
import { createFlavor } from "../core/catalog/flavors.ts";
import { registerImage } from "../core/catalog/images.ts";
import { type AdmissionDeps, admitInstance } from "../core/lifecycle/admission.ts";
import { createNode } from "../core/pools/hosted/nodes.ts";
import { createPool, flavorPool } from "../core/pools/pools.ts";
import type { QuotaInput } from "../core/tenancy/quota.ts";
import { createTenant } from "../core/tenancy/tenants.ts";
import type { Platform } from "../infra/platform.ts";

/** The fixture's one flavor; bench/admission-write-set.sql charges the same. */
export const SMALL = { vcpus: 1, memoryMib: 512, diskGib: 5 } as const;

/**
 * What the benchmarks run on, made through the core directly: a hosted pool of `nodes` large nodes with a
 * `small` flavor and a public image, `tenants` tenants with a token each (and `quota`, if given), and
 * `instances` admitted instances (owned by the first tenant). `hostRoom`: creates of `small` each node must
 * take, beyond the most an agent may report, so a long run never finds the hosts full.
 */
export async function hostedFixture(platform: Platform, opts: { nodes?: number; tenants?: number; instances?: number; quota?: QuotaInput; hostRoom?: number }) {
  const fx = await platform.write({ actor: "bench" }, async (w) => {
    const pool = await createPool(w, { name: "bench", class: "vps-host", ipv4Range: "10.200.0.0/16" }, { runtimes: ["libvirt-kvm"] });
    for (let i = 0; i < (opts.nodes ?? 1); i++)
      await createNode(w, { poolId: pool.id, name: `n${i}`, capacity: { vcpus: 4096, memoryMib: 4_194_304, diskGib: 100_000 } });
    if (opts.hostRoom)
      await w.sql.query(
        `UPDATE nodes SET cap_vcpus = GREATEST(cap_vcpus, $2::int * $3), cap_memory_mib = GREATEST(cap_memory_mib, $2::bigint * $4),
                cap_disk_gib = GREATEST(cap_disk_gib, $2::bigint * $5) WHERE pool_id = $1`,
        [pool.id, opts.hostRoom, SMALL.vcpus, SMALL.memoryMib, SMALL.diskGib],
      );
    await createFlavor(w, { poolId: pool.id, name: "small", ...SMALL }, flavorPool);
    const image = await registerImage(
      w,
      { identityId: "bench", tenantId: null, operator: true, scopes: new Set() },
      { name: "img", source: "https://images.invalid/i.qcow2", sha256: "a".repeat(64), format: "qcow2", public: true },
    );
    const tenants = [];
    for (let i = 0; i < Math.max(1, opts.tenants ?? 1); i++) {
      const tenant = await createTenant(w, { name: `bench-${i}`, ...(opts.quota ? { quota: opts.quota } : {}) });
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

/** What the API's createInstance admits with (its remembered catalogs included), keys made here. */
export const admissionDeps = (platform: Platform): AdmissionDeps => ({
  ...platform.admission,
  newIdempotencyKey: () => randomBytes(8).toString("hex"),
});
