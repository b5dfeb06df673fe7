import { createApiToken } from "../core/auth/tokens.ts";
import { createFlavor } from "../core/catalog/flavors.ts";
import { registerImage } from "../core/catalog/images.ts";
import { one } from "../core/kernel/db.ts";
import { createJoinToken } from "../core/pools/hosted/enrollment.ts";
import { createPool } from "../core/pools/pools.ts";
import { createTenant } from "../core/tenancy/tenants.ts";
import { persistentSecret } from "../infra/data-dir.ts";
import type { Platform } from "../infra/platform.ts";

/**
 * The quick start's world: a hosted pool with flavors and a public image, a demo tenant with a token, and a
 * join token per simulated host. Made once, in one write; later starts reuse it (and the hosts keep their
 * credentials).
 */
export async function seedQuickStart(platform: Platform, hosts: number) {
  const made = await platform.write({ actor: "quick-start" }, async (w) => {
    const existing = await one<{ poolId: string; imageId: string }>(
      w.sql,
      `SELECT p.id AS "poolId", (SELECT id FROM images WHERE name = 'debian-12' AND tenant_id IS NULL ORDER BY created_at LIMIT 1) AS "imageId"
         FROM pools p WHERE p.name = 'local'`,
    );
    if (existing) return { ...existing, token: null };
    const pool = await createPool(w, { name: "local", class: "vps-host", ipv4Range: "10.77.0.0/24" }, platform.drivers);
    for (const f of [
      { name: "small", vcpus: 1, memoryMib: 1024, diskGib: 10 },
      { name: "medium", vcpus: 2, memoryMib: 4096, diskGib: 40 },
      { name: "large", vcpus: 4, memoryMib: 8192, diskGib: 80 },
    ])
      await createFlavor(w, { poolId: pool.id, ...f });
    const image = await registerImage(
      w,
      { identityId: "quick-start", tenantId: null, operator: true, scopes: new Set() },
      { name: "debian-12", source: "https://images.invalid/debian-12-genericcloud-amd64.qcow2", sha256: "0".repeat(64), format: "qcow2", public: true },
    );
    const tenant = await createTenant(w, { name: "demo" });
    const { token } = await createApiToken(w, { tenantId: tenant.id, name: "quick-start" });
    return { poolId: pool.id, imageId: image.id, token };
  });
  const tenantToken = persistentSecret(platform.config.dataDir, "demo-token", () => made.token ?? "");
  const joinTokens: string[] = [];
  for (let i = 0; i < hosts; i++) {
    const jt = await platform.write({ actor: "quick-start" }, (w) => createJoinToken(w, made.poolId, 3600));
    joinTokens.push(jt.token);
  }
  return { ...made, tenantToken, joinTokens };
}
