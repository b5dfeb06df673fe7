import { readdirSync } from "node:fs";
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
} from "../../sdk/client.ts";
import { prng, until } from "../support/fixtures.ts";
import { expectNothingHeld } from "../support/hosts.ts";
import { ledger } from "../support/ledger.ts";
import { type Cluster, startCluster } from "./processes.ts";

/** Refusals a churn meets by racing its own requests (or asking to shrink a disk); anything else fails the run. */
const EXPECTED = new Set(["PRECONDITION_FAILED", "UNSCHEDULABLE", "INVALID_INPUT"]);

let cluster: Cluster | undefined;
afterEach(async (ctx) => {
  if (ctx.task.result?.state === "fail" && cluster) console.error(`process errors:\n${cluster.errors().slice(0, 20).join("\n")}`);
  await cluster?.close();
  cluster = undefined;
});

async function churn(c: Cluster, opts: { seed: number; instances: number; faults: boolean }) {
  const rand = prng(opts.seed);
  const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)] as T;
  const { createTenant } = await c.operator.request(CreateTenantDocument, { input: { name: `churn-${opts.seed}` } });
  const { createApiToken } = await c.operator.request(CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "churn" } });
  const t: Client = c.client(createApiToken.token);
  const refused = async (p: Promise<unknown>) => {
    try {
      await p;
    } catch (e) {
      if (!EXPECTED.has((e as { code: string }).code)) throw e;
    }
  };
  const states = async () =>
    c.inspect((p) => p.db.prisma.instance.findMany({ where: { tenantId: createTenant.id }, select: { id: true, state: true, desiredState: true } }));
  const settle = (what: string) =>
    until(what, async () => (await states()).every((i) => i.state === i.desiredState || i.state === "error"), 90_000, 100).catch(async (e) => {
      const stuck = await c.inspect((p) =>
        p.db.prisma.instance.findMany({
          where: { tenantId: createTenant.id, NOT: { state: { in: ["deleted", "error"] } } },
          select: {
            id: true,
            state: true,
            desiredState: true,
            observedState: true,
            observedGeneration: true,
            specGeneration: true,
            nodeId: true,
            conditions: true,
            version: true,
          },
        }),
      );
      const nodes = await c.inspect((p) =>
        p.db.prisma.node.findMany({ select: { id: true, specGeneration: true, reportedGeneration: true, lostAt: true, lastReportAt: true } }),
      );
      throw new Error(
        `${(e as Error).message}; unsettled: ${JSON.stringify(stuck.filter((i) => i.state !== i.desiredState).slice(0, 5))} nodes: ${JSON.stringify(nodes)}`,
      );
    });

  const live: string[] = [];
  const tStart = Date.now();
  let created = 0;
  for (let round = 0; created < opts.instances || round < 12; round++) {
    // A round: a burst of random requests, racing the reconciler, then let the hosts catch up.
    for (let k = 0; k < 40; k++) {
      const r = rand();
      if ((r < 0.45 || live.length === 0) && created < opts.instances) {
        const id = (
          await t.request(CreateInstanceDocument, {
            input: {
              poolId: c.poolId,
              flavor: pick(["tiny", "small"]),
              imageId: c.imageId,
              idempotencyKey: `c${created++}`,
              desiredState: rand() < 0.2 ? "STOPPED" : "RUNNING",
            },
          })
        ).createInstance.id;
        live.push(id);
      } else if (live.length === 0) {
        break;
      } else if (r < 0.6) await refused(t.request(StopInstanceDocument, { id: pick(live) }));
      else if (r < 0.75) await refused(t.request(StartInstanceDocument, { id: pick(live) }));
      else if (r < 0.87) await refused(t.request(ResizeInstanceDocument, { id: pick(live), flavor: pick(["tiny", "small"]) }));
      else {
        const id = pick(live);
        await t.request(DeleteInstanceDocument, { id });
        live.splice(live.indexOf(id), 1);
      }
    }
    if (opts.faults && round === 3) {
      // Mid-churn, with work in flight: a worker and a host die without warning and come back.
      await Promise.all([c.restartWorker("SIGKILL"), c.restartAgent(1, "SIGKILL")]);
    }
    const t0 = Date.now();
    await settle(`round ${round} to settle`);
    if (process.env.CHURN_TIMING) console.log(`TIMING round ${round}: settled in ${Date.now() - t0} ms, ${live.length} live`);
  }
  const t1 = Date.now();
  for (const id of live) await t.request(DeleteInstanceDocument, { id });
  const t2 = Date.now();
  await until("every instance to be deleted", async () => (await states()).every((i) => i.state === "deleted"), 90_000, 100);
  if (process.env.CHURN_TIMING) console.log(`TIMING delete requests ${t2 - t1} ms, deleted after ${Date.now() - t2} ms`);
  if (process.env.CHURN_TIMING) console.log(`TIMING churn total ${Date.now() - tStart} ms`);
  return { tenantId: createTenant.id, created };
}

describe("churn acceptance", () => {
  for (const faults of process.env.CHURN_ONLY === "plain" ? [false] : [false, true]) {
    it(`churns 200 instances on 3 simulated hosts${faults ? ", killing and restarting a worker and an agent midway," : ""} and leaks nothing`, async () => {
      cluster = await startCluster({ hosts: 3 });
      const { created } = await churn(cluster, { seed: faults ? 7 : 42, instances: 200, faults });
      expect(created).toBe(200);
      await cluster.inspect(async (p) => {
        await expectNothingHeld(p);
        const l = await ledger(p);
        expect(l.nodes.every((n: { v: number; m: number; d: number; n: number }) => n.v === 0 && n.m === 0 && n.d === 0 && n.n === 0)).toBe(true);
        expect(await p.db.prisma.instance.count({ where: { state: { not: "deleted" } } })).toBe(0);
      });
      // No domain is left on any host.
      await until("hosts to remove every domain", () => cluster?.hostDirs().every((d) => readdirSync(d).length === 0) ?? false, 30_000);
    }, 300_000);
  }
});
