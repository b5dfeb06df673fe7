/**
 * The expensive-query attack of issue 9 and the subscription attacks of issue 42, replayed against a whole platform.
 *
 *   npm run bench:abuse -- [--hosts 3] [--victims 24] [--owned 60] [--attackers 4] [--aliases 1000] [--first 500]
 *                          [--allowed-aliases 10] [--allowed-first 50] [--sockets 2] [--subscriptions 1000]
 *                          [--execs 200] [--seconds 15] [--pg 0] [--only N]
 *
 * One process runs what `bc dev` runs: the server, the worker and `hosts` simulated hosts on the embedded
 * database (PGlite, in-memory bus and jobs), or on PostgreSQL and Redis with --pg 1. A victim tenant has
 * `victims` running instances and reads one of them in a loop throughout. An attacker tenant owns `owned`
 * instances and, for `seconds` per phase, keeps `attackers` requests in flight:
 *   1. the attack as it was sent: `aliases` aliased `instances(first: first)` in one request;
 *   2. a flood of a query the default limits accept: `allowed-aliases` aliased `instances(first: allowed-first)`;
 *   3. a replay storm: `sockets` websockets, each opening `subscriptions` subscriptions to its tenant's whole history
 *      (`instanceEvents(after: "0")`), opened again as each one ends or is refused;
 *   4. an exec storm: `execs` `sandboxExec` subscriptions at once in the attacker's sandbox, each a command that
 *      prints 64 KiB, started again as each ends.
 * `--only N` runs phase N alone. Prints the victim's latency (quiet, then during each phase), the age of the hosts' last reports (sampled every
 * 100 ms), what the attacker got back, and whether any instance went LOST (goals: none; the victim's p99 at most
 * 100 ms and hosts' reports at most 5 s old throughout, on the embedded database and on PostgreSQL).
 */
import { once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Worker } from "node:worker_threads";
import { startAgent } from "../agent/index.ts";
import { createFakeRuntime } from "../agent/runtimes/fake/index.ts";
import * as bc from "../sdk/client.ts";
import { benchApi, benchArgs, exitWhenDone, percentile } from "./lib.ts";

const args = benchArgs({
  hosts: 3,
  victims: 24,
  owned: 60,
  attackers: 4,
  aliases: 1000,
  first: 500,
  "allowed-aliases": 10,
  "allowed-first": 50,
  sockets: 2,
  subscriptions: 1000,
  execs: 200,
  only: 0,
  seconds: 15,
  pg: 0,
});
/** Short graces so that a stalled host shows as LOST within a phase; the defaults are 30 s and 5 s. */
const timing = { NODE_LOST_GRACE_MS: "5000", RECONCILE_SWEEP_MS: "1000", heartbeatMs: 1000 };
const FIELDS = "nodes { id state desiredState flavor vcpus memoryMib addresses nodeId version createdAt }";
/** `clients` loops of the same request for `ms`; a client that honours the retry hint (one that ignores it is refused the same way, only faster). */
const ATTACKER = `
const { workerData: w, parentPort } = require("node:worker_threads");
const outcomes = new Map();
const durations = [];
const end = performance.now() + w.ms;
const headers = { "content-type": "application/json", authorization: "Bearer " + w.token };
Promise.all(Array.from({ length: w.clients }, async () => {
  while (performance.now() < end) {
    const t0 = performance.now();
    let outcome;
    try {
      const res = await fetch(w.url, { method: "POST", headers, body: w.body });
      const first = (await res.json()).errors?.[0]?.extensions;
      outcome = first ? (first.code ?? "HTTP " + res.status) : "answered";
      if (first?.retryAfterMs) await new Promise((r) => setTimeout(r, Math.max(0, Math.min(first.retryAfterMs, end - performance.now()))));
    } catch (e) {
      outcome = "failed: " + e.message;
    }
    durations.push(performance.now() - t0);
    outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
  }
})).then(() => parentPort.postMessage({ outcomes: [...outcomes], durations }));
`;
/**
 * The subscription attacks, from a thread of their own: `sockets` graphql-ws connections holding `each` subscriptions
 * of `query` each, every one started again as soon as it ends or is refused (after the retry hint, if any).
 */
const SUBSCRIBER = `
const { workerData: w, parentPort } = require("node:worker_threads");
const { createRequire } = require("node:module");
const req = createRequire(w.from);
const { createClient } = req("graphql-ws");
const { WebSocket } = req("ws");
const outcomes = new Map();
let frames = 0;
const count = (k) => outcomes.set(k, (outcomes.get(k) ?? 0) + 1);
const end = performance.now() + w.ms;
const clients = Array.from({ length: w.sockets }, () => createClient({
  url: w.url, webSocketImpl: WebSocket, connectionParams: { authorization: "Bearer " + w.token }, retryAttempts: 1000,
  retryWait: () => new Promise((r) => setTimeout(r, 200)), shouldRetry: () => performance.now() < end, lazy: false, onNonLazyError: () => {},
}));
const loop = (client) => new Promise((done) => {
  const again = (wait) => (performance.now() < end ? setTimeout(() => loop(client).then(done), wait) : done());
  client.subscribe({ query: w.query, variables: w.variables }, {
    next: (r) => { frames++; if (r.data?.sandboxExec?.stream === "EXIT") count("exits"); const x = r.errors?.[0]?.extensions; if (r.errors) { count((x?.code ?? "error") + (x?.limit ? " (" + x.limit + ")" : "")); again(x?.retryAfterMs ?? 100); } },
    error: (e) => { count(Array.isArray(e) ? (e[0]?.extensions?.code ?? "error") : "closed " + (e?.code ?? "")); again(200); },
    complete: () => { count("completed"); again(0); },
  });
});
for (const c of clients) for (let i = 0; i < w.each; i++) loop(c);
// Live subscriptions never end by themselves: the phase ends on time, and the parent ends this thread and its sockets.
setTimeout(() => parentPort.postMessage({ outcomes: [...outcomes], frames }), w.ms);
`;
const aliased = (n: number, first: number) =>
  `query Attack { ${Array.from({ length: n }, (_, i) => `a${i}: instances(first: ${first}) { ${FIELDS} }`).join(" ")} }`;

async function run() {
  const where = args.pg ? "PostgreSQL + Redis" : "embedded (PGlite, in-memory bus and jobs)";
  console.log(`abuse bench: ${where}; ${args.hosts} simulated hosts (heartbeat ${timing.heartbeatMs} ms, lost after ${timing.NODE_LOST_GRACE_MS} ms)`);
  console.log(`victim: ${args.victims} running instances, one-row reads in a loop; attacker: ${args.owned} instances, ${args.attackers} requests in flight`);
  const dir = mkdtempSync(join(tmpdir(), "bc-abuse-"));
  const api = await benchApi({
    poolSize: 10,
    embedded: !args.pg,
    env: { NODE_LOST_GRACE_MS: timing.NODE_LOST_GRACE_MS, RECONCILE_SWEEP_MS: timing.RECONCILE_SWEEP_MS },
    ipv4Range: "10.120.0.0/20",
    tiny: { vcpus: 1, memoryMib: 256, diskGib: 2 },
    image: { source: "https://images.invalid/i.qcow2", sha256: "c".repeat(64) },
  });
  const agents = [];
  for (let i = 0; i < args.hosts; i++) {
    const stateDir = join(dir, `host-${i}`);
    agents.push(
      await startAgent({
        server: api.url,
        joinToken: await api.joinToken(),
        name: `h${i}`,
        stateDir,
        heartbeatMs: timing.heartbeatMs,
        runtime: createFakeRuntime({ dir: join(stateDir, "fake"), capacity: { vcpus: 256, memoryMib: 262_144, diskGib: 10_000, gpus: [] } }),
      }),
    );
  }
  await api.hostsReported(args.hosts);

  const victim = api.tenant;
  const { createTenant } = await api.operator.request(bc.CreateTenantDocument, { input: { name: "attacker" } });
  const { createApiToken } = await api.operator.request(bc.CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "attacker" } });
  const attacker = bc.createClient({ url: api.url, token: createApiToken.token });
  const create = (client: bc.Client, n: number, key: string) =>
    Promise.all(
      Array.from({ length: n }, (_, k) =>
        client.request(bc.CreateInstanceDocument, { input: { poolId: api.poolId, flavor: "tiny", imageId: api.imageId, idempotencyKey: `${key}${k}` } }),
      ),
    );
  const mine = await create(victim, args.victims, "v");
  await create(attacker, args.owned, "a");
  const { createSandboxTemplate } = await attacker.request(bc.CreateSandboxTemplateDocument, {
    input: { name: "storm", poolId: api.poolId, flavor: "tiny", imageId: api.imageId, ttlSeconds: 3600 },
  });
  const { createSandbox } = await attacker.request(bc.CreateSandboxDocument, { input: { templateId: createSandboxTemplate.id } });
  const count = async (sql: string, params: unknown[] = []) => (await api.platform.read((q) => q.query<{ n: number }>(sql, params)))[0]?.n ?? 0;
  for (const end = Date.now() + 120_000; (await count(`SELECT count(*)::int AS n FROM instances WHERE state = 'running'`)) < args.victims + args.owned + 1; ) {
    if (Date.now() > end) throw new Error("the instances did not all reach running in 2 minutes");
    await new Promise((r) => setTimeout(r, 100));
  }
  const target = mine[0]?.createInstance.id as string;

  /** The victim's one-row read, in a loop for `ms`: each read's latency in ms, whether it was answered or failed. */
  async function victimLoop(ms: number) {
    const latencies: number[] = [];
    const failures: string[] = [];
    for (const end = performance.now() + ms; performance.now() < end; ) {
      const t0 = performance.now();
      try {
        await victim.request(bc.InstanceDocument, { id: target });
      } catch (e) {
        failures.push((e as Error).message);
      }
      latencies.push(performance.now() - t0);
      await new Promise((r) => setTimeout(r, 20));
    }
    return { latencies: latencies.sort((a, b) => a - b), failures };
  }

  /** The attacker's requests, sent from a thread of their own: a real attacker's client is not on the server's CPU. */
  /** Each phase attacks with a token of its own: a budget the phases before it did not spend. */
  const phaseToken = async (name: string) =>
    (await api.operator.request(bc.CreateApiTokenDocument, { input: { tenantId: createTenant.id, name } })).createApiToken.token;

  async function attackLoop(query: string, ms: number) {
    const worker = new Worker(ATTACKER, {
      eval: true,
      workerData: { url: api.url, token: await phaseToken("requests"), body: JSON.stringify({ query }), clients: args.attackers, ms },
    });
    const [reply] = (await once(worker, "message")) as [{ outcomes: [string, number][]; durations: number[] }];
    await worker.terminate();
    return { outcomes: new Map(reply.outcomes), durations: reply.durations.sort((a, b) => a - b) };
  }

  /** The subscription attacks' thread, for `ms`. */
  async function subscribeLoop(query: string, variables: Record<string, unknown>, sockets: number, each: number, ms: number) {
    const worker = new Worker(SUBSCRIBER, {
      eval: true,
      workerData: { from: import.meta.url, url: api.url.replace(/^http/, "ws"), token: await phaseToken("subscriptions"), query, variables, sockets, each, ms },
    });
    const [reply] = (await once(worker, "message")) as [{ outcomes: [string, number][]; frames: number }];
    await worker.terminate();
    return { outcomes: new Map(reply.outcomes), frames: reply.frames };
  }

  /** The oldest host report's age, every 100 ms until `stop` resolves: the worst seen, in ms. */
  async function reportAge(stop: Promise<unknown>) {
    let worst = 0;
    let done = false;
    void stop.finally(() => {
      done = true;
    });
    while (!done) {
      const [row] = await api.platform.read((q) =>
        q.query<{ ms: number }>(`SELECT coalesce(extract(epoch FROM (now() - min(last_report_at))) * 1000, 0)::float8 AS ms FROM nodes WHERE gone_at IS NULL`),
      );
      worst = Math.max(worst, row?.ms ?? 0);
      await new Promise((r) => setTimeout(r, 100));
    }
    return worst;
  }

  const fmt = (l: number[]) =>
    `p50 ${percentile(l, 50).toFixed(1)} ms, p99 ${percentile(l, 99).toFixed(1)} ms, max ${(l.at(-1) ?? Number.NaN).toFixed(1)} ms (${l.length} reads)`;
  const quiet = await victimLoop(3000);
  console.log(`victim, quiet:                 ${fmt(quiet.latencies)}`);

  type Attack = () => Promise<{ outcomes: Map<string, number>; detail: string }>;
  const ms = args.seconds * 1000;
  const requests =
    (query: string): Attack =>
    async () => {
      const a = await attackLoop(query, ms);
      return { outcomes: a.outcomes, detail: `each took p50 ${percentile(a.durations, 50).toFixed(0)} ms, max ${(a.durations.at(-1) ?? 0).toFixed(0)} ms` };
    };
  const subscriptions =
    (query: string, variables: Record<string, unknown>, sockets: number, each: number): Attack =>
    async () => {
      const a = await subscribeLoop(query, variables, sockets, each, ms);
      return { outcomes: a.outcomes, detail: `${a.frames} frames received` };
    };
  const phases: { name: string; attack: Attack }[] = [
    { name: `attack: ${args.aliases} x instances(first: ${args.first})`, attack: requests(aliased(args.aliases, args.first)) },
    {
      name: `allowed: ${args["allowed-aliases"]} x instances(first: ${args["allowed-first"]})`,
      attack: requests(aliased(args["allowed-aliases"], args["allowed-first"])),
    },
    {
      name: `replay storm: ${args.sockets} sockets x ${args.subscriptions} instanceEvents(after: "0")`,
      attack: subscriptions(
        `subscription { instanceEvents(after: "0") { cursor toState reason version at instance { ${FIELDS.slice(8, -2)} } } }`,
        {},
        args.sockets,
        args.subscriptions,
      ),
    },
    {
      name: `exec storm: ${args.execs} x sandboxExec (64 KiB of output each)`,
      attack: subscriptions(
        `subscription($id: ID!) { sandboxExec(sandboxId: $id, command: ["sh", "-c", "head -c 65536 /dev/zero | tr '\\\\0' x"]) { stream data exitCode } }`,
        { id: createSandbox.id },
        1,
        args.execs,
      ),
    },
  ];
  let worst = 0;
  let worstAge = 0;
  let lostTotal = 0;
  for (const phase of args.only ? phases.slice(args.only - 1, args.only) : phases) {
    const lastEvent = await count(`SELECT coalesce(max(id), 0)::int AS n FROM instance_events`);
    const attack = phase.attack();
    const [v, a, age] = await Promise.all([victimLoop(ms), attack, reportAge(attack)]);
    // Reports that were held up land after the phase: let the sweep see them before counting.
    await new Promise((r) => setTimeout(r, Number(timing.NODE_LOST_GRACE_MS)));
    const lost = await count(`SELECT count(DISTINCT instance_id)::int AS n FROM instance_events WHERE to_state = 'lost' AND id > $1`, [lastEvent]);
    lostTotal += lost;
    worst = Math.max(worst, percentile(v.latencies, 99));
    worstAge = Math.max(worstAge, age);
    console.log(`\n${phase.name}, ${args.seconds} s`);
    console.log(`  victim:                      ${fmt(v.latencies)}${v.failures.length ? `; ${v.failures.length} failed (${v.failures[0]})` : ""}`);
    console.log(`  attacker got:                ${[...a.outcomes].map(([k, n]) => `${n} ${k}`).join(", ") || "nothing"}; ${a.detail}`);
    console.log(`  oldest host report:          ${(age / 1000).toFixed(1)} s at worst`);
    console.log(`  instances that went LOST:    ${lost}`);
  }
  console.log(
    `\nvictim p99, worst phase: ${worst.toFixed(1)} ms (goal <= 100 ms); oldest host report: ${(worstAge / 1000).toFixed(1)} s (goal <= 5 s); instances LOST: ${lostTotal} (goal 0)`,
  );

  for (const agent of agents) await agent.close();
  await api.close();
  rmSync(dir, { recursive: true, force: true });
}

exitWhenDone(run());
