import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  type Client,
  CreateApiTokenDocument,
  CreateInstanceDocument,
  CreateTenantDocument,
  DeleteInstanceDocument,
  ResizeInstanceDocument,
  StartInstanceDocument,
  StopInstanceDocument,
  watchInstanceEvents,
} from "../../sdk/client.ts";
import { type Cluster, freePort, startCluster } from "../e2e/processes.ts";
import { prng, until } from "../support/fixtures.ts";
import { eventViolations } from "../support/hosts.ts";
import { invariantViolations, ledger } from "../support/ledger.ts";

/**
 * Faults during a seeded churn, on the real processes: two servers and two workers on PostgreSQL and a Redis of
 * the suite's own, three agents on the fake runtime. While tenants create, stop, start, resize and delete
 * through both servers, the schedule the seed draws kills a worker mid-job, kills an agent, restarts the server
 * a subscriber is connected to, restarts Redis, and cuts every PostgreSQL connection. Then everything settles,
 * and nothing may have leaked: no allocation, lease or quota charge without its instance, every instance in its
 * desired state, every event exactly once per version, and the subscriber that rode through it all (resuming
 * from its cursor) saw each instance's events once each, in order.
 *
 * One fixed seed runs in `npm test`; FAULT_SEEDS=3,4,5 runs others. A failing run names its seed.
 */

const EXPECTED = new Set(["PRECONDITION_FAILED", "UNSCHEDULABLE", "INVALID_INPUT"]);
const SEEDS = (process.env.FAULT_SEEDS ?? "11").split(",").map(Number);
type Fault = "worker" | "agent" | "server" | "redis" | "postgres";
const FAULTS: Fault[] = ["worker", "agent", "server", "redis", "postgres"];

/** A redis-server of the suite's own, persisting every write (appendfsync always), so a restart loses no job. */
async function ownRedis() {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "bc-faults-redis-"));
  let child: ChildProcess | null = null;
  const url = `redis://127.0.0.1:${port}`;
  const start = async () => {
    child = spawn(
      "redis-server",
      ["--port", String(port), "--bind", "127.0.0.1", "--dir", dir, "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
      {
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let out = "";
    child.stdout?.on("data", (d) => (out += d));
    await until("redis to accept connections", () => /Ready to accept connections/.test(out), 20_000, 20);
  };
  const stop = async () => {
    const c = child;
    if (!c || c.exitCode !== null) return;
    c.kill("SIGTERM");
    await until("redis to exit", () => c.exitCode !== null || c.signalCode !== null, 20_000, 20);
  };
  await start();
  return {
    url,
    restart: async () => {
      await stop();
      await start();
    },
    close: async () => {
      await stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

let cluster: Cluster | undefined;
let redis: Awaited<ReturnType<typeof ownRedis>> | undefined;
afterEach(async () => {
  await cluster?.close();
  await redis?.close();
  cluster = undefined;
  redis = undefined;
});

async function run(seed: number) {
  const rand = prng(seed);
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(rand() * xs.length)] as T;
  redis = await ownRedis();
  const c = await startCluster({ hosts: 3, redisUrl: redis.url, ...(process.env.FAULT_LOG ? { env: { LOG_LEVEL: "info" } } : {}) });
  cluster = c;
  const replica = await c.addServer();
  const worker2 = await c.addWorker();
  const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name: `faults-${seed}` } });
  const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "faults" } });
  const clients: Client[] = [c.client(createApiToken.token), c.client(createApiToken.token)];
  // The second client speaks to the replica.
  clients[1] = (await import("../../sdk/client.ts")).createClient({ url: replica.url, token: createApiToken.token });

  // A subscriber on the replica, resuming from its cursor whenever its connection is cut.
  const seen = new Map<string, number[]>();
  const stop = new AbortController();
  const watching = (async () => {
    for await (const e of watchInstanceEvents({ url: replica.url, token: createApiToken.token, after: "0", signal: stop.signal })) {
      const versions = seen.get(e.instance.id) ?? [];
      versions.push(e.version);
      seen.set(e.instance.id, versions);
    }
  })();

  // Refusals a churn meets by racing itself are expected. A request that meets a process on its way down, a
  // connection being cut or Redis restarting may fail as well: the churn goes on, and what is checked is the
  // state the platform settles in. Such failures are counted, and must stay the exception.
  let failed = 0;
  let sent = 0;
  const attempt = async (p: Promise<unknown>) => {
    sent++;
    try {
      return await p;
    } catch (e) {
      const code = (e as { code?: string }).code;
      if (!code || !EXPECTED.has(code)) failed++;
      return null;
    }
  };
  const states = () =>
    c.inspect((p) => p.db.prisma.instance.findMany({ where: { tenantId: createTenant.id }, select: { id: true, state: true, desiredState: true } }));

  const faults = [...FAULTS].sort(() => rand() - 0.5);
  console.log(`faults seed ${seed}: in this order: ${faults.join(", ")}`);
  const live: string[] = [];
  let created = 0;
  for (let round = 0; round < faults.length + 2; round++) {
    for (let k = 0; k < 25; k++) {
      const t = pick(clients);
      const r = rand();
      if (r < 0.45 || live.length === 0) {
        const made = (await attempt(
          t.request(CreateInstanceDocument, {
            input: { poolId: c.poolId, flavor: pick(["tiny", "small"]), imageId: c.imageId, idempotencyKey: `f${created++}` },
          }),
        )) as { createInstance: { id: string } } | null;
        if (made) live.push(made.createInstance.id);
      } else if (r < 0.6) await attempt(t.request(StopInstanceDocument, { id: pick(live) }));
      else if (r < 0.75) await attempt(t.request(StartInstanceDocument, { id: pick(live) }));
      else if (r < 0.87) await attempt(t.request(ResizeInstanceDocument, { id: pick(live), flavor: pick(["tiny", "small"]) }));
      else {
        const id = pick(live);
        if (await attempt(t.request(DeleteInstanceDocument, { id }))) live.splice(live.indexOf(id), 1);
      }
    }
    const fault = faults[round];
    if (fault === "worker") await Promise.all([c.restartWorker("SIGKILL"), worker2.restart("SIGKILL")]);
    else if (fault === "agent") await c.restartAgent(Math.floor(rand() * 3), "SIGKILL");
    else if (fault === "server") await replica.restart("SIGKILL");
    else if (fault === "redis") await redis.restart();
    else if (fault === "postgres")
      await c.inspect((p) =>
        p.db.read((sql) => sql.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)),
      );
  }

  // Settle: every instance where it was asked to be, then every live one deleted.
  await until(
    "every instance to reach its desired state",
    async () => (await states()).every((i) => i.state === i.desiredState || i.state === "error"),
    120_000,
    200,
  ).catch(async (e) => {
    const stuck = await c.inspect((p) =>
      p.db.read((sql) =>
        sql.query(
          `SELECT i.id, i.state, i.desired_state, i.observed_state, i.observed_generation, i.spec_generation, i.version, i.node_id, i.conditions,
                  n.spec_generation AS node_generation, n.reported_generation, n.lost_at,
                  (SELECT json_agg(json_build_object('kind', kind, 'state', state, 'settled', settled_at)) FROM host_commands h WHERE h.instance_id = i.id) AS commands
             FROM instances i LEFT JOIN nodes n ON n.id = i.node_id
            WHERE i.tenant_id = $1 AND i.state <> i.desired_state AND i.state <> 'error' LIMIT 5`,
          [createTenant.id],
        ),
      ),
    );
    throw new Error(`${(e as Error).message}; unsettled: ${JSON.stringify(stuck)}`);
  });
  for (const id of live) await attempt(clients[0]?.request(DeleteInstanceDocument, { id }) as Promise<unknown>);
  await until("every instance to be deleted", async () => (await states()).every((i) => i.state === "deleted"), 120_000, 200);

  // The subscriber: every event of every instance once, in version order (it catches up after the last change).
  const expected = await c.inspect((p) =>
    p.db.prisma.instanceEvent.findMany({ where: { tenantId: createTenant.id }, select: { instanceId: true, version: true }, orderBy: { version: "asc" } }),
  );
  const want = new Map<string, number[]>();
  for (const e of expected) want.set(e.instanceId, [...(want.get(e.instanceId) ?? []), e.version]);
  await until("the subscriber to see every event", () => [...want].every(([id, v]) => (seen.get(id)?.length ?? 0) >= v.length), 60_000, 100);
  stop.abort();
  await watching.catch(() => {});
  for (const [id, versions] of want) expect({ id, seen: seen.get(id) }).toEqual({ id, seen: versions });

  await c.inspect(async (p) => {
    expect(await invariantViolations(p)).toEqual([]);
    expect(await eventViolations({ platform: p })).toEqual([]);
    const l = await ledger(p);
    expect(l.counts).toMatchObject({ allocations: 0, leases: 0, gpus_held: 0 });
    expect(l.usage).toEqual([]);
  });
  await until("hosts to remove every domain", () => c.hostDirs().every((d) => readdirSync(d).length === 0), 60_000);
  expect(failed, `${failed} of ${sent} requests failed`).toBeLessThan(sent / 10);
  console.log(
    `faults seed ${seed}: ${faults.join(", ")}; ${created} creates, ${sent} requests (${failed} failed in a fault), ` +
      `${expected.length} events seen once each by a subscriber that rode through it`,
  );
  return created;
}

describe("faults during a churn", () => {
  for (const seed of SEEDS) {
    it(`seed ${seed}: a worker, an agent, a server, Redis and PostgreSQL connections fail mid-churn, and nothing leaks`, async () => {
      try {
        expect(await run(seed)).toBeGreaterThan(0);
      } catch (e) {
        const errors = cluster?.errors().slice(0, 20).join("\n") ?? "";
        const agents = (cluster?.agents ?? [])
          .map(
            (a) =>
              `${a.name}:\n${a.out
                .split("\n")
                .filter((l) => !/"msg":"request"/.test(l))
                .slice(-25)
                .join("\n")}`,
          )
          .join("\n");
        throw new Error(
          `fault run with seed ${seed} failed (replay: FAULT_SEEDS=${seed} npx vitest run tests/faults): ${(e as Error).message}\n${errors}\n${agents}`,
        );
      }
    }, 600_000);
  }
});
