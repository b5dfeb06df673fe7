import { createFlavor } from "../core/catalog/flavors.ts";
import { registerImage } from "../core/catalog/images.ts";
import { createJoinToken } from "../core/pools/hosted/hosts.ts";
import { createPool } from "../core/pools/pools.ts";
import { createApiToken, createTenant } from "../core/tenancy/tenants.ts";
import { persistentSecret } from "../infra/config.ts";
import type { Platform } from "../infra/platform.ts";

/**
 * The quick start's world: a hosted pool with flavors and a public image, a demo tenant with a token, and a
 * join token per simulated host. Made once; later starts reuse it (and the hosts keep their credentials).
 */
export async function seedQuickStart(platform: Platform, hosts: number) {
  const ctx = { ids: platform.ids, actor: "quick-start", now: platform.now() };
  const made = await platform.transact(async (tx) => {
    const existing = await tx.pool.findUnique({ where: { name: "local" } });
    if (existing) {
      const image = await tx.image.findFirstOrThrow({ where: { name: "debian-12", tenantId: null } });
      return { poolId: existing.id, imageId: image.id, token: null };
    }
    const pool = await createPool(
      tx,
      { ...ctx, runtime: platform.config.vps.runtimes[0] as string },
      { name: "local", class: "vps-host", ipv4Range: "10.77.0.0/24" },
    );
    for (const f of [
      { name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 },
      { name: "medium", vcpus: 2, memoryMib: 4096, diskGib: 40 },
      { name: "large", vcpus: 4, memoryMib: 8192, diskGib: 80 },
    ])
      await createFlavor(tx, ctx, { poolId: pool.id, ...f });
    const image = await registerImage(
      tx,
      platform.ids,
      { identityId: "quick-start", tenantId: null, operator: true, scopes: new Set() },
      { name: "debian-12", source: "https://images.invalid/debian-12-genericcloud-amd64.qcow2", sha256: "0".repeat(64), format: "qcow2", public: true },
    );
    const tenant = await createTenant(tx, ctx, { name: "demo" });
    const { token } = await createApiToken(tx, ctx, { tenantId: tenant.id, name: "quick-start" });
    return { poolId: pool.id, imageId: image.id, token };
  });
  const tenantToken = persistentSecret(platform.config.dataDir, "demo-token", () => made.token ?? "");
  const joinTokens: string[] = [];
  for (let i = 0; i < hosts; i++) {
    const jt = await platform.write((sql) => createJoinToken(sql, platform.ids, made.poolId, 3600, platform.now()));
    joinTokens.push(jt.token);
  }
  return { ...made, tenantToken, joinTokens };
}
