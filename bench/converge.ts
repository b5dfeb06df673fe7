/**
 * Convergence at scale: N instances created on M simulated hosts, time from the first create to all running.
 *
 *   npm run bench:converge -- [--hosts 3] [--sizes 100,500,1000,2000] [--concurrency 16]
 *
 * One process holds the server, a BullMQ worker and M agents (fake runtime, no delays) on this machine's
 * PostgreSQL and Redis; each size starts from an empty database. Prints seconds, instances per second, and how
 * the time grows from one size to the next (1.0 per doubling of N would be linear).
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { startAgent } from "../agent/index.ts";
import { createFakeRuntime } from "../agent/runtimes/fake.ts";
import { parseConfig } from "../core/config.ts";
import { openDatabase } from "../infra/db/index.ts";
import { migrate } from "../infra/db/migrate.ts";
import { openPlatform } from "../infra/platform.ts";
import * as bc from "../sdk/client.ts";
import { startServer } from "../server/app.ts";
import { startWorker } from "../worker/index.ts";
import { scratchDatabase } from "./lib.ts";

const { values } = parseArgs({
  options: { hosts: { type: "string", default: "3" }, sizes: { type: "string", default: "100,500,1000,2000" }, concurrency: { type: "string", default: "16" } },
});
const hosts = Number(values.hosts);
const sizes = String(values.sizes).split(",").map(Number);
const concurrency = Number(values.concurrency);
const redisUrl = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";

async function once(n: number) {
  const db = await scratchDatabase("bc_conv");
  const dir = mkdtempSync(join(tmpdir(), "bc-conv-"));
  const database = await openDatabase({ databaseUrl: db.url, poolSize: 12 });
  await database.session((sql) => migrate(sql));
  const operatorToken = randomBytes(20).toString("hex");
  const config = parseConfig(
    {},
    {
      DATABASE_URL: db.url,
      REDIS_URL: redisUrl,
      REDIS_PREFIX: `bcconv_${randomBytes(3).toString("hex")}`,
      OPERATOR_TOKEN: operatorToken,
      SEAL_KEY: randomBytes(32).toString("base64"),
      LOG_LEVEL: "error",
      RECONCILE_SWEEP_MS: "1000",
    },
  );
  const platform = await openPlatform(config, { db: database });
  const app = await startServer(platform, { port: 0, host: "127.0.0.1" });
  const worker = await startWorker(platform);
  const op = bc.createClient({ url: app.url, token: operatorToken });
  const { createPool: pool } = await op.request(bc.CreatePoolDocument, { input: { name: "bench", class: "VPS_HOST", ipv4Range: "10.100.0.0/20" } });
  await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, name: "tiny", vcpus: 1, memoryMib: 256, diskGib: 2 } });
  const { registerImage: image } = await op.request(bc.RegisterImageDocument, {
    input: { name: "i", source: "https://images.invalid/i.qcow2", sha256: "b".repeat(64), format: "QCOW2", public: true },
  });
  const { createTenant } = await op.request(bc.CreateTenantDocument, { input: { name: "bench" } });
  const { createApiToken } = await op.request(bc.CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "bench" } });
  const tenant = bc.createClient({ url: app.url, token: createApiToken.token });
  const agents = [];
  for (let i = 0; i < hosts; i++) {
    const { createJoinToken } = await op.request(bc.CreateJoinTokenDocument, { poolId: pool.id });
    const stateDir = join(dir, `host-${i}`);
    agents.push(
      await startAgent({
        server: app.url,
        joinToken: createJoinToken.token,
        name: `h${i}`,
        stateDir,
        heartbeatMs: 2000,
        runtime: createFakeRuntime({ dir: join(stateDir, "fake"), capacity: { vcpus: 4096, memoryMib: 4_194_304, diskGib: 100_000, gpus: [] } }),
      }),
    );
  }
  const running = () => database.prisma.instance.count({ where: { state: "running" } });
  while ((await database.prisma.node.count({ where: { capVcpus: { gt: 0 } } })) < hosts) await new Promise((r) => setTimeout(r, 50));

  const start = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const k = next++;
        await tenant.request(bc.CreateInstanceDocument, { input: { poolId: pool.id, flavor: "tiny", imageId: image.id, idempotencyKey: `b${k}` } });
      }
    }),
  );
  const created = (performance.now() - start) / 1000;
  while ((await running()) < n) {
    if (performance.now() - start > 20 * 60_000) throw new Error(`only ${await running()} of ${n} running after 20 minutes`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const seconds = (performance.now() - start) / 1000;
  for (const a of agents) await a.close();
  await worker.close();
  await app.close();
  await platform.close();
  await db.drop();
  rmSync(dir, { recursive: true, force: true });
  return { seconds, created };
}

console.log(`converge bench: ${hosts} simulated hosts, ${concurrency} concurrent creates, sizes ${sizes.join(", ")}`);
console.log("     N   all running   creates done   instances/s   growth vs previous size");
let prev: { n: number; seconds: number } | null = null;
for (const n of sizes) {
  const r = await once(n);
  // Growth exponent: time ∝ N^k between two sizes; k = 1 is linear.
  const k = prev ? Math.log(r.seconds / prev.seconds) / Math.log(n / prev.n) : null;
  console.log(
    `${String(n).padStart(6)}   ${r.seconds.toFixed(1).padStart(9)} s   ${r.created.toFixed(1).padStart(10)} s   ${(n / r.seconds).toFixed(1).padStart(11)}   ${k === null ? "—" : `time ∝ N^${k.toFixed(2)}`}`,
  );
  prev = { n, seconds: r.seconds };
}
process.exit(0);
