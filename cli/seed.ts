import { createApiToken } from "../core/auth/tokens.ts";
import { createFlavor } from "../core/catalog/flavors.ts";
import { registerImage } from "../core/catalog/images.ts";
import { one } from "../core/kernel/db.ts";
import { createJoinToken } from "../core/pools/hosted/enrollment.ts";
import { createPool, flavorPool } from "../core/pools/pools.ts";
import { createProviderAccount } from "../core/pools/provider/accounts.ts";
import { createTenant } from "../core/tenancy/tenants.ts";
import { persistentSecret } from "../infra/data-dir.ts";
import type { Platform } from "../infra/platform.ts";
import { accountFences } from "../infra/providers.ts";
import type { ProviderEmulator } from "../providers/emulator.ts";

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
      await createFlavor(w, { poolId: pool.id, ...f }, flavorPool);
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

/**
 * The quick start's provider pool: an account `cloud` on the in-process Hetzner Cloud emulator, a pool `cloud`
 * on it and a flavor. The emulator forgets its machines when `bc dev` stops and listens anew each start, so the
 * account is pointed at this start's emulator and token every time (machines of an earlier start are lost).
 */
export async function seedProviderPool(platform: Platform, emu: ProviderEmulator): Promise<{ poolId: string; image: string }> {
  const credentials = (accountId: string) =>
    Object.fromEntries(
      Object.entries(emu.credentials).map(([k, v]) => [k, `sealed:${Buffer.from(platform.sealer.seal(v, `${accountId}/${k}`)).toString("base64")}`]),
    );
  const poolId = await platform.write({ actor: "quick-start" }, async (w) => {
    const existing = await one<{ accountId: string; poolId: string }>(
      w.sql,
      `SELECT a.id AS "accountId", p.id AS "poolId" FROM provider_accounts a JOIN pools p ON p.provider_account_id = a.id WHERE p.name = 'cloud'`,
    );
    if (existing) {
      await w.sql.query(`UPDATE provider_accounts SET config = $2::jsonb, credentials = $3::jsonb WHERE id = $1`, [
        existing.accountId,
        JSON.stringify(emu.config),
        JSON.stringify(credentials(existing.accountId)),
      ]);
      w.wakeProviders(existing.accountId);
      return existing.poolId;
    }
    const account = await createProviderAccount(
      w,
      { providers: platform.config.vps.providers, sealer: platform.sealer, fences: accountFences(platform.config) },
      {
        name: "cloud",
        provider: emu.provider,
        config: emu.config,
        credentials: Object.fromEntries(Object.entries(emu.credentials).map(([k, value]) => [k, { value }])),
      },
    );
    const pool = await createPool(w, { name: "cloud", class: "provider", providerAccountId: account.id }, platform.drivers);
    await createFlavor(w, { poolId: pool.id, name: "small", vcpus: 2, memoryMib: 4096, diskGib: 40 }, flavorPool);
    return pool.id;
  });
  return { poolId, image: emu.images[0] as string };
}
