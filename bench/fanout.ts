/**
 * Live fan-out against the machine's own limit.
 *
 *   npm run bench:fanout -- [--subscribers 1000] [--rate 20] [--seconds 15] [--instances 20] [--compiled 1]
 *
 * A `bc server` process serves `subscribers` websocket connections, each subscribed to every instance event of
 * one pool. This process changes instances at `rate` per second (each change commits an event and publishes
 * its hint on Redis, as the API and the worker do) and receives on every connection. Prints delivery latency
 * (from the change to its arrival at a subscriber) p50/p99/max, deliveries per second, the server's peak RSS,
 * and deliveries per second as a ratio of redis-benchmark's PUBLISH rate on the same Redis.
 * Needs PostgreSQL, Redis and redis-benchmark.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createClient as createGraphqlWs } from "graphql-ws";
import { WebSocket } from "ws";
import { setDesiredState } from "../core/instances/lifecycle.ts";
import { hostedFixture } from "./fixture.ts";
import { benchArgs, benchPlatform, percentile, rssOf } from "./lib.ts";

const args = benchArgs({ subscribers: 1000, rate: 20, seconds: 15, instances: 20, compiled: 1 });
const QUERY = "subscription($poolId: ID) { instanceEvents(poolId: $poolId) { cursor toState desiredState version at instance { id state } } }";

/** CPU seconds a process has used (user + system), from /proc. */
const cpuOf = (pid: number) => {
  const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  return (Number(f[11]) + Number(f[12])) / 100;
};
const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;

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
    await new Promise((r) => setTimeout(r, 50));
  }
  return { child, url: /GraphQL:\s+(\S+)/.exec(out)?.[1] as string };
}

async function run() {
  console.log(`fanout bench: ${args.subscribers} subscribers, ${args.rate} changes/s for ${args.seconds} s over ${args.instances} instances`);
  const publishRps = redisPublishRps();
  console.log(`redis-benchmark PUBLISH:      ${publishRps.toFixed(0)} messages/s`);

  const { platform, operatorToken, close } = await benchPlatform({ poolSize: 4 });
  const fx = await hostedFixture(platform, { instances: args.instances });
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
  let received = 0;
  const clients = [];
  for (let i = 0; i < args.subscribers; i++) {
    const ws = createGraphqlWs({
      url: server.url.replace(/^http/, "ws"),
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${operatorToken}` },
      retryAttempts: 0,
    });
    ws.subscribe(
      { query: QUERY, variables: { poolId: fx.poolId } },
      {
        next: (r) => {
          const at = (r.data as { instanceEvents: { at: string } } | null)?.instanceEvents.at;
          if (at) latencies.push(Date.now() - Date.parse(at));
          received++;
        },
        error: (e) => console.error("subscriber error", e),
        complete: () => {},
      },
    );
    clients.push(ws);
  }
  const metrics = async () => (await fetch(server.url.replace("/graphql", "/metrics"))).text();
  for (const end = Date.now() + 60_000; ; ) {
    const subs = Number(/bc_live_subscriptions (\d+)/.exec(await metrics())?.[1] ?? 0);
    if (subs >= args.subscribers) break;
    if (Date.now() > end) throw new Error(`only ${subs} of ${args.subscribers} subscriptions came up`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const connectedRss = rssOf(pid);
  console.log(`server RSS: ${mib(idleRss)} idle, ${mib(connectedRss)} with ${args.subscribers} subscribers connected`);

  // Open loop: changes go out on schedule whether or not deliveries keep up.
  const who = { identityId: "bench", tenantId: null, operator: true, scopes: new Set<never>() };
  const total = Math.round(args.rate * args.seconds);
  const started = performance.now();
  const cpu0 = { server: cpuOf(pid), bench: process.cpuUsage() };
  for (let n = 0; n < total; n++) {
    const due = started + (n * 1000) / args.rate;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    const id = fx.instanceIds[n % fx.instanceIds.length] as string;
    const desired = Math.floor(n / fx.instanceIds.length) % 2 === 0 ? "stopped" : "running";
    await platform.write({ actor: "bench", action: "stopInstance" }, (w) => setDesiredState(w, who, id, desired));
  }
  const expected = total * args.subscribers;
  for (const end = Date.now() + 60_000; received < expected && Date.now() < end; ) await new Promise((r) => setTimeout(r, 50));
  const elapsed = (performance.now() - started) / 1000;
  clearInterval(sampler);
  const benchCpu = process.cpuUsage(cpu0.bench);
  const cpu = { server: (cpuOf(pid) - cpu0.server) / elapsed, bench: (benchCpu.user + benchCpu.system) / 1e6 / elapsed };

  latencies.sort((a, b) => a - b);
  const perSecond = received / elapsed;
  console.log(`changes:                      ${total} (${(total / elapsed).toFixed(1)}/s)`);
  console.log(`deliveries:                   ${received} of ${expected} in ${elapsed.toFixed(1)} s = ${perSecond.toFixed(0)}/s`);
  console.log(
    `delivery latency:             p50 ${percentile(latencies, 50).toFixed(0)} ms, p99 ${percentile(latencies, 99).toFixed(0)} ms, max ${latencies.at(-1)?.toFixed(0)} ms (goal p99 <= 50 ms)`,
  );
  console.log(`CPU (cores busy):             server ${cpu.server.toFixed(2)}, this process (subscribers + changes) ${cpu.bench.toFixed(2)}`);
  console.log(`server peak RSS:              ${mib(peakRss)} (goal <= 300 MiB)`);
  console.log(`deliveries / PUBLISH rate:    ${(perSecond / publishRps).toFixed(3)}`);

  for (const ws of clients) await ws.dispose();
  server.child.kill("SIGTERM");
  await new Promise((r) => server.child.once("exit", r));
  await close();
}

run().catch((e) => {
  console.error(e);
  process.exit(1);
});
