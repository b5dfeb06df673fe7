/**
 * Admission throughput against what PostgreSQL allows for the same writes on the same hot rows.
 *
 *   npm run bench:admission -- [--clients 16] [--seconds 10] [--nodes 3] [--tenants 1] [--warm 2] [--warm-max 30] [--insert 0] [--api-connections 0] [--statements 6]
 *
 * In one run, each phase `seconds` long with `clients` concurrent clients, one hosted pool of `nodes` hosts and
 * a /16, `tenants` tenants (client i creates as tenant i mod tenants):
 *
 *   write set  pgbench running bench/admission-write-set.sql: the least a hosted create writes (a host's
 *              counters, an address, the instance, its event, its audit row, the tenant's quota) as one
 *              statement, on tables shaped like the platform's in a database of their own. The limit: run
 *              before and after the platform's phases, and their mean taken, so load that comes and goes on a
 *              shared machine moves the limit as it moves the platform.
 *   core       admitInstance on the write path (platform.write), as the API would call it, without HTTP.
 *   API        createInstance over HTTP GraphQL: auth, limits, the API's database lane, Redis pub/sub and the
 *              BullMQ wake-up; the clients in a child process, as a server's callers are.
 *
 * Both sides start warm, as a database in service is: `warm` seconds of the same writes, then ANALYZE, so that
 * neither is planned from statistics taken while its tables were empty (PostgreSQL keeps a connection's plans,
 * foreign-key checks' included, until statistics change; autovacuum would refresh them within a minute, after
 * the phase). The API phase also creates through the API before it is measured, as a server in service has run
 * its code before: V8 compiles what turns hot, on the process's CPU, and under this load the platform's code
 * grows for 15 to 20 s. That warm-up lasts `warm` seconds at least, then until the compiled code of the
 * platform and of its clients has stopped growing, `warm-max` seconds at most (bench/lib.ts, Warm); the line
 * says how long it took. `--warm 0` measures from empty tables and cold code instead.
 *
 * Prints creates/s for each, core and API as ratios of the write set, the CPU each create cost each process
 * (the platform, the API's clients, PostgreSQL's and Redis's processes, the rest), and what the platform sent
 * PostgreSQL per create (statements and where their time went). `--insert 1` adds pgbench's single-row INSERT, the
 * server's ceiling with no hot row at all. `--api-connections N` sets LIMIT_API_CONNECTIONS (0: the
 * platform's default); `--statements N` lists that many statements per phase. Needs PostgreSQL, Redis, psql and pgbench.
 */
import { fork } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { admitInstance } from "../core/lifecycle/admission.ts";
import { CreateInstanceDocument, createClient } from "../sdk/client.ts";
import { startServer } from "../server/app.ts";
import { admissionDeps, hostedFixture, SMALL } from "./fixture.ts";
import {
  benchArgs,
  benchPlatform,
  childPhase,
  childrenCpu,
  closedLoop,
  compiledCode,
  exitWhenDone,
  machineCpu,
  pgbench,
  pgbenchInsertTps,
  psql,
  scratchDatabase,
  serviceCpu,
  warmThenMeasure,
  warmUp,
} from "./lib.ts";

const args = benchArgs({ clients: 16, seconds: 10, nodes: 3, tenants: 1, insert: 0, "api-connections": 0, statements: 6, warm: 2, "warm-max": 30 });
const GOAL = 0.5;
// No run comes near these, so a refusal in the figures is a bug, not a full tenant or host: a /16 holds 65,533
// addresses, and every host and quota has room for all of them.
const ROOM = 65_536;
const QUOTA = { instances: 1_000_000_000, vcpus: 1_000_000_000, memoryMib: 1_000_000_000, diskGib: 1_000_000_000 };

/** pgbench on the write set, in a database made and dropped for it. */
async function writeSet(clients: number, seconds: number) {
  const db = await scratchDatabase("bc_writeset");
  try {
    psql(db.url, ["-v", `hosts=${args.nodes}`, "-v", `tenants=${args.tenants}`, "-f", join(import.meta.dirname, "admission-write-set.setup.sql")]);
    // Index scans only, as the platform's charge_quota plans: a join that scans the tenant's usage rows in heap
    // order (once ANALYZE has seen how few they are; a connection replans mid-run when autovacuum analyzes) takes
    // them in a different order from one that probes them by key, two such charges deadlock, and every client
    // then waits out deadlock_timeout behind the hot rows (seen: a write set at 22-50 tps instead of 600).
    psql(db.url, ["-c", `ALTER DATABASE "${db.name}" SET enable_seqscan = off`, "-c", `ALTER DATABASE "${db.name}" SET enable_bitmapscan = off`]);
    // `n` numbers each client's creates: the measured run counts on from far past the warm-up's.
    const writes = (n: number, secs: number) =>
      pgbench(db.url, {
        clients,
        seconds: secs,
        script: join(import.meta.dirname, "admission-write-set.sql"),
        // A transaction PostgreSQL fails as a deadlock is run again, as the platform's write runner does, rather
        // than ending its client; the line says how many there were (the script takes hot rows in one order).
        maxTries: 4,
        define: { n, hosts: args.nodes, tenants: args.tenants, vcpus: SMALL.vcpus, memory_mib: SMALL.memoryMib, disk_gib: SMALL.diskGib },
      });
    let warmed = 0;
    if (args.warm > 0) {
      warmed = writes(0, args.warm).processed;
      psql(db.url, ["-c", "ANALYZE"]);
    }
    const machine0 = machineCpu();
    const children0 = childrenCpu();
    const run = writes(1_000_000_000, seconds);
    const cpuMs = ((machineCpu() - machine0) * 1000) / run.processed;
    // pgbench's own share (a child of this process, waited for); the rest is PostgreSQL's, give or take this
    // process's idle wait and the machine's background.
    const clientMs = ((childrenCpu() - children0) * 1000) / run.processed;
    // Every create wrote all six or nothing; a script that quietly wrote less would flatter the limit.
    const [counts, spread] = psql(db.url, [
      "-At",
      "-c",
      `SELECT (SELECT count(*) FROM instances) || ' ' || (SELECT count(*) FROM instance_events) || ' ' || (SELECT count(*) FROM audit_log)
              || ' ' || (SELECT count(*) FROM ip_addresses WHERE instance_id IS NOT NULL) || ' ' || (SELECT sum(alloc_instances) FROM nodes)
              || ' ' || (SELECT sum(used) FROM quota_usage WHERE resource = 'instances')`,
      "-c",
      "SELECT string_agg(alloc_instances::text, '/' ORDER BY id) FROM nodes",
    ])
      .trim()
      .split("\n");
    const made = (counts as string).split(" ").map(Number);
    if (new Set(made).size !== 1 || (made[0] as number) < run.processed + warmed)
      throw new Error(`the write set left uneven rows (instances events audit leases hosts quota: ${counts}) for ${run.processed} transactions`);
    return { ...run, spread: spread as string, cpuMs, clientMs };
  } finally {
    await db.drop();
  }
}

/**
 * Every statement this process sends PostgreSQL, counted and timed by its text: node-postgres is the platform's
 * only way to the server. Time runs from the call to the answer, so it includes waits for row locks.
 */
function statementProfile() {
  type Query = (this: unknown, ...a: unknown[]) => unknown;
  const proto = pg.Client.prototype as unknown as { query: Query };
  const query = proto.query;
  // Only kept while measuring; named and summed when reported, so the wrapper costs the measured process little.
  let sent: { client: object; text: string; ms: number }[] = [];
  let on = false;
  const preparedBy = new WeakMap<object, Map<string, string>>();
  const record = (client: object, first: unknown, t0: number) => {
    const text = typeof first === "string" ? first : ((first as { text?: string } | null)?.text ?? "?");
    sent.push({ client, text, ms: performance.now() - t0 });
  };
  // Statements sent as EXECUTEs of names prepared on the connection (infra/db) carry their parameters as
  // literals: each is counted under the text it was prepared from, so the calls of one statement add up.
  const keyOf = (client: object, text: string) => {
    const names = preparedBy.get(client);
    return text
      .replace(/PREPARE bcx_\d+ AS .*?(?=; BEGIN|; EXECUTE|$)/gs, "")
      .replace(
        /EXECUTE (bcx_\d+)\((?:'(?:[^']|'')*'|[^')])*\)/g,
        (_, name: string) => `EXECUTE [${(names?.get(name) ?? name).replace(/\s+/g, " ").slice(0, 70)}]`,
      )
      .replace(/\s+/g, " ")
      .replace(/^; /, "")
      .trim()
      .slice(0, 110);
  };
  // Names are prepared whenever a connection first runs a statement, measured or not.
  const learn = (client: object, first: unknown) => {
    if (typeof first !== "string" || !first.startsWith("PREPARE bcx_")) return;
    const names = preparedBy.get(client) ?? new Map<string, string>();
    preparedBy.set(client, names);
    for (const m of first.matchAll(/PREPARE (bcx_\d+) AS (.*?)(?=; PREPARE bcx_|; BEGIN|; EXECUTE|$)/gs)) names.set(m[1] as string, m[2] as string);
  };
  proto.query = function (...a) {
    learn(this as object, a[0]);
    if (!on) return query.apply(this, a);
    const t0 = performance.now();
    // pg.Pool#query calls with a callback and gets nothing back; transactions' clients get a promise.
    const cb = a.at(-1);
    if (typeof cb === "function") {
      a[a.length - 1] = (...r: unknown[]) => {
        record(this as object, a[0], t0);
        return cb(...r);
      };
      return query.apply(this, a);
    }
    const r = query.apply(this, a);
    if (r instanceof Promise)
      r.then(
        () => record(this as object, a[0], t0),
        () => record(this as object, a[0], t0),
      );
    return r;
  };
  return {
    start() {
      sent = [];
      on = true;
    },
    /** Per create: how many statements, their time, and the ones that took most of it. */
    report(creates: number, top = args.statements): string {
      on = false;
      const byText = new Map<string, { count: number; ms: number }>();
      for (const m of sent) {
        const key = keyOf(m.client, m.text);
        const s = byText.get(key) ?? { count: 0, ms: 0 };
        s.count++;
        s.ms += m.ms;
        byText.set(key, s);
      }
      sent = [];
      const rows = [...byText.entries()].sort((a, b) => b[1].ms - a[1].ms);
      const count = rows.reduce((n, [, s]) => n + s.count, 0);
      const ms = rows.reduce((n, [, s]) => n + s.ms, 0);
      const lines = rows
        .slice(0, top)
        .map(([text, s]) => `      ${(s.ms / creates).toFixed(2).padStart(6)} ms ${(s.count / creates).toFixed(2).padStart(5)}×  ${text}`);
      return [
        `    ${(count / creates).toFixed(1)} statements per create (all this process sent), ${(ms / creates).toFixed(1)} ms of statement time per create; most time:`,
        ...lines,
      ].join("\n");
    },
  };
}

type LoopResult = Awaited<ReturnType<typeof closedLoop>> & { cpuSeconds?: number };
interface ClientPlan {
  url: string;
  tokens: string[];
  poolId: string;
  imageId: string;
  /** Seconds of creates before the measured loop, at least (Warm). */
  warm: number;
}
/** Set in the client process this bench forks for the API phase. */
const ROLE = "ADMISSION_CLIENTS";

/** The API phase's clients: a child process of this bench (the same file, under the same loader). */
function apiClients(plan: ClientPlan, measure: () => Promise<void>): Promise<LoopResult & { warmedSeconds: number }> {
  const child = fork(fileURLToPath(import.meta.url), process.argv.slice(2), { env: { ...process.env, [ROLE]: "1" } });
  return childPhase<LoopResult>(child, plan, measure, { min: plan.warm, max: Math.max(plan.warm, args["warm-max"]) }).finally(() => child.kill());
}

async function clientProcess() {
  const plan = await new Promise<ClientPlan>((resolve) => process.once("message", (m) => resolve(m as ClientPlan)));
  const clients = plan.tokens.map((token) => createClient({ url: plan.url, token }));
  // With a warm-up, neither the client's loading nor either process's compiling of code not yet run counts.
  const result = await warmThenMeasure(clients.length, plan.warm, args.seconds, async (i, n) => {
    await (clients[i] as (typeof clients)[number]).request(CreateInstanceDocument, {
      input: { poolId: plan.poolId, flavor: "small", imageId: plan.imageId, idempotencyKey: `api-${n}` },
    });
  });
  await new Promise((sent) => process.send?.(result, sent));
}

async function run() {
  const c = args.clients;
  const apiConnections = args["api-connections"];
  console.log(
    `admission bench: ${c} clients, ${args.seconds} s per phase, ${args.tenants} tenant(s), ${args.nodes} hosts, one /16 pool; ` +
      `API database connections ${apiConnections || "default"}`,
  );
  const profile = statementProfile();
  /**
   * Where the machine's CPU went per create during a phase: this process (the platform, and for the core phase
   * its callers too), the API phase's client process, and the rest of the machine (PostgreSQL, Redis).
   */
  const cpuMeter = () => {
    const machine0 = machineCpu();
    const services0 = serviceCpu();
    const self0 = process.cpuUsage();
    return (creates: number, clientSeconds = 0) => {
      const self = process.cpuUsage(self0);
      const platformS = (self.user + self.system) / 1e6;
      const services = serviceCpu();
      const postgres = services.postgres - services0.postgres;
      const redis = services.redis - services0.redis;
      const rest = machineCpu() - machine0 - platformS - clientSeconds - postgres - redis;
      const per = (seconds: number) => `${((seconds * 1000) / creates).toFixed(2)} ms`;
      return (
        `    CPU per create: platform process ${per(platformS)}${clientSeconds ? `, client process ${per(clientSeconds)}` : ""}, ` +
        `PostgreSQL ${per(postgres)}, Redis ${per(redis)}, rest of the machine ${per(Math.max(0, rest))}`
      );
    };
  };
  const line = (what: string, rate: number, rest: string) => console.log(`${what.padEnd(34)} ${rate.toFixed(0).padStart(5)} ${rest}`);
  const writeSetRun = async (when: string) => {
    const ws = await writeSet(c, args.seconds);
    line(
      `pgbench, least write set (${when}):`,
      ws.tps,
      `tps        latency avg ${ws.latencyMs.toFixed(1)} ms  hosts ${ws.spread}  CPU ${ws.cpuMs.toFixed(2)} ms a transaction (pgbench ${ws.clientMs.toFixed(2)})${ws.retried ? `  retried after a deadlock ${ws.retried}` : ""}`,
    );
    return ws.tps;
  };
  const first = await writeSetRun("before");
  if (args.insert) line("pgbench, single-row INSERT:", await pgbenchInsertTps(c, args.seconds), "tps");

  const { platform, databaseUrl, close } = await benchPlatform({
    poolSize: c + 2,
    env: {
      // The limiter runs as in service (points reserved from Redis a twentieth of the budget at a time), with a
      // budget one tenant's 16 clients cannot spend: the default (60 requests/s) would be gone within a second.
      LIMIT_RATE_POINTS: "1000000000",
      ...(apiConnections ? { LIMIT_API_CONNECTIONS: String(apiConnections) } : {}),
    },
  });
  try {
    const fx = await hostedFixture(platform, { nodes: args.nodes, tenants: args.tenants, quota: QUOTA, hostRoom: ROOM });
    // As the write set's tables are: 65,533 fresh address rows would otherwise be planned, and vacuumed, whenever
    // autovacuum got to them, mid-phase or not.
    psql(databaseUrl as string, ["-c", "VACUUM ANALYZE"]);
    const deps = admissionDeps(platform);
    const tenantOf = (i: number) => fx.tenants[i % fx.tenants.length] as (typeof fx.tenants)[number];
    const coreCreate = (phase: string) => async (i: number, n: number) => {
      const t = tenantOf(i);
      await platform.write({ actor: t.apiToken.identityId, action: "createInstance" }, (w) =>
        admitInstance(
          w,
          deps,
          { identityId: t.apiToken.identityId, tenantId: t.tenant.id },
          { poolId: fx.poolId, flavor: "small", imageId: fx.imageId, idempotencyKey: `${phase}-${n}` },
          { commits: true },
        ),
      );
    };
    // The core's warm-up is the API's (Warm), on this process's code alone; rounds of a second, apart in their keys.
    const coreWarm = warmUp({ min: args.warm, max: Math.max(args.warm, args["warm-max"]) });
    for (let round = 0; coreWarm.more([compiledCode()]); round++) await closedLoop(c, Math.min(1, args.warm), coreCreate(`warm${round}`));
    if (args.warm > 0) psql(databaseUrl as string, ["-c", "ANALYZE"]);
    const hostCounts = async () =>
      (await platform.read((sql) => sql.query<{ n: number }>(`SELECT alloc_instances AS n FROM nodes WHERE pool_id = $1 ORDER BY id`, [fx.poolId]))).map(
        (r) => r.n,
      );
    const spreadSince = async (before: number[]) => (await hostCounts()).map((n, i) => n - (before[i] ?? 0)).join("/");

    let before = await hostCounts();
    profile.start();
    let cpu = cpuMeter();
    const core = await closedLoop(c, args.seconds, coreCreate("core"));
    const coreCpu = cpu(core.done);
    const coreProfile = profile.report(core.done);
    line(
      "admission, core transaction:",
      core.perSecond,
      `creates/s  p50 ${core.p50.toFixed(1)} ms  p99 ${core.p99.toFixed(1)} ms  errors ${core.errors}  hosts ${await spreadSince(before)}  after ${coreWarm.seconds().toFixed(0)} s warm`,
    );
    console.log(coreCpu);
    console.log(coreProfile);

    const app = await startServer(platform, { port: 0, host: "127.0.0.1" });
    // The clients run in a process of their own, as callers of a server do: their HTTP and JSON work is not the
    // server's, and would otherwise take turns with it on this process's one thread.
    const tokens = Array.from({ length: c }, (_, i) => tenantOf(i).token);
    const api = await apiClients({ url: app.url, tokens, poolId: fx.poolId, imageId: fx.imageId, warm: args.warm }, async () => {
      before = await hostCounts();
      profile.start();
      cpu = cpuMeter();
    });
    const apiCpu = cpu(api.done, api.cpuSeconds);
    const apiProfile = profile.report(api.done);
    line(
      "admission, whole API (HTTP+Redis):",
      api.perSecond,
      `creates/s  p50 ${api.p50.toFixed(1)} ms  p99 ${api.p99.toFixed(1)} ms  errors ${api.errors}  hosts ${await spreadSince(before)}  after ${api.warmedSeconds.toFixed(0)} s warm`,
    );
    console.log(apiCpu);
    console.log(apiProfile);
    await app.close();

    const last = await writeSetRun("after");
    const limit = (first + last) / 2;
    const coreRatio = core.perSecond / limit;
    const apiRatio = api.perSecond / limit;
    // The mean evens out a drift; a limit that fell or rose by half within the run says the machine was not
    // steady (something else held the CPU or the disk for a phase), and no ratio of it means anything.
    const steady = Math.min(first, last) >= Math.max(first, last) / 2;
    console.log(
      `ratio of the write set (mean ${limit.toFixed(0)} tps): core ${coreRatio.toFixed(3)}, API ${apiRatio.toFixed(3)}  ` +
        (steady
          ? `(goal: API >= ${GOAL} — ${apiRatio >= GOAL ? "met" : "NOT met"})`
          : `(not judged: the write set ran at ${first.toFixed(0)} and then ${last.toFixed(0)} tps; the machine was not steady, run again)`),
    );
  } finally {
    await close();
  }
}

exitWhenDone(process.env[ROLE] ? clientProcess() : run());
