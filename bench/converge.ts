import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { startAgent } from "../agent/index.ts";
import { createFakeRuntime } from "../agent/runtimes/fake/index.ts";
import * as bc from "../sdk/client.ts";
import { benchApi } from "./lib.ts";

const { values } = parseArgs({
  options: { hosts: { type: "string", default: "3" }, sizes: { type: "string", default: "100,500,1000,2000" }, concurrency: { type: "string", default: "16" } },
});
const hosts = Number(values.hosts);
const sizes = String(values.sizes).split(",").map(Number);
const concurrency = Number(values.concurrency);

async function once(n: number) {
  const dir = mkdtempSync(join(tmpdir(), "bc-conv-"));
  const api = await benchApi({
    poolSize: 12,
    env: { RECONCILE_SWEEP_MS: "1000" },
    ipv4Range: "10.100.0.0/20",
    tiny: { vcpus: 1, memoryMib: 256, diskGib: 2 },
    image: { source: "https://images.invalid/i.qcow2", sha256: "b".repeat(64) },
  });
  const agents = [];
  for (let i = 0; i < hosts; i++) {
    const stateDir = join(dir, `host-${i}`);
    agents.push(
      await startAgent({
        server: api.url,
        joinToken: await api.joinToken(),
        name: `h${i}`,
        stateDir,
        heartbeatMs: 2000,
        runtime: createFakeRuntime({ dir: join(stateDir, "fake"), capacity: { vcpus: 4096, memoryMib: 4_194_304, diskGib: 100_000, gpus: [] } }),
      }),
    );
  }
  const running = async () =>
    (await api.platform.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM instances WHERE state = 'running'`)))[0]?.n ?? 0;
  await api.hostsReported(hosts);

  const start = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const k = next++;
        await api.tenant.request(bc.CreateInstanceDocument, { input: { poolId: api.poolId, flavor: "tiny", imageId: api.imageId, idempotencyKey: `b${k}` } });
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
  await api.close();
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
