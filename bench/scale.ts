/**
 * Scale: N instances on H simulated hosts, and how every cost grows with N.
 *
 *   npm run bench:scale -- [--hosts 100] [--sizes 1000,3000,10000] [--concurrency 16] [--compiled 1]
 *
 * For each N, a platform of its own as deployed: `bc server` and `bc worker` in processes of their own on
 * PostgreSQL and Redis, and H agents on the fake runtime (no delay) multiplexed in this process, each with its
 * own websocket and reports. N creates go through the API, `concurrency` at a time, and the run ends when all
 * N are RUNNING. Prints, per N: create throughput; time to all running; the reconcile queue's depth over time
 * (waiting + active + delayed `vps.instances` jobs, sampled each second); p50/p99 API latency of the creates
 * during the churn; the server's and the worker's peak RSS; a host's spec (the fullest: its size, and how many
 * generations it went through); the spec-stream bytes per host, counted as the agents received them. Then the
 * growth of each between sizes as an exponent: cost ∝ N^k, k = 1 linear, k = 2 quadratic.
 * Hosts have 128 vCPUs each (the tiny flavor takes 1): H·128 must hold the largest N. Needs PostgreSQL and Redis.
 * The agents' sockets are open files of this process: `ulimit -n` above 2·H.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Queue } from "bullmq";
import { WebSocket } from "ws";
import { startAgent } from "../agent/index.ts";
import { createFakeRuntime } from "../agent/runtimes/fake/index.ts";
import { buildNodeSpec } from "../core/pools/hosted/spec.ts";
import { queueName } from "../infra/jobs.ts";
import * as bc from "../sdk/client.ts";
import { benchPlatform, inParallel, percentile, rssOf } from "./lib.ts";

const { values } = parseArgs({
  options: {
    hosts: { type: "string", default: "100" },
    sizes: { type: "string", default: "1000,3000,10000" },
    concurrency: { type: "string", default: "16" },
    compiled: { type: "string", default: "1" },
  },
});
const hosts = Number(values.hosts);
const sizes = String(values.sizes).split(",").map(Number);
const concurrency = Number(values.concurrency);
const compiled = values.compiled !== "0";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
// A host as an operator would have one: placement packs the fullest host first, so capacity, not the host
// count alone, decides how instances spread (100 of these hold 12,800 tiny instances).
const HOST = { vcpus: 128, memoryMib: 524_288, diskGib: 10_000, gpus: [] };

// Bytes the agents' websockets receive (NodeSpec and command messages): counted where they arrive, in this
// process, so what the server sends each host is measured rather than estimated.
let wsBytes = 0;
const emit = WebSocket.prototype.emit;
WebSocket.prototype.emit = function (this: WebSocket, event: string | symbol, ...rest: unknown[]) {
  if (event === "message") wsBytes += Buffer.byteLength(rest[0] as Buffer);
  return emit.call(this, event, ...rest);
} as typeof emit;

// A run that fails must not leave its server and worker running (and loading the next run).
const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

async function startProcess(role: "server" | "worker", env: NodeJS.ProcessEnv): Promise<{ child: ChildProcess; url: string | null }> {
  const entry = compiled ? "dist/cli/bc.js" : "bin/bc.mjs";
  const child = spawn(process.execPath, [entry, role], { env, stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  child.once("exit", () => children.delete(child));
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  const ready = role === "server" ? /GraphQL:\s+(\S+)/ : /worker running/;
  for (const end = Date.now() + 60_000; !ready.test(out); await sleep(50))
    if (child.exitCode !== null || Date.now() > end) throw new Error(`bc ${role} did not start:\n${out}`);
  return { child, url: role === "server" ? (/GraphQL:\s+(\S+)/.exec(out)?.[1] as string) : null };
}

interface Run {
  n: number;
  createsPerSecond: number;
  allRunningSeconds: number;
  queue: number[];
  apiP50: number;
  apiP99: number;
  serverRss: number;
  workerRss: number;
  specBytes: number;
  specGenerations: number;
  streamBytesPerHost: number;
}

async function once(n: number): Promise<Run> {
  const base = await benchPlatform({ poolSize: 4 });
  const c = base.platform.config;
  const env = {
    ...process.env,
    DATABASE_URL: c.databaseUrl,
    REDIS_URL: c.redisUrl,
    REDIS_PREFIX: c.redisPrefix,
    OPERATOR_TOKEN: base.operatorToken,
    SEAL_KEY: c.sealKey,
    LOG_LEVEL: "warn",
    // One tenant's token drives the whole churn: its per-credential rate limit would be the figure otherwise.
    LIMIT_RATE_POINTS: "1000000000",
    PORT: "0",
    HOST: "127.0.0.1",
  };
  const server = await startProcess("server", env);
  const worker = await startProcess("worker", env);
  const url = server.url as string;
  const op = bc.createClient({ url, token: base.operatorToken });
  const { createPool: pool } = await op.request(bc.CreatePoolDocument, { input: { name: "scale", class: "VPS_HOST", ipv4Range: "10.64.0.0/16" } });
  await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, name: "tiny", vcpus: 1, memoryMib: 256, diskGib: 2 } });
  const { registerImage: image } = await op.request(bc.RegisterImageDocument, {
    input: { name: "tiny", source: "https://images.invalid/i.qcow2", sha256: "b".repeat(64), format: "QCOW2", public: true },
  });
  const { createTenant } = await op.request(bc.CreateTenantDocument, { input: { name: "scale" } });
  const { createApiToken } = await op.request(bc.CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "scale" } });
  const tenant = bc.createClient({ url, token: createApiToken.token });

  const dir = mkdtempSync(join(tmpdir(), "bc-scale-"));
  const agents: Awaited<ReturnType<typeof startAgent>>[] = [];
  for (let i = 0; i < hosts; i++) {
    const stateDir = join(dir, `host-${i}`);
    const { createJoinToken } = await op.request(bc.CreateJoinTokenDocument, { poolId: pool.id });
    agents.push(
      await startAgent({
        server: url,
        joinToken: createJoinToken.token,
        name: `h${i}`,
        stateDir,
        heartbeatMs: 5000,
        runtime: createFakeRuntime({ dir: join(stateDir, "fake"), capacity: HOST }),
        log: () => {},
      }),
    );
  }
  for (const end = Date.now() + 120_000; ; await sleep(100)) {
    const nodes = (await op.request(bc.NodesDocument, { poolId: pool.id })).nodes;
    if (nodes.filter((x) => x.capacity.vcpus > 0).length >= hosts) break;
    if (Date.now() > end) throw new Error(`not all ${hosts} hosts reported`);
  }

  const queue = new Queue(queueName("vps.instances"), { connection: { url: c.redisUrl as string }, prefix: c.redisPrefix });
  const running = async () =>
    (await base.platform.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM instances WHERE state = 'running'`)))[0]?.n ?? 0;
  const depth: number[] = [];
  let serverRss = rssOf(server.child.pid as number);
  let workerRss = rssOf(worker.child.pid as number);
  const sampler = setInterval(() => {
    serverRss = Math.max(serverRss, rssOf(server.child.pid as number));
    workerRss = Math.max(workerRss, rssOf(worker.child.pid as number));
    void queue.getJobCounts("wait", "active", "delayed").then((k) => depth.push((k.wait ?? 0) + (k.active ?? 0) + (k.delayed ?? 0)));
  }, 1000);

  wsBytes = 0;
  const latencies: number[] = [];
  const start = performance.now();
  await inParallel(n, concurrency, async (k) => {
    const t = performance.now();
    await tenant.request(bc.CreateInstanceDocument, { input: { poolId: pool.id, flavor: "tiny", imageId: image.id, idempotencyKey: `s${k}` } });
    latencies.push(performance.now() - t);
  });
  const created = (performance.now() - start) / 1000;
  for (;;) {
    const seen = await running();
    if (seen >= n) break;
    if (performance.now() - start > 30 * 60_000) throw new Error(`only ${seen} of ${n} running after 30 minutes`);
    await sleep(250);
  }
  const allRunning = (performance.now() - start) / 1000;
  clearInterval(sampler);
  const streamBytes = wsBytes;

  // The fullest host's NodeSpec as its agent receives it (less the message's envelope).
  const [fullest] = await base.platform.read((sql) =>
    sql.query<{ id: string; generation: number }>(
      `SELECT id, spec_generation AS generation FROM nodes WHERE pool_id = $1 ORDER BY alloc_instances DESC LIMIT 1`,
      [pool.id],
    ),
  );
  const spec = fullest ? await base.platform.read((sql) => buildNodeSpec(sql, base.platform.sealer, c.vps.hostNetwork, fullest.id)) : null;
  const sorted = latencies.toSorted((a, b) => a - b);
  for (const a of agents) await a.close();
  await queue.close();
  server.child.kill("SIGTERM");
  worker.child.kill("SIGTERM");
  await Promise.all([server, worker].map((p) => new Promise((r) => (p.child.exitCode !== null ? r(null) : p.child.once("exit", r)))));
  await base.close();
  rmSync(dir, { recursive: true, force: true });
  return {
    n,
    createsPerSecond: n / created,
    allRunningSeconds: allRunning,
    queue: depth,
    apiP50: percentile(sorted, 50),
    apiP99: percentile(sorted, 99),
    serverRss,
    workerRss,
    specBytes: spec ? Buffer.byteLength(JSON.stringify(spec)) : 0,
    specGenerations: fullest?.generation ?? 0,
    streamBytesPerHost: streamBytes / hosts,
  };
}

if (compiled) execFileSync(process.execPath, ["scripts/build.mjs"], { stdio: "ignore" });
const out = (line: string) => writeSync(1, `${line}\n`);
out(`scale bench: ${hosts} simulated hosts (fake runtime, in this process), ${concurrency} concurrent creates, sizes ${sizes.join(", ")}`);
const runs: Run[] = [];
const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;
for (const n of sizes) {
  const r = await once(n);
  runs.push(r);
  const every = Math.max(1, Math.ceil(r.queue.length / 12));
  out(
    [
      `N = ${n}`,
      `  creates:            ${r.createsPerSecond.toFixed(1)}/s; API p50 ${r.apiP50.toFixed(1)} ms, p99 ${r.apiP99.toFixed(1)} ms`,
      `  all running after:  ${r.allRunningSeconds.toFixed(1)} s`,
      `  reconcile queue:    max ${Math.max(0, ...r.queue)}; every ${every} s: ${r.queue.filter((_, i) => i % every === 0).join(" ")}`,
      `  peak RSS:           server ${mib(r.serverRss)}, worker ${mib(r.workerRss)}`,
      `  fullest host:       NodeSpec ${(r.specBytes / 1024).toFixed(0)} KiB, ${r.specGenerations} spec generations`,
      `  spec stream:        ${(r.streamBytesPerHost / 1024).toFixed(0)} KiB received per host (all NodeSpec and command messages)`,
    ].join("\n"),
  );
}
const exp = (a: number, b: number, na: number, nb: number) => (Math.log(b / a) / Math.log(nb / na)).toFixed(2);
for (let i = 1; i < runs.length; i++) {
  const a = runs[i - 1] as Run;
  const b = runs[i] as Run;
  out(
    `growth ${a.n} → ${b.n} (cost ∝ N^k): time to all running k=${exp(a.allRunningSeconds, b.allRunningSeconds, a.n, b.n)}, ` +
      `create time k=${exp(a.n / a.createsPerSecond, b.n / b.createsPerSecond, a.n, b.n)}, API p99 k=${exp(a.apiP99, b.apiP99, a.n, b.n)}, ` +
      `server RSS k=${exp(a.serverRss, b.serverRss, a.n, b.n)}, worker RSS k=${exp(a.workerRss, b.workerRss, a.n, b.n)}, ` +
      `spec stream per host k=${exp(a.streamBytesPerHost, b.streamBytesPerHost, a.n, b.n)}`,
  );
}
process.exit(0);
