import { type ChildProcess, execFileSync, type Serializable } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { getHeapCodeStatistics } from "node:v8";
import { parseConfig } from "../infra/config.ts";
import { openDatabase } from "../infra/db/index.ts";
import { migrate } from "../infra/db/migrate.ts";
import { openPlatform, type Platform } from "../infra/platform.ts";
import * as bc from "../sdk/client.ts";
import { startServer } from "../server/app.ts";
import { createDatabase, dropDatabase, urlFor } from "../tests/support/pg.ts";
import { startWorker } from "../worker/index.ts";

/** A scratch database on the same server the platform uses, dropped afterwards. */
export async function scratchDatabase(prefix: string) {
  const name = `${prefix}_${randomBytes(4).toString("hex")}`;
  await createDatabase(name);
  return { name, url: urlFor(name), drop: () => dropDatabase(name) };
}

/** psql's and pgbench's connection flags for a database URL. */
export function pgFlags(databaseUrl: string): string[] {
  const url = new URL(databaseUrl);
  return ["-h", url.hostname, "-p", url.port || "5432", ...(url.username ? ["-U", decodeURIComponent(url.username)] : [])];
}

/** Run psql on a database, stopping at the first error. */
export function psql(databaseUrl: string, args: string[]): string {
  const name = decodeURIComponent(new URL(databaseUrl).pathname.slice(1));
  return execFileSync("psql", [...pgFlags(databaseUrl), "-q", "-X", "-v", "ON_ERROR_STOP=1", ...args, name], { encoding: "utf8" });
}

/** Run pgbench (no vacuum of its own tables, prepared statements) and read its result. */
export function pgbench(
  databaseUrl: string,
  opts: { clients: number; seconds: number; script: string; define?: Record<string, string | number>; maxTries?: number },
) {
  const name = decodeURIComponent(new URL(databaseUrl).pathname.slice(1));
  const defines = Object.entries(opts.define ?? {}).flatMap(([k, v]) => ["-D", `${k}=${v}`]);
  const out = execFileSync(
    "pgbench",
    [
      ...pgFlags(databaseUrl),
      "-n",
      "-M",
      "prepared",
      "-c",
      String(opts.clients),
      "-j",
      String(Math.min(opts.clients, 2)),
      "-T",
      String(opts.seconds),
      ...(opts.maxTries ? [`--max-tries=${opts.maxTries}`] : []),
      ...defines,
      "-f",
      opts.script,
      name,
    ],
    { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] },
  );
  const tps = /tps = ([0-9.]+) \(without initial connection time\)/.exec(out)?.[1];
  const processed = /number of transactions actually processed: (\d+)/.exec(out)?.[1];
  const latency = /latency average = ([0-9.]+) ms/.exec(out)?.[1];
  if (!tps || !processed) throw new Error(`could not read pgbench's result:\n${out}`);
  const retried = /number of transactions retried: (\d+)/.exec(out)?.[1];
  return { tps: Number(tps), processed: Number(processed), latencyMs: Number(latency), retried: Number(retried ?? 0) };
}

/**
 * The machine's own limit for one row: pgbench running one single-row INSERT per transaction with the same
 * number of clients, against the same server. Returns transactions per second.
 */
export async function pgbenchInsertTps(clients: number, seconds: number): Promise<number> {
  const db = await scratchDatabase("bc_pgbench");
  const dir = mkdtempSync(join(tmpdir(), "bc-pgbench-"));
  try {
    psql(db.url, ["-c", "CREATE TABLE rows (id bigserial PRIMARY KEY, tenant text NOT NULL, body jsonb NOT NULL, at timestamptz NOT NULL DEFAULT now())"]);
    const script = join(dir, "insert.sql");
    writeFileSync(script, "INSERT INTO rows (tenant, body) VALUES ('t', '{}');\n");
    return pgbench(db.url, { clients, seconds, script }).tps;
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await db.drop();
  }
}

/** A bench's end: exit 0 once `main` is done, or print its error and exit 1 (child processes and sockets may linger). */
export function exitWhenDone(main: Promise<unknown>): void {
  main.then(
    () => process.exit(0),
    (e) => {
      console.error(e);
      process.exit(1);
    },
  );
}

/**
 * A process's /proc stat line: its command name (in parentheses, and may hold spaces or parentheses itself) and
 * the fields after it, numbered from the state field (0) on.
 */
function procStat(pid: number | "self"): { name: string; fields: string[] } {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const end = stat.lastIndexOf(")");
  return { name: stat.slice(stat.indexOf("(") + 1, end), fields: stat.slice(end + 2).split(" ") };
}

/** CPU seconds (user + system) in stat fields, from the first of the pair. */
const cpuSeconds = (fields: string[], first: number) => (Number(fields[first]) + Number(fields[first + 1])) / 100;

/** CPU seconds a process has used (user + system), from /proc. */
export const cpuOf = (pid: number) => cpuSeconds(procStat(pid).fields, 11);

/** CPU seconds the whole machine has spent busy (every core, everything but idle and I/O wait), from /proc. */
export const machineCpu = () => {
  const f = (readFileSync("/proc/stat", "utf8").split("\n")[0] as string).trim().split(/\s+/).slice(1).map(Number);
  return f.reduce((a, b) => a + b, 0) / 100 - ((f[3] as number) + (f[4] as number)) / 100;
};

/**
 * CPU seconds the machine's PostgreSQL and Redis processes have used, summed over those alive now: a phase's
 * share is the difference of two readings while its connections stay open (a process that exits in between takes
 * its count with it).
 */
export function serviceCpu(): { postgres: number; redis: number } {
  const out = { postgres: 0, redis: 0 };
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    let stat: ReturnType<typeof procStat>;
    try {
      stat = procStat(Number(pid));
    } catch {
      continue;
    }
    const which = stat.name === "postgres" ? "postgres" : stat.name === "redis-server" ? "redis" : null;
    if (which) out[which] += cpuSeconds(stat.fields, 11);
  }
  return out;
}

/** CPU seconds of this process's children that have exited and been waited for (a pgbench run, say). */
export const childrenCpu = () => cpuSeconds(procStat("self").fields, 13);

export function benchArgs<K extends string>(defaults: Record<K, number>): Record<K, number> {
  const { values } = parseArgs({ options: Object.fromEntries(Object.keys(defaults).map((k) => [k, { type: "string" as const }])), allowPositionals: false });
  return Object.fromEntries(Object.entries<number>(defaults).map(([k, v]) => [k, values[k] === undefined ? v : Number(values[k])])) as Record<K, number>;
}

/** A process's resident memory in bytes, from /proc. */
export const rssOf = (pid: number) => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0) * 1024;

export function percentile(sorted: number[], p: number): number {
  if (!sorted.length) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
}

/** Run `worker(i)` in `clients` loops until `seconds` pass; returns the count and each call's latency (ms). */
export async function closedLoop(clients: number, seconds: number, call: (client: number, n: number) => Promise<void>) {
  const end = performance.now() + seconds * 1000;
  const latencies: number[] = [];
  let errors = 0;
  let seq = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      while (performance.now() < end) {
        const t0 = performance.now();
        try {
          await call(c, seq++);
          latencies.push(performance.now() - t0);
        } catch (e) {
          if (errors++ === 0) console.error("first error:", e);
        }
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  return { done: latencies.length, errors, perSecond: latencies.length / elapsed, p50: percentile(latencies, 50), p99: percentile(latencies, 99) };
}

/** Bytes of compiled code this process holds (V8's machine code and bytecode, with their metadata). */
export function compiledCode(): number {
  const s = getHeapCodeStatistics();
  return s.code_and_metadata_size + s.bytecode_and_metadata_size;
}

/**
 * How long a warm-up lasts: at least `min` seconds, then until the compiled code of each process taking part
 * (sampled after each round of a second) grew by less than 1% over the last three rounds, at most `max` seconds.
 * V8 compiles what turns hot on the process's own CPU and a little at a time: under a saturating load a server's
 * code took 15 to 20 s to stop growing, and until then its optimizing compiler took a tenth of its CPU (perf,
 * bench/admission's API phase two seconds in; under 1% twenty seconds in). A server in service is past that.
 */
export interface Warm {
  min: number;
  max: number;
}
const SETTLE_ROUNDS = 3;
const SETTLE_GROWTH = 0.01;

/**
 * A measured phase run by a bench's client process (a child, as a server's callers are): the parent sends
 * `plan`; the child runs its calls in rounds of a second, saying "warm" (with its compiled code's size) after
 * each; the parent answers "more" until the warm-up is over (Warm), then, ready (`measure`: counters reset),
 * "go", and the child runs the measured loop (warmThenMeasure). Resolves with what the child sends back and
 * how many seconds the warm-up took.
 */
export function childPhase<R>(child: ChildProcess, plan: object, measure: () => void | Promise<void>, warm?: Warm): Promise<R & { warmedSeconds: number }> {
  return new Promise((resolve, reject) => {
    const exited = (code: number | null) => reject(new Error(`the client process exited (${code})`));
    const warming = warmUp(warm);
    const onMessage = (m: unknown) => {
      if (typeof m === "object" && m !== null && "warm" in m) {
        if (warming.more([compiledCode(), Number(m.warm)])) return void child.send("more");
        return void Promise.resolve(measure()).then(() => child.send("go"), reject);
      }
      child.off("message", onMessage).off("exit", exited);
      resolve({ ...(m as R), warmedSeconds: warming.seconds() });
    };
    child.on("message", onMessage).once("exit", exited);
    child.send(plan as Serializable);
  });
}

/**
 * A warm-up's clock (Warm): `more` takes the compiled code's sizes after a round and says whether to run another;
 * `seconds` is how long the rounds took until it said no.
 */
export function warmUp(warm: Warm | undefined) {
  const started = performance.now();
  const series: number[][] = [];
  let took = 0;
  const over = () => {
    const s = (performance.now() - started) / 1000;
    if (!warm || warm.min <= 0 || s >= warm.max) return true;
    if (s < warm.min || series.length <= SETTLE_ROUNDS) return false;
    const now = series[series.length - 1] as number[];
    const then = series[series.length - 1 - SETTLE_ROUNDS] as number[];
    return now.every((bytes, i) => bytes <= (then[i] as number) * (1 + SETTLE_GROWTH));
  };
  return {
    more(sizes: number[]): boolean {
      series.push(sizes);
      if (!over()) return true;
      took = (performance.now() - started) / 1000;
      return false;
    },
    seconds: () => took,
  };
}

/**
 * The client side of childPhase: rounds of a second of `call` (numbered far past the measured run's, and apart
 * for each round) while the parent says "more" (none with `warm` 0), then the measured closed loop once it says
 * "go", with the CPU this process spent in it.
 */
export async function warmThenMeasure(clients: number, warm: number, seconds: number, call: (client: number, n: number) => Promise<void>) {
  for (let round = 0; ; round++) {
    if (warm > 0) await closedLoop(clients, Math.min(1, warm), (i, n) => call(i, n + 1_000_000_000 + round * 10_000_000));
    await new Promise((sent) => process.send?.({ warm: compiledCode() }, sent));
    const answer = await new Promise((heard) => process.once("message", heard));
    if (answer === "go") break;
  }
  const cpu0 = process.cpuUsage();
  const result = await closedLoop(clients, seconds, call);
  const cpu = process.cpuUsage(cpu0);
  return { ...result, cpuSeconds: (cpu.user + cpu.system) / 1e6 };
}

/**
 * A platform for one benchmark run: an empty migrated database of its own on this machine's PostgreSQL, a Redis
 * prefix of its own, a random operator token. `close` drops the database.
 */
export async function benchPlatform(opts: {
  poolSize: number;
  env?: Record<string, string>;
  /** The embedded mode (`bc dev`): PGlite in memory, in-memory bus and jobs; no PostgreSQL or Redis. */
  embedded?: boolean;
}): Promise<{ platform: Platform; operatorToken: string; databaseUrl?: string; close(): Promise<void> }> {
  if (opts.embedded) return embeddedPlatform(opts.env);
  const db = await scratchDatabase("bc_bench");
  const database = await openDatabase({ databaseUrl: db.url, poolSize: opts.poolSize });
  await database.session((sql) => migrate(sql));
  const operatorToken = randomBytes(20).toString("hex");
  const config = parseConfig(
    {},
    {
      DATABASE_URL: db.url,
      REDIS_URL: process.env.REDIS_URL ?? "redis://127.0.0.1:6379",
      REDIS_PREFIX: `bcbench_${randomBytes(3).toString("hex")}`,
      OPERATOR_TOKEN: operatorToken,
      SEAL_KEY: randomBytes(32).toString("base64"),
      LOG_LEVEL: "error",
      ...opts.env,
    },
  );
  const platform = await openPlatform(config, { db: database });
  return {
    platform,
    operatorToken,
    databaseUrl: db.url,
    async close() {
      await platform.close();
      await db.drop();
    },
  };
}

async function embeddedPlatform(env: Record<string, string> = {}) {
  const operatorToken = randomBytes(20).toString("hex");
  const config = parseConfig(
    {},
    { BC_DATA_DIR: "memory://", OPERATOR_TOKEN: operatorToken, SEAL_KEY: randomBytes(32).toString("base64"), LOG_LEVEL: "error", ...env },
  );
  const platform = await openPlatform(config, { embedded: true });
  return { platform, operatorToken, close: () => platform.close() };
}

/**
 * The whole API on a bench platform, ready for hosts to join: server and worker in this process, a hosted
 * pool with one `tiny` flavor and one public image, and a tenant with its client. `close` stops and drops it all.
 */
export async function benchApi(opts: {
  poolSize: number;
  env?: Record<string, string>;
  embedded?: boolean;
  ipv4Range: string;
  tiny: { vcpus: number; memoryMib: number; diskGib: number };
  image: { source: string; sha256: string };
}) {
  const { platform, operatorToken, close } = await benchPlatform({ poolSize: opts.poolSize, env: opts.env, embedded: opts.embedded });
  const app = await startServer(platform, { port: 0, host: "127.0.0.1" });
  const worker = await startWorker(platform);
  const op = bc.createClient({ url: app.url, token: operatorToken });
  const { createPool: pool } = await op.request(bc.CreatePoolDocument, { input: { name: "bench", class: "VPS_HOST", ipv4Range: opts.ipv4Range } });
  await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, name: "tiny", ...opts.tiny } });
  const { registerImage: image } = await op.request(bc.RegisterImageDocument, { input: { name: "tiny", ...opts.image, format: "QCOW2", public: true } });
  const { createTenant } = await op.request(bc.CreateTenantDocument, { input: { name: "bench" } });
  const { createApiToken } = await op.request(bc.CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "bench" } });
  return {
    platform,
    url: app.url,
    poolId: pool.id,
    imageId: image.id,
    tenantToken: createApiToken.token,
    tenant: bc.createClient({ url: app.url, token: createApiToken.token }),
    operator: op,
    joinToken: async () => (await op.request(bc.CreateJoinTokenDocument, { poolId: pool.id })).createJoinToken.token,
    /** Placement needs each node's capacity, which arrives with its agent's first report. */
    async hostsReported(count: number) {
      for (const end = Date.now() + 60_000; ; ) {
        const nodes = (await op.request(bc.NodesDocument, { poolId: pool.id })).nodes;
        if (nodes.filter((n) => n.capacity.vcpus > 0).length >= count) return;
        if (Date.now() > end) throw new Error(`only some of ${count} hosts reported their capacity`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    async close() {
      await worker.close();
      await app.close();
      await close();
    },
  };
}

/** Run `task(i)` for i < n, at most `width` at once. */
export async function inParallel(n: number, width: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(width, n) }, async () => {
      while (next < n) await task(next++);
    }),
  );
}

/**
 * The machine's own cost of a write as the platform's writes end: a one-row UPDATE and its COMMIT in one message,
 * through the platform's pool, on a table of the bench's own in the bench's own database (dropped with it). A
 * pause through the platform makes two writes (its request, the host's answer); this is what each costs before
 * any of the platform's own work, and the COMMIT waits for the WAL flush as theirs do.
 */
export async function probeWrite(platform: Platform): Promise<() => Promise<unknown>> {
  await platform.db.session(async (sql) => {
    await sql.query("CREATE TABLE IF NOT EXISTS bench_probe (id int PRIMARY KEY, n int NOT NULL)");
    await sql.query("INSERT INTO bench_probe VALUES (1, 0) ON CONFLICT DO NOTHING");
  });
  const text = "UPDATE bench_probe SET n = n + 1 WHERE id = $1";
  return () => platform.db.transaction((sql) => (sql.commitWith ? sql.commitWith(text, [1]) : sql.query(text, [1])));
}
