/**
 * The expensive-query attack of issue 9, replayed against a whole platform.
 *
 *   npm run bench:abuse -- [--hosts 3] [--victims 24] [--owned 60] [--attackers 4] [--aliases 1000] [--first 500]
 *                          [--allowed-aliases 10] [--allowed-first 50] [--seconds 15] [--pg 0]
 *
 * One process runs what `bc dev` runs: the server, the worker and `hosts` simulated hosts on the embedded
 * database (PGlite, in-memory bus and jobs), or on PostgreSQL and Redis with --pg 1. A victim tenant has
 * `victims` running instances and reads one of them in a loop throughout. An attacker tenant owns `owned`
 * instances and, for `seconds` per phase, keeps `attackers` requests in flight:
 *   1. the attack as it was sent: `aliases` aliased `instances(first: first)` in one request;
 *   2. a flood of a query the default limits accept: `allowed-aliases` aliased `instances(first: allowed-first)`.
 * Prints the victim's latency (quiet, then during each phase), what the attacker's requests got back, and
 * whether any instance went LOST (goal: none, and the victim's p99 at most 100 ms on the embedded database).
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
  const count = async (sql: string, params: unknown[] = []) => (await api.platform.read((q) => q.query<{ n: number }>(sql, params)))[0]?.n ?? 0;
  for (const end = Date.now() + 120_000; (await count(`SELECT count(*)::int AS n FROM instances WHERE state = 'running'`)) < args.victims + args.owned; ) {
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
  async function attackLoop(query: string, ms: number) {
    const worker = new Worker(ATTACKER, {
      eval: true,
      workerData: { url: api.url, token: createApiToken.token, body: JSON.stringify({ query }), clients: args.attackers, ms },
    });
    const [reply] = (await once(worker, "message")) as [{ outcomes: [string, number][]; durations: number[] }];
    await worker.terminate();
    return { outcomes: new Map(reply.outcomes), durations: reply.durations.sort((a, b) => a - b) };
  }

  const fmt = (l: number[]) =>
    `p50 ${percentile(l, 50).toFixed(1)} ms, p99 ${percentile(l, 99).toFixed(1)} ms, max ${(l.at(-1) ?? Number.NaN).toFixed(1)} ms (${l.length} reads)`;
  const quiet = await victimLoop(3000);
  console.log(`victim, quiet:                 ${fmt(quiet.latencies)}`);

  const phases = [
    { name: `attack: ${args.aliases} x instances(first: ${args.first})`, query: aliased(args.aliases, args.first) },
    {
      name: `allowed: ${args["allowed-aliases"]} x instances(first: ${args["allowed-first"]})`,
      query: aliased(args["allowed-aliases"], args["allowed-first"]),
    },
  ];
  let worst = 0;
  let lostTotal = 0;
  for (const phase of phases) {
    const lastEvent = await count(`SELECT coalesce(max(id), 0)::int AS n FROM instance_events`);
    const [v, a] = await Promise.all([victimLoop(args.seconds * 1000), attackLoop(phase.query, args.seconds * 1000)]);
    // Reports that were held up land after the phase: let the sweep see them before counting.
    await new Promise((r) => setTimeout(r, Number(timing.NODE_LOST_GRACE_MS)));
    const lost = await count(`SELECT count(DISTINCT instance_id)::int AS n FROM instance_events WHERE to_state = 'lost' AND id > $1`, [lastEvent]);
    lostTotal += lost;
    worst = Math.max(worst, percentile(v.latencies, 99));
    console.log(`\n${phase.name}, ${args.seconds} s`);
    console.log(`  victim:                      ${fmt(v.latencies)}${v.failures.length ? `; ${v.failures.length} failed (${v.failures[0]})` : ""}`);
    console.log(
      `  attacker's requests:         ${[...a.outcomes].map(([k, n]) => `${n} ${k}`).join(", ")}; each took p50 ${percentile(a.durations, 50).toFixed(0)} ms, max ${(a.durations.at(-1) ?? 0).toFixed(0)} ms`,
    );
    console.log(`  instances that went LOST:    ${lost}`);
  }
  console.log(`\nvictim p99, worst phase: ${worst.toFixed(1)} ms (goal <= 100 ms); instances LOST: ${lostTotal} (goal 0)`);

  for (const agent of agents) await agent.close();
  await api.close();
  rmSync(dir, { recursive: true, force: true });
}

exitWhenDone(run());
