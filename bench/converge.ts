import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { startAgent } from "../agent/index.ts";
import { createFakeRuntime } from "../agent/runtimes/fake.ts";
import * as bc from "../sdk/client.ts";
import { startServer } from "../server/app.ts";
import { startWorker } from "../worker/index.ts";
import { benchPlatform } from "./lib.ts";

const { values } = parseArgs({
  options: { hosts: { type: "string", default: "3" }, sizes: { type: "string", default: "100,500,1000,2000" }, concurrency: { type: "string", default: "16" } },
});
const hosts = Number(values.hosts);
const sizes = String(values.sizes).split(",").map(Number);
const concurrency = Number(values.concurrency);

async function once(n: number) {
  const dir = mkdtempSync(join(tmpdir(), "bc-conv-"));
  const { platform, operatorToken, close } = await benchPlatform({ poolSize: 12, env: { RECONCILE_SWEEP_MS: "1000" } });
  const database = platform.db;
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
  await close();
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
