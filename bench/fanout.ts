/**
 * Live fan-out against the machine's own limit.
 *
 *   npm run bench:fanout -- [--subscribers 1000] [--rate 20] [--seconds 15] [--warmup 2] [--instances 20] [--procs 2] [--servers 1] [--compiled 1]
 *   npm run bench:fanout -- --per-instance 10000 [--rate 100] [--seconds 15] [--warmup 2] [--procs 2] [--compiled 1]
 *
 * A `bc server` process serves websocket (graphql-ws) subscribers held by `procs` child processes of this one
 * (0: by this process itself), while this process changes instances at `rate` per second — each change a real
 * write on the platform's write path: it commits an event and publishes its hint on Redis, as the API and the
 * worker do. The subscribers live apart from the writer so that a burst of deliveries does not hold up the next
 * write's statements (and so inflate the latency it measures). `servers` > 1 starts that many replicas of the
 * server, as a deployment runs one per core, and spreads the subscribers over them in turn.
 *
 * - Pool mode (the default): `subscribers` connections, each subscribed to every instance event of one pool
 *   (`instanceEvents(poolId)`), while `instances` instances change in turn: each change reaches every subscriber.
 * - Per-instance mode (`--per-instance N`): N instances and N connections, each subscribed to its own instance
 *   (`instanceChanged(id)`) with the owning tenant's token; the changes are spread over the instances, so each
 *   reaches exactly one subscriber, and every other subscription the server holds must cost it (next to) nothing.
 *
 * Changes go out open loop: each starts on schedule whether or not earlier writes or deliveries keep up. The
 * first `warmup` seconds of changes are timed apart, as the cold figure, and not counted. Prints delivery
 * latency (from the change's write clock to its arrival at a subscriber) p50/p99/max, split at the pub/sub hint
 * (which this process hears as the server does) into the write path and the live path; how long the writes took;
 * deliveries per second; connections; the server's RSS; CPU of every process; and deliveries per second as a
 * ratio of redis-benchmark's PUBLISH rate on the same Redis.
 * Needs PostgreSQL, Redis and redis-benchmark. Every client socket is an open file of the process holding it
 * (and of the server): `ulimit -n` must allow the subscribers per process, and the server's N, plus some.
 */
import { type ChildProcess, execFileSync, fork, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { createClient as createGraphqlWs, type Client as GraphqlWsClient } from "graphql-ws";
import { WebSocket } from "ws";
import { admitInstance } from "../core/lifecycle/admission.ts";
import { setDesiredState } from "../core/lifecycle/lifecycle.ts";
import { admissionDeps, hostedFixture } from "./fixture.ts";
import { benchArgs, benchPlatform, cpuOf, inParallel, percentile, rssOf } from "./lib.ts";

const POOL_QUERY = "subscription($poolId: ID) { instanceEvents(poolId: $poolId) { cursor toState desiredState version at instance { id state } } }";
const INSTANCE_QUERY = "subscription($id: ID!) { instanceChanged(id: $id) { cursor toState desiredState version at instance { id state } } }";
/** Instances a node of the fixture holds (its capacity: 4,096 vCPUs, 1 per instance), with room to spare. */
const PER_NODE = 3000;
/** Set in the subscriber processes this bench forks. */
const ROLE = "FANOUT_ROLE";

const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;
/** One server's RSS, or each replica's. */
const mibs = (bs: number[]) => bs.map(mib).join(" + ");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const loadavg = () => readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");

/** This process's soft limit on open files (children inherit it). */
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

async function startServerProcess(env: NodeJS.ProcessEnv, compiled: boolean, build: boolean): Promise<{ child: ChildProcess; url: string }> {
  // FANOUT_NODE_ARGS passes flags to the server's node (e.g. --cpu-prof) when looking into a result.
  const nodeArgs = (process.env.FANOUT_NODE_ARGS ?? "").split(" ").filter(Boolean);
  // As deployed: the compiled build (npm run build), unless --compiled 0 asks for the sources through tsx.
  if (compiled && build) execFileSync(process.execPath, ["scripts/build.mjs"], { stdio: "ignore" });
  const entry = compiled ? "dist/cli/bc.js" : "bin/bc.mjs";
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

// ---- Subscribers: in a child process (or this one), reporting to the writer over IPC. ----

interface Subscription {
  variables: Record<string, string>;
  /** The server (of `servers`) this subscriber connects to. */
  server: number;
  /** In per-instance mode, the instance this subscriber watches: anything else reaching it is misdelivered. */
  watched: string | null;
}
interface Plan {
  urls: string[];
  token: string;
  query: string;
  subs: Subscription[];
  /** Handshakes at once: the server authenticates each connection against the database. */
  width: number;
}
interface Report {
  received: number;
  misdelivered: number;
  errors: number;
  /** Per event (its cursor): its write clock (ms) and when it reached each subscriber here. */
  deliveries: [cursor: string, at: number, arrivals: number[]][];
}
type ToChild = { type: "start"; plan: Plan } | { type: "report" } | { type: "close" };
type FromChild = { type: "up" } | { type: "progress"; received: number; errors: number } | ({ type: "report" } & Report);

/** A set of graphql-ws clients, one connection and one subscription each. */
class Subscribers {
  private readonly clients: GraphqlWsClient[] = [];
  private readonly seen = new Map<string, { at: number; arrivals: number[] }>();
  received = 0;
  misdelivered = 0;
  errors = 0;

  async start(plan: Plan): Promise<void> {
    await inParallel(plan.subs.length, plan.width, async (i) => {
      const { variables, watched, server } = plan.subs[i] as Subscription;
      let connected!: () => void;
      const up = new Promise<void>((r) => {
        connected = r;
      });
      const ws = createGraphqlWs({
        url: (plan.urls[server] as string).replace(/^http/, "ws"),
        webSocketImpl: WebSocket,
        connectionParams: { authorization: `Bearer ${plan.token}` },
        retryAttempts: 0,
        on: { connected: () => connected(), closed: () => connected() },
      });
      this.clients.push(ws);
      ws.subscribe(
        { query: plan.query, variables },
        {
          next: (r) => {
            const now = Date.now();
            const data = r.data as Record<string, { at: string; cursor: string; instance: { id: string } }> | null;
            const e = data?.instanceChanged ?? data?.instanceEvents;
            if (e) {
              let d = this.seen.get(e.cursor);
              if (!d) {
                d = { at: Date.parse(e.at), arrivals: [] };
                this.seen.set(e.cursor, d);
              }
              d.arrivals.push(now);
            }
            if (watched && e?.instance.id !== watched) this.misdelivered++;
            this.received++;
          },
          error: (e) => {
            if (this.errors++ < 3) console.error("subscriber error", e);
          },
          complete: () => {},
        },
      );
      await up;
    });
  }

  report(): Report {
    const deliveries = [...this.seen].map(([cursor, d]) => [cursor, d.at, d.arrivals] as Report["deliveries"][number]);
    return { received: this.received, misdelivered: this.misdelivered, errors: this.errors, deliveries };
  }

  async close(): Promise<void> {
    await Promise.all(this.clients.map((c) => c.dispose()));
  }
}

/** The writer's handle on one group of subscribers, wherever they run. */
interface Group {
  pid: number;
  up: Promise<void>;
  received(): number;
  errors(): number;
  report(): Promise<Report>;
  close(): Promise<void>;
}

function localGroup(plan: Plan): Group {
  const s = new Subscribers();
  return {
    pid: process.pid,
    up: s.start(plan),
    received: () => s.received,
    errors: () => s.errors,
    report: async () => s.report(),
    close: () => s.close(),
  };
}

function childGroup(plan: Plan): Group {
  // The same file under the same loader (tsx's flags are in execArgv, which fork passes on).
  const child = fork(fileURLToPath(import.meta.url), [], { env: { ...process.env, [ROLE]: "subscribers" } });
  const state = { received: 0, errors: 0 };
  let reported: ((r: Report) => void) | null = null;
  const up = new Promise<void>((resolve, reject) => {
    child.once("exit", (code) => reject(new Error(`subscriber process exited (${code})`)));
    child.on("message", (m: FromChild) => {
      if (m.type === "up") resolve();
      else if (m.type === "progress") Object.assign(state, { received: m.received, errors: m.errors });
      else if (m.type === "report") reported?.(m);
    });
  });
  up.catch(() => {});
  child.send({ type: "start", plan } satisfies ToChild);
  return {
    pid: child.pid as number,
    up,
    received: () => state.received,
    errors: () => state.errors,
    report: () =>
      new Promise<Report>((resolve) => {
        reported = resolve;
        child.send({ type: "report" } satisfies ToChild);
      }),
    async close() {
      const exited = new Promise((r) => child.once("exit", r));
      child.send({ type: "close" } satisfies ToChild);
      await exited;
    },
  };
}

/** A forked subscriber process: does what the writer says, reports its counts every 100 ms. */
function subscriberProcess(): void {
  const s = new Subscribers();
  const send = (m: FromChild) => process.send?.(m);
  let progress: NodeJS.Timeout | undefined;
  process.on("message", async (m: ToChild) => {
    if (m.type === "start") {
      await s.start(m.plan);
      send({ type: "up" });
      progress = setInterval(() => send({ type: "progress", received: s.received, errors: s.errors }), 100);
    } else if (m.type === "report") {
      send({ type: "report", ...s.report() });
    } else {
      clearInterval(progress);
      await s.close();
      process.disconnect();
    }
  });
}

// ---- The writer: the platform, the server, the changes, the figures. ----

async function run() {
  const args = benchArgs({ subscribers: 1000, rate: 0, seconds: 15, warmup: 2, instances: 20, procs: 2, servers: 1, compiled: 1, "per-instance": 0 });
  const perInstance = args["per-instance"];
  const rate = args.rate || (perInstance ? 100 : 20);
  const subscribers = perInstance || args.subscribers;
  const instanceCount = perInstance || args.instances;
  const procs = Math.max(0, Math.min(args.procs, subscribers));
  const serverCount = Math.max(1, args.servers);
  if (perInstance)
    console.log(`fanout bench, per instance: ${perInstance} subscribers each watching its own instance, ${rate} changes/s for ${args.seconds} s`);
  else console.log(`fanout bench: ${subscribers} subscribers, ${rate} changes/s for ${args.seconds} s over ${instanceCount} instances`);
  console.log(`subscribers held by:          ${procs ? `${procs} child processes` : "this process"}`);
  if (serverCount > 1) console.log(`servers:                      ${serverCount} replicas, the subscribers spread over them in turn`);
  const perProcess = Math.ceil(subscribers / Math.max(1, procs));
  const limit = openFileLimit();
  if (limit < Math.max(perProcess, subscribers) + 1000) throw new Error(`open-file limit ${limit} is too low for ${subscribers} sockets: raise it (ulimit -n)`);
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
  const env = {
    ...process.env,
    DATABASE_URL: c.databaseUrl,
    REDIS_URL: c.redisUrl,
    REDIS_PREFIX: c.redisPrefix,
    OPERATOR_TOKEN: operatorToken,
    SEAL_KEY: c.sealKey,
    LOG_LEVEL: "warn",
    PORT: "0",
    HOST: "127.0.0.1",
  };
  // Replicas of the server, as a deployment runs one per core: the subscribers are spread over them in turn.
  const servers: { child: ChildProcess; url: string }[] = [];
  for (let k = 0; k < serverCount; k++) servers.push(await startServerProcess(env, Boolean(args.compiled), k === 0));
  const pids = servers.map((x) => x.child.pid as number);
  const rssAll = () => pids.map(rssOf);
  const idleRss = rssAll();
  const peakRss = [...idleRss];
  const sampler = setInterval(() => {
    rssAll().forEach((r, k) => {
      peakRss[k] = Math.max(peakRss[k] as number, r);
    });
  }, 250);
  const serverCpu = () => pids.reduce((sum, x) => sum + cpuOf(x), 0);

  // The latency splits at the pub/sub hint, which this process hears as the server does: before it, the write
  // path (the transaction from its clock on, the commit, the publish); after it, the live path (the feed's
  // read, the execution, the sockets).
  const hints = new Map<string, number>();
  const hinted = platform.bus.subscribe("instanceEvents");
  const hearing = (async () => {
    for await (const m of hinted) for (const e of m.events) hints.set(e.cursor, Date.now());
  })();

  const subs = Array.from(
    { length: subscribers },
    (_, i): Subscription =>
      perInstance
        ? { variables: { id: fx.instanceIds[i] as string }, watched: fx.instanceIds[i] as string, server: i % serverCount }
        : { variables: { poolId: fx.poolId }, watched: null, server: i % serverCount },
  );
  const plan = (part: Subscription[]): Plan => ({
    urls: servers.map((x) => x.url),
    token: perInstance ? owner.token : operatorToken,
    query: perInstance ? INSTANCE_QUERY : POOL_QUERY,
    subs: part,
    width: perInstance ? 100 : part.length,
  });
  const t0 = performance.now();
  const groups = procs ? Array.from({ length: procs }, (_, g) => childGroup(plan(subs.slice(g * perProcess, (g + 1) * perProcess)))) : [localGroup(plan(subs))];
  const received = () => groups.reduce((n, g) => n + g.received(), 0);
  const errors = () => groups.reduce((n, g) => n + g.errors(), 0);
  await Promise.all(groups.map((g) => g.up));
  // Each replica counts its own live connections and subscriptions.
  const metrics = () => Promise.all(servers.map(async (x) => (await fetch(x.url.replace("/graphql", "/metrics"))).text()));
  const sum = (texts: string[], re: RegExp) => texts.reduce((n, text) => n + Number(re.exec(text)?.[1] ?? 0), 0);
  let connections = 0;
  for (const end = Date.now() + 180_000; ; ) {
    const texts = await metrics();
    const up = sum(texts, /bc_live_subscriptions (\d+)/);
    connections = sum(texts, /bc_live_connections (\d+)/);
    if (up >= subscribers) break;
    if (Date.now() > end || errors() > 0) throw new Error(`only ${up} of ${subscribers} subscriptions came up (${errors()} errors)`);
    await sleep(100);
  }
  const connectSeconds = (performance.now() - t0) / 1000;
  const connectedRss = rssAll();
  console.log(`connections:                  ${connections} (${subscribers} subscriptions up in ${connectSeconds.toFixed(1)} s)`);
  console.log(`server RSS:                   ${mibs(idleRss)} idle, ${mibs(connectedRss)} with ${subscribers} subscribers connected`);
  // Let the connection storm settle (garbage, handshakes' leftovers) before the clock starts, and see what
  // holding the connections costs the server with no change at all.
  if (perInstance) {
    await sleep(2000);
    const quiet0 = serverCpu();
    await sleep(3000);
    console.log(`server CPU with no changes:   ${((serverCpu() - quiet0) / 3).toFixed(2)} cores busy`);
  }

  // Open loop: each change starts on schedule, however long earlier writes or deliveries take. `made` runs on
  // across the warm-up and the measured changes, so every change flips its instance's desired state (one that
  // asked for what was already asked would change nothing, and send nothing).
  const who = { identityId: "bench", tenantId: null, operator: true, scopes: new Set<never>() };
  let made = 0;
  const perChange = perInstance ? 1 : subscribers;
  async function drive(count: number) {
    const writes: number[] = [];
    const inFlight = new Set<Promise<void>>();
    let failed = 0;
    const started = performance.now();
    for (let i = 0; i < count; i++, made++) {
      const due = started + (i * 1000) / rate;
      const wait = due - performance.now();
      if (wait > 0) await sleep(wait);
      const id = fx.instanceIds[made % fx.instanceIds.length] as string;
      const desired = Math.floor(made / fx.instanceIds.length) % 2 === 0 ? "stopped" : "running";
      const w0 = performance.now();
      const write = platform
        .write({ actor: "bench", action: "stopInstance" }, (w) => setDesiredState(w, who, id, desired))
        .then(
          () => void writes.push(performance.now() - w0),
          (e) => {
            if (failed++ === 0) console.error("first write error:", e);
          },
        )
        .finally(() => inFlight.delete(write));
      inFlight.add(write);
    }
    await Promise.all(inFlight);
    return { writes, failed, seconds: (performance.now() - started) / 1000 };
  }
  async function delivered(count: number) {
    for (const end = Date.now() + 60_000; received() < count && Date.now() < end; ) await sleep(20);
  }

  // A server in service has run its delivery path before (V8 compiles what turns hot, the sockets' buffers
  // have grown): `warmup` seconds of the same changes go first, their latency printed apart as the cold figure.
  const warmCount = Math.round(rate * args.warmup);
  const warm = await drive(warmCount);
  await delivered((warmCount - warm.failed) * perChange);
  const measuredFrom = Date.now();
  const base = received();

  const total = Math.round(rate * args.seconds);
  const childPids = procs ? groups.map((g) => g.pid) : [];
  const started = performance.now();
  const cpu0 = { server: serverCpu(), children: childPids.map(cpuOf), self: process.cpuUsage() };
  const { writes, failed: writeErrors, seconds: writeSeconds } = await drive(total);
  const expected = (total - writeErrors) * perChange;
  await delivered(base + expected);
  const elapsed = (performance.now() - started) / 1000;
  clearInterval(sampler);
  const self = process.cpuUsage(cpu0.self);
  const cpu = {
    server: (serverCpu() - cpu0.server) / elapsed,
    children: childPids.reduce((s, p, i) => s + cpuOf(p) - (cpu0.children[i] as number), 0) / elapsed,
    self: (self.user + self.system) / 1e6 / elapsed,
  };
  await hinted.return?.();
  await hearing;

  const reports = await Promise.all(groups.map((g) => g.report()));
  const latencies: number[] = [];
  const cold: number[] = [];
  const fromHint: number[] = [];
  const toHint = new Map<string, number>();
  for (const r of reports)
    for (const [cursor, at, arrivals] of r.deliveries) {
      // The warm-up's events were all written (and delivered) before the measured changes began.
      if (at < measuredFrom) {
        for (const t of arrivals) cold.push(t - at);
        continue;
      }
      const hint = hints.get(cursor);
      if (hint !== undefined) toHint.set(cursor, hint - at);
      for (const t of arrivals) {
        latencies.push(t - at);
        if (hint !== undefined) fromHint.push(t - hint);
      }
    }
  const committed = [...toHint.values()];
  for (const l of [latencies, writes, committed, fromHint, cold]) l.sort((a, b) => a - b);
  const p = (l: number[]) => `p50 ${percentile(l, 50).toFixed(0)} ms, p99 ${percentile(l, 99).toFixed(0)} ms`;
  const got = reports.reduce((n, r) => n + r.received, 0) - base;
  const misdelivered = reports.reduce((n, r) => n + r.misdelivered, 0);
  const perSecond = got / elapsed;
  console.log(`changes:                      ${total} (${(total / writeSeconds).toFixed(1)}/s), ${writeErrors} failed`);
  console.log(`writes (due → returned):      ${p(writes)} (waiting for a database connection included)`);
  console.log(
    `deliveries:                   ${got} of ${expected} in ${elapsed.toFixed(1)} s = ${perSecond.toFixed(0)}/s${perInstance ? `, ${misdelivered} to the wrong subscriber` : ""}`,
  );
  console.log(
    `delivery latency:             p50 ${percentile(latencies, 50).toFixed(0)} ms, p99 ${percentile(latencies, 99).toFixed(0)} ms, max ${latencies.at(-1)?.toFixed(0)} ms (goal p99 <= 50 ms)`,
  );
  if (cold.length) console.log(`  warm-up, first ${args.warmup} s after start: ${p(cold)}, max ${cold.at(-1)?.toFixed(0)} ms (not counted above)`);
  console.log(`  write clock → pub/sub hint: ${p(committed)} (the write path: transaction, commit, publish)`);
  console.log(`  pub/sub hint → subscriber:  ${p(fromHint)} (the live path: feed read, execution, websocket)`);
  console.log(
    `CPU (cores busy):             ${serverCount > 1 ? `${serverCount} servers` : "server"} ${cpu.server.toFixed(2)}, ${procs ? `subscriber processes ${cpu.children.toFixed(2)}, this process (changes) ${cpu.self.toFixed(2)}` : `this process (subscribers + changes) ${cpu.self.toFixed(2)}`}`,
  );
  console.log(`server peak RSS:              ${mibs(peakRss)} (goal <= ${perInstance ? 600 : 300} MiB${serverCount > 1 ? " each" : ""})`);
  console.log(`deliveries / PUBLISH rate:    ${(perSecond / publishRps).toFixed(3)}`);
  console.log(`load average after:           ${loadavg()}`);

  await Promise.all(groups.map((g) => g.close()));
  for (const x of servers) {
    x.child.kill("SIGTERM");
    await new Promise((r) => x.child.once("exit", r));
  }
  await close();
}

if (process.env[ROLE] === "subscribers") subscriberProcess();
else
  run().catch((e) => {
    console.error(e);
    process.exit(1);
  });
