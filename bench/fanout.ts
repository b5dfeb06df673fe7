/**
 * Live fan-out against the machine's own limit.
 *
 *   npm run bench:fanout -- [--subscribers 1000] [--rate 20] [--seconds 15] [--instances 20] [--compiled 1]
 *   npm run bench:fanout -- --per-instance 10000 [--rate 100] [--seconds 15] [--compiled 1]
 *
 * A `bc server` process serves websocket (graphql-ws) connections from this process, which changes instances
 * at `rate` per second — each change a real write on the platform's write path: it commits an event and
 * publishes its hint on Redis, as the API and the worker do — and receives on every connection.
 *
 * - Pool mode (the default): `subscribers` connections, each subscribed to every instance event of one pool
 *   (`instanceEvents(poolId)`), while `instances` instances change in turn: each change reaches every subscriber.
 * - Per-instance mode (`--per-instance N`): N instances and N connections, each subscribed to its own instance
 *   (`instanceChanged(id)`) with the owning tenant's token; the changes are spread over the instances, so each
 *   reaches exactly one subscriber, and every other subscription the server holds must cost it (next to) nothing.
 *
 * Changes go out open loop: each starts on schedule whether or not earlier writes or deliveries keep up. Prints
 * delivery latency (from the change's write clock to its arrival at a subscriber) p50/p99/max, how long the writes
 * themselves took, deliveries per second, connections, the server's RSS, CPU of both processes, and deliveries
 * per second as a ratio of redis-benchmark's PUBLISH rate on the same Redis.
 * Needs PostgreSQL, Redis and redis-benchmark; the per-instance mode needs an open-file limit (`ulimit -n`) above N
 * in this shell, since this process holds the N client sockets (the server, its child, inherits the limit).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createClient as createGraphqlWs, type Client as GraphqlWsClient } from "graphql-ws";
import { WebSocket } from "ws";
import { admitInstance } from "../core/instances/admission.ts";
import { setDesiredState } from "../core/instances/lifecycle.ts";
import { admissionDeps, hostedFixture } from "./fixture.ts";
import { benchArgs, benchPlatform, percentile, rssOf } from "./lib.ts";

const args = benchArgs({ subscribers: 1000, rate: 0, seconds: 15, instances: 20, compiled: 1, "per-instance": 0 });
const perInstance = args["per-instance"];
const rate = args.rate || (perInstance ? 100 : 20);
const subscribers = perInstance || args.subscribers;
const instanceCount = perInstance || args.instances;
const POOL_QUERY = "subscription($poolId: ID) { instanceEvents(poolId: $poolId) { cursor toState desiredState version at instance { id state } } }";
const INSTANCE_QUERY = "subscription($id: ID!) { instanceChanged(id: $id) { cursor toState desiredState version at instance { id state } } }";
/** Instances a node of the fixture holds (its capacity: 4,096 vCPUs, 1 per instance), with room to spare. */
const PER_NODE = 3000;

/** CPU seconds a process has used (user + system), from /proc. */
const cpuOf = (pid: number) => {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  return (Number(f[11]) + Number(f[12])) / 100;
};
const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const loadavg = () => readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");

/** This process's soft limit on open files: each client socket is one. */
function openFileLimit(): number {
  const line = /Max open files\s+(\S+)/.exec(readFileSync("/proc/self/limits", "utf8"))?.[1];
  return line === undefined || line === "unlimited" ? Number.POSITIVE_INFINITY : Number(line);
}

function redisPublishRps(): number {
  const url = new URL(process.env.REDIS_URL ?? "redis://127.0.0.1:6379");
  const out = execFileSync("redis-benchmark", ["-h", url.hostname, "-p", url.port || "6379", "-q", "-n", "200000", "PUBLISH", "bc-bench-fanout", "hello"], {
    encoding: "utf8",
  });
  const rps = /([0-9.]+) requests per second/.exec(out.split("\r").at(-1) ?? out)?.[1];
  if (!rps) throw new Error(`could not read redis-benchmark's rate:\n${out}`);
  return Number(rps);
}

async function startServerProcess(env: NodeJS.ProcessEnv): Promise<{ child: ChildProcess; url: string }> {
  // FANOUT_NODE_ARGS passes flags to the server's node (e.g. --cpu-prof) when looking into a result.
  const nodeArgs = (process.env.FANOUT_NODE_ARGS ?? "").split(" ").filter(Boolean);
  // As deployed: the compiled build (npm run build), unless --compiled 0 asks for the sources through tsx.
  if (args.compiled) execFileSync(process.execPath, ["scripts/build.mjs"], { stdio: "ignore" });
  const entry = args.compiled ? "dist/cli/bc.js" : "bin/bc.mjs";
  const child = spawn(process.execPath, [...nodeArgs, entry, "server"], { env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  const end = Date.now() + 60_000;
  while (!/GraphQL:\s+(\S+)/.test(out)) {
    if (child.exitCode !== null || Date.now() > end) throw new Error(`bc server did not start:\n${out}`);
    await sleep(50);
  }
  return { child, url: /GraphQL:\s+(\S+)/.exec(out)?.[1] as string };
}

/** Run `task(i)` for i < n, at most `width` at once. */
async function inParallel(n: number, width: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(width, n) }, async () => {
      while (next < n) await task(next++);
    }),
  );
}

async function run() {
  if (perInstance) {
    console.log(`fanout bench, per instance: ${perInstance} subscribers each watching its own instance, ${rate} changes/s for ${args.seconds} s`);
    const limit = openFileLimit();
    if (limit < perInstance + 1000)
      throw new Error(`open-file limit ${limit} is too low for ${perInstance} sockets: raise it (ulimit -n ${perInstance + 1000})`);
  } else console.log(`fanout bench: ${subscribers} subscribers, ${rate} changes/s for ${args.seconds} s over ${instanceCount} instances`);
  console.log(`load average before:          ${loadavg()}`);
  const publishRps = redisPublishRps();
  console.log(`redis-benchmark PUBLISH:      ${publishRps.toFixed(0)} messages/s`);

  const { platform, operatorToken, close } = await benchPlatform({ poolSize: 8 });
  const fx = await hostedFixture(platform, perInstance ? { nodes: Math.ceil(perInstance / PER_NODE) } : { instances: instanceCount });
  const owner = fx.tenants[0] as (typeof fx.tenants)[number];
  if (perInstance) {
    // Admitted as the fixture does, several at once (the fixture's one by one would take minutes for 10,000).
    const t0 = performance.now();
    const ids: string[] = new Array(perInstance);
    await inParallel(perInstance, 8, async (i) => {
      const inst = await platform.write({ actor: owner.apiToken.identityId, action: "createInstance" }, (w) =>
        admitInstance(
          w,
          admissionDeps(platform),
          { identityId: owner.apiToken.identityId, tenantId: owner.tenant.id },
          { poolId: fx.poolId, flavor: "small", imageId: fx.imageId, idempotencyKey: `fanout-${i}` },
        ),
      );
      ids[i] = inst.id;
    });
    fx.instanceIds.push(...ids);
    console.log(`instances admitted:           ${perInstance} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
  const c = platform.config;
  const server = await startServerProcess({
    ...process.env,
    DATABASE_URL: c.databaseUrl,
    REDIS_URL: c.redisUrl,
    REDIS_PREFIX: c.redisPrefix,
    OPERATOR_TOKEN: operatorToken,
    SEAL_KEY: c.sealKey,
    LOG_LEVEL: "warn",
    PORT: "0",
    HOST: "127.0.0.1",
  });
  const pid = server.child.pid as number;
  const idleRss = rssOf(pid);
  let peakRss = idleRss;
  const sampler = setInterval(() => {
    peakRss = Math.max(peakRss, rssOf(pid));
  }, 250);

  const latencies: number[] = [];
  /** Per change (instance id @ its write's clock), when this process saw its write return (committed, published). */
  const returned = new Map<string, number>();
  const sinceReturn: number[] = [];
  let received = 0;
  let misdelivered = 0;
  let errors = 0;
  const clients: GraphqlWsClient[] = [];
  const token = perInstance ? owner.token : operatorToken;
  const t0 = performance.now();
  // At most this many handshakes at once: the server authenticates each connection against the database.
  await inParallel(subscribers, perInstance ? 200 : subscribers, async (i) => {
    const watched = perInstance ? (fx.instanceIds[i] as string) : null;
    let connected!: () => void;
    const up = new Promise<void>((r) => {
      connected = r;
    });
    const ws = createGraphqlWs({
      url: server.url.replace(/^http/, "ws"),
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${token}` },
      retryAttempts: 0,
      on: { connected: () => connected(), closed: () => connected() },
    });
    clients.push(ws);
    ws.subscribe(watched ? { query: INSTANCE_QUERY, variables: { id: watched } } : { query: POOL_QUERY, variables: { poolId: fx.poolId } }, {
      next: (r) => {
        const data = r.data as Record<string, { at: string; instance: { id: string } }> | null;
        const e = data?.instanceChanged ?? data?.instanceEvents;
        if (e) {
          const now = Date.now();
          const at = Date.parse(e.at);
          latencies.push(now - at);
          const back = returned.get(`${e.instance.id}@${at}`);
          if (back !== undefined) sinceReturn.push(now - back);
        }
        if (watched && e?.instance.id !== watched) misdelivered++;
        received++;
      },
      error: (e) => {
        if (errors++ < 3) console.error("subscriber error", e);
      },
      complete: () => {},
    });
    if (perInstance) await up;
  });
  const metrics = async () => (await fetch(server.url.replace("/graphql", "/metrics"))).text();
  let connections = 0;
  for (const end = Date.now() + 180_000; ; ) {
    const text = await metrics();
    const subs = Number(/bc_live_subscriptions (\d+)/.exec(text)?.[1] ?? 0);
    connections = Number(/bc_live_connections (\d+)/.exec(text)?.[1] ?? 0);
    if (subs >= subscribers) break;
    if (Date.now() > end || errors > 0) throw new Error(`only ${subs} of ${subscribers} subscriptions came up (${errors} errors)`);
    await sleep(100);
  }
  const connectSeconds = (performance.now() - t0) / 1000;
  const connectedRss = rssOf(pid);
  console.log(`connections:                  ${connections} (${subscribers} subscriptions up in ${connectSeconds.toFixed(1)} s)`);
  console.log(`server RSS:                   ${mib(idleRss)} idle, ${mib(connectedRss)} with ${subscribers} subscribers connected`);
  // Let the connection storm settle (garbage, handshakes' leftovers) before the clock starts, and see what
  // holding the connections costs the server with no change at all.
  if (perInstance) {
    await sleep(2000);
    const quiet0 = cpuOf(pid);
    await sleep(3000);
    console.log(`server CPU with no changes:   ${((cpuOf(pid) - quiet0) / 3).toFixed(2)} cores busy`);
  }

  // Open loop: each change starts on schedule, however long earlier writes or deliveries take.
  const who = { identityId: "bench", tenantId: null, operator: true, scopes: new Set<never>() };
  const total = Math.round(rate * args.seconds);
  const writes: number[] = [];
  const commits: number[] = [];
  const inFlight = new Set<Promise<void>>();
  let writeErrors = 0;
  const started = performance.now();
  const cpu0 = { server: cpuOf(pid), bench: process.cpuUsage() };
  for (let n = 0; n < total; n++) {
    const due = started + (n * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait);
    const id = fx.instanceIds[n % fx.instanceIds.length] as string;
    const desired = Math.floor(n / fx.instanceIds.length) % 2 === 0 ? "stopped" : "running";
    const w0 = performance.now();
    let clock = 0;
    const write = platform
      .write({ actor: "bench", action: "stopInstance" }, (w) => {
        clock = w.now.getTime();
        return setDesiredState(w, who, id, desired);
      })
      .then(
        () => {
          const now = Date.now();
          returned.set(`${id}@${clock}`, now);
          commits.push(now - clock);
          writes.push(performance.now() - w0);
        },
        (e) => {
          if (writeErrors++ === 0) console.error("first write error:", e);
        },
      )
      .finally(() => inFlight.delete(write));
    inFlight.add(write);
  }
  await Promise.all(inFlight);
  const writeSeconds = (performance.now() - started) / 1000;
  const expected = (total - writeErrors) * (perInstance ? 1 : subscribers);
  for (const end = Date.now() + 60_000; received < expected && Date.now() < end; ) await sleep(20);
  const elapsed = (performance.now() - started) / 1000;
  clearInterval(sampler);
  const benchCpu = process.cpuUsage(cpu0.bench);
  const cpu = { server: (cpuOf(pid) - cpu0.server) / elapsed, bench: (benchCpu.user + benchCpu.system) / 1e6 / elapsed };

  for (const l of [latencies, writes, commits, sinceReturn]) l.sort((a, b) => a - b);
  const p = (l: number[]) => `p50 ${percentile(l, 50).toFixed(0)} ms, p99 ${percentile(l, 99).toFixed(0)} ms`;
  const perSecond = received / elapsed;
  console.log(`changes:                      ${total} (${(total / writeSeconds).toFixed(1)}/s), ${writeErrors} failed`);
  console.log(`write, due → returned:        ${p(writes)} (waiting for a connection included)`);
  console.log(`write, its clock → returned:  ${p(commits)} (the part of the latency below spent committing)`);
  console.log(
    `deliveries:                   ${received} of ${expected} in ${elapsed.toFixed(1)} s = ${perSecond.toFixed(0)}/s${perInstance ? `, ${misdelivered} to the wrong subscriber` : ""}`,
  );
  console.log(
    `delivery latency:             p50 ${percentile(latencies, 50).toFixed(0)} ms, p99 ${percentile(latencies, 99).toFixed(0)} ms, max ${latencies.at(-1)?.toFixed(0)} ms (goal p99 <= 50 ms)`,
  );
  console.log(`  from the write's return:     ${p(sinceReturn)} (the live path alone: pub/sub, feed, execution, socket)`);
  console.log(`CPU (cores busy):             server ${cpu.server.toFixed(2)}, this process (subscribers + changes) ${cpu.bench.toFixed(2)}`);
  console.log(`server peak RSS:              ${mib(peakRss)} (goal <= ${perInstance ? 600 : 300} MiB)`);
  console.log(`deliveries / PUBLISH rate:    ${(perSecond / publishRps).toFixed(3)}`);
  console.log(`load average after:           ${loadavg()}`);

  await Promise.all(clients.map((ws) => ws.dispose()));
  server.child.kill("SIGTERM");
  await new Promise((r) => server.child.once("exit", r));
  await close();
}

run().catch((e) => {
  console.error(e);
  process.exit(1);
});
