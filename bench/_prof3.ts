import { randomBytes } from "node:crypto";
import { admitInstance } from "../core/admission.ts";
import { parseConfig } from "../core/config.ts";
import { openDatabase } from "../infra/db/index.ts";
import { migrate } from "../infra/db/migrate.ts";
import { openPlatform } from "../infra/platform.ts";
import { scratchDatabase } from "./lib.ts";

const db = await scratchDatabase("bc_prof");
const database = await openDatabase({ databaseUrl: db.url, poolSize: 4 });
await database.session((sql) => migrate(sql));
const config = parseConfig({}, { DATABASE_URL: db.url, OPERATOR_TOKEN: "x".repeat(20), SEAL_KEY: randomBytes(32).toString("base64"), LOG_LEVEL: "warn" });
const platform = await openPlatform(config, { db: database });
const { createTenant } = await import("../core/tenants.ts");
const { createPool, createNode } = await import("../core/pools.ts");
const { createFlavor } = await import("../core/flavors.ts");
const { registerImage } = await import("../core/images.ts");
const ctx = { ids: platform.ids, actor: "b", now: new Date() };
const fx = await platform.transact(async (tx) => {
  const pool = await createPool(tx, { ...ctx, runtime: "x" }, { name: "b", class: "vps-host", ipv4Range: "10.200.0.0/16" });
  for (let i = 0; i < 20; i++) await createNode(tx, ctx, { poolId: pool.id, name: `n${i}`, capacity: { vcpus: 4096, memoryMib: 4194304, diskGib: 100000 } });
  await createFlavor(tx, ctx, { poolId: pool.id, name: "small", vcpus: 1, memoryMib: 512, diskGib: 5 });
  const image = await registerImage(
    tx,
    platform.ids,
    { identityId: "b", tenantId: null, operator: true, scopes: new Set() },
    { name: "i", source: "https://x.invalid/i", sha256: "a".repeat(64), format: "qcow2", public: true },
  );
  const t = await createTenant(tx, ctx, { name: "t" });
  return { pool, image, t };
});
const deps = { ids: platform.ids, images: platform.images, sealer: platform.sealer, runtimes: ["x"], now: platform.now, newIdempotencyKey: () => "k" };
const N = Number(process.argv[2] ?? 2000);
let times: Record<string, number[]> = {};
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!;
for (let n = 0; n < N; n++) {
  if (n % 1000 === 0) times = {};
  await platform.write(async (sql) => {
    const timed = {
      query: async (text: string, params?: readonly unknown[]) => {
        const s = performance.now();
        try {
          return await sql.query(text, params);
        } finally {
          (times[text.replace(/\s+/g, " ").slice(0, 50)] ??= []).push(performance.now() - s);
        }
      },
    };
    await admitInstance(
      timed as never,
      deps,
      { identityId: "idn", tenantId: fx.t.id },
      { poolId: fx.pool.id, flavor: "small", imageId: fx.image.id, idempotencyKey: `k${n}` },
    );
  });
}
console.log(`last ${N % 1000 || 1000} of ${N}:`);
for (const [k, v] of Object.entries(times).sort((a, b) => med(b[1]) - med(a[1]))) console.log(med(v).toFixed(2), "ms", k);
await platform.close();
await db.drop();
process.exit(0);
