import { mkdtempSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { Redis } from "ioredis";
import { startAgent } from "../agent/index.ts";
import { createFakeRuntime } from "../agent/runtimes/fake/index.ts";
import * as bc from "../sdk/client.ts";
import { benchApi, inParallel, percentile, probeWrite } from "./lib.ts";

const { values } = parseArgs({
  options: {
    hosts: { type: "string", default: "3" },
    sizes: { type: "string", default: "100,500,1000,2000" },
    concurrency: { type: "string", default: "16" },
    /**
     * Latency mode: this many creates one after another on an idle platform, each timed to its RUNNING event,
     * then paused and resumed, each timed to its PAUSED and RUNNING event (the power commands' round trip).
     */
    latency: { type: "string" },
    /**
     * Latency mode: ms of quiet before each pause and each resume (0: each right after the event before it).
     * An owner's pause usually comes after a quiet spell, and the first request after one pays for the wake-ups
     * of every process on its path.
     */
    quiet: { type: "string", default: "0" },
  },
});
const hosts = Number(values.hosts);
const sizes = String(values.sizes).split(",").map(Number);
const concurrency = Number(values.concurrency);
const quiet = Number(values.quiet);

/** A platform on PostgreSQL and Redis with `hosts` agents on the fake runtime (no delay), all reported. */
async function platformWithHosts() {
  const dir = mkdtempSync(join(tmpdir(), "bc-conv-"));
  const api = await benchApi({
    poolSize: 12,
    // One client sends four requests a round, back to back: a budget no round trip nears (the limiter runs as
    // deployed, its points reserved from Redis a slice at a time).
    env: {
      RECONCILE_SWEEP_MS: "1000",
      LIMIT_RATE_POINTS: "1000000",
      ...(process.env.BENCH_LOG_LEVEL ? { LOG_LEVEL: process.env.BENCH_LOG_LEVEL } : {}),
    },
    ipv4Range: "10.100.0.0/20",
    tiny: { vcpus: 1, memoryMib: 256, diskGib: 2 },
    image: { source: "https://images.invalid/i.qcow2", sha256: "b".repeat(64) },
  });
  const agents: Awaited<ReturnType<typeof startAgent>>[] = [];
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
  await api.hostsReported(hosts);
  return {
    api,
    async close() {
      for (const a of agents) await a.close();
      await api.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function once(n: number) {
  const { api, close } = await platformWithHosts();
  const running = async () =>
    (await api.platform.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM instances WHERE state = 'running'`)))[0]?.n ?? 0;

  const start = performance.now();
  await inParallel(n, concurrency, async (k) => {
    await api.tenant.request(bc.CreateInstanceDocument, { input: { poolId: api.poolId, flavor: "tiny", imageId: api.imageId, idempotencyKey: `b${k}` } });
  });
  const created = (performance.now() - start) / 1000;
  while ((await running()) < n) {
    if (performance.now() - start > 20 * 60_000) throw new Error(`only ${await running()} of ${n} running after 20 minutes`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const seconds = (performance.now() - start) / 1000;
  await close();
  return { seconds, created };
}

/**
 * Create → RUNNING as a client sees it: the create request sent, then its instance's RUNNING event arriving on
 * an `instanceEvents` subscription. One create at a time, each deleted before the next, so each meets an idle
 * platform and a host holding nothing: the path, not a queue or a host's growing spec.
 */
async function latency(n: number) {
  const quietSpell = () => (quiet > 0 ? sleep(quiet) : undefined);
  const { api, close } = await platformWithHosts();
  const waiting = new Map<string, (at: number) => void>();
  // An event may beat the request's own response home: keep it for the wait that follows.
  const arrived = new Map<string, number>();
  const stop = new AbortController();
  const { instanceEventsCursor: after } = await api.tenant.request(bc.InstanceEventsCursorDocument);
  const events = (async () => {
    for await (const e of bc.watchInstanceEvents({ url: api.url, token: api.tenantToken, after, signal: stop.signal })) {
      // Arrivals in a state, not changes of the desired state (a pause request is an event in RUNNING too).
      if ((e.toState !== "RUNNING" && e.toState !== "DELETED" && e.toState !== "PAUSED") || e.fromState === e.toState) continue;
      const key = `${e.toState} ${e.instance.id}`;
      const wake = waiting.get(key);
      if (wake) wake(performance.now());
      else arrived.set(key, performance.now());
    }
  })();
  const reached = (key: string) => {
    const early = arrived.get(key);
    arrived.delete(key);
    return (
      early ??
      new Promise<number>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`${key} not seen within 10 s`)), 10_000);
        waiting.set(key, (when) => {
          clearTimeout(t);
          waiting.delete(key);
          resolve(when);
        });
      })
    );
  };
  const times: number[] = [];
  const pauses: number[] = [];
  const resumes: number[] = [];
  for (let k = 0; k < n; k++) {
    const start = performance.now();
    const { createInstance: inst } = await api.tenant.request(bc.CreateInstanceDocument, {
      input: { poolId: api.poolId, flavor: "tiny", imageId: api.imageId, idempotencyKey: `l${k}` },
    });
    times.push((await reached(`RUNNING ${inst.id}`)) - start);
    await quietSpell();
    const pausing = performance.now();
    await api.tenant.request(bc.PauseInstanceDocument, { id: inst.id });
    pauses.push((await reached(`PAUSED ${inst.id}`)) - pausing);
    await quietSpell();
    const resuming = performance.now();
    await api.tenant.request(bc.StartInstanceDocument, { id: inst.id });
    resumes.push((await reached(`RUNNING ${inst.id}`)) - resuming);
    await api.tenant.request(bc.DeleteInstanceDocument, { id: inst.id });
    await reached(`DELETED ${inst.id}`);
  }
  stop.abort();
  await events.catch(() => {});
  // Where the time goes: the median gap before each transition, from the events' own timestamps.
  const steps = await api.platform.read((sql) =>
    sql.query<{ step: string; ms: number }>(
      `SELECT to_state || ' (' || reason || ')' AS step, percentile_cont(0.5) WITHIN GROUP (ORDER BY gap)::float AS ms, min(position) AS first
         FROM (SELECT to_state, reason, position, extract(epoch FROM at - lag(at) OVER (PARTITION BY instance_id ORDER BY position)) * 1000 AS gap
                 FROM instance_events) g
        WHERE gap IS NOT NULL GROUP BY 1 ORDER BY first`,
    ),
  );
  const hops = quiet > 0 ? await oneHop(api.platform) : null;
  await close();
  const q = (xs: number[], p: number) => xs.toSorted((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(p * xs.length))] as number;
  return {
    p50: q(times, 0.5),
    p99: q(times, 0.99),
    max: Math.max(...times),
    pause: { p50: q(pauses, 0.5), p99: q(pauses, 0.99) },
    resume: { p50: q(resumes, 0.5), p99: q(resumes, 0.99) },
    steps,
    hops,
  };
}

/**
 * The machine's own cost of a quiet spell: one round trip to PostgreSQL (`SELECT 1` through the platform's
 * pool), one write and its COMMIT (probeWrite) and one round trip to Redis (`PING`), each timed right after
 * another and after `quiet` ms of nothing, medians of 9.
 */
async function oneHop(platform: Awaited<ReturnType<typeof benchApi>>["platform"]) {
  const redis = new Redis(platform.config.redisUrl as string);
  const timed = async (call: () => Promise<unknown>, wait: number) => {
    const xs: number[] = [];
    for (let i = 0; i < 9; i++) {
      await (wait ? sleep(wait) : call());
      const t0 = performance.now();
      await call();
      xs.push(performance.now() - t0);
    }
    return percentile(
      xs.toSorted((a, b) => a - b),
      50,
    );
  };
  const pgCall = () => platform.read((sql) => sql.query("SELECT 1"));
  const pgWrite = await probeWrite(platform);
  const redisCall = () => redis.ping();
  const r = {
    pgHot: await timed(pgCall, 0),
    pgQuiet: await timed(pgCall, quiet),
    writeHot: await timed(pgWrite, 0),
    writeQuiet: await timed(pgWrite, quiet),
    redisHot: await timed(redisCall, 0),
    redisQuiet: await timed(redisCall, quiet),
  };
  redis.disconnect();
  return r;
}

if (values.latency) {
  const n = Number(values.latency);
  console.log(
    `converge latency: ${n} creates one at a time, ${hosts} simulated hosts (fake runtime, no delay), PostgreSQL and Redis${quiet ? `; ${quiet} ms of quiet before each pause and resume` : ""}`,
  );
  const r = await latency(n);
  const lines = [
    `create → RUNNING event on a subscription: p50 ${r.p50.toFixed(1)} ms, p99 ${r.p99.toFixed(1)} ms, max ${r.max.toFixed(1)} ms (goal p50 ≤ 30, p99 ≤ 100)`,
    `pause → PAUSED: p50 ${r.pause.p50.toFixed(1)} ms, p99 ${r.pause.p99.toFixed(1)} ms; resume → RUNNING: p50 ${r.resume.p50.toFixed(1)} ms, p99 ${r.resume.p99.toFixed(1)} ms (the fake runtime's calls take ~0 ms)`,
    ...(r.hops
      ? [
          `one round trip right after another / after ${quiet} ms of quiet (the machine's own): PostgreSQL SELECT 1 ${r.hops.pgHot.toFixed(2)} / ${r.hops.pgQuiet.toFixed(2)} ms, a one-row write and its COMMIT ${r.hops.writeHot.toFixed(2)} / ${r.hops.writeQuiet.toFixed(2)} ms, Redis PING ${r.hops.redisHot.toFixed(2)} / ${r.hops.redisQuiet.toFixed(2)} ms`,
        ]
      : []),
    "median time since the previous event, by transition:",
    ...r.steps.map((s) => `  ${s.step.padEnd(36)} ${s.ms.toFixed(1).padStart(7)} ms`),
  ];
  // Written at once: console.log to a pipe is asynchronous, and process.exit would cut it short.
  writeSync(1, `${lines.join("\n")}\n`);
  process.exit(0);
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
