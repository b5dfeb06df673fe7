/**
 * Admission throughput against the machine's own limit.
 *
 *   npm run bench:admission -- [--clients 8] [--seconds 10] [--nodes 20]
 *
 * Prints creates per second with the same number of concurrent clients through (a) the core admission
 * transaction alone and (b) the whole API (HTTP GraphQL, auth, Redis pub/sub and BullMQ wake-up), each as a
 * ratio of pgbench's single-row INSERT rate on the same PostgreSQL. Needs PostgreSQL, Redis and pgbench.
 */
import { admitInstance } from "../core/instances/admission.ts";
import { CreateInstanceDocument, createClient } from "../sdk/client.ts";
import { startServer } from "../server/app.ts";
import { admissionDeps, hostedFixture } from "./fixture.ts";
import { benchArgs, benchPlatform, closedLoop, pgbenchInsertTps } from "./lib.ts";

const args = benchArgs({ clients: 8, seconds: 10, nodes: 20 });

async function run() {
  const c = args.clients;
  console.log(`admission bench: ${c} clients, ${args.seconds} s per phase, ${args.nodes} nodes, one /16 pool`);
  const pgbench = await pgbenchInsertTps(c, args.seconds);
  console.log(`pgbench single-row INSERT:        ${pgbench.toFixed(0)} tps`);

  const { platform, close } = await benchPlatform({ poolSize: c + 2 });
  try {
    const fx = await hostedFixture(platform, { nodes: args.nodes, tenants: c });
    const deps = admissionDeps(platform);
    const core = await closedLoop(c, args.seconds, async (i, n) => {
      const t = fx.tenants[i] as (typeof fx.tenants)[number];
      await platform.write({ actor: t.apiToken.identityId, action: "createInstance" }, (w) =>
        admitInstance(
          w,
          deps,
          { identityId: t.apiToken.identityId, tenantId: t.tenant.id },
          { poolId: fx.poolId, flavor: "small", imageId: fx.imageId, idempotencyKey: `core-${n}` },
        ),
      );
    });
    console.log(
      `admission, core transaction:      ${core.perSecond.toFixed(0)} creates/s  ratio ${(core.perSecond / pgbench).toFixed(3)}  p50 ${core.p50.toFixed(1)} ms  p99 ${core.p99.toFixed(1)} ms  errors ${core.errors}`,
    );

    const app = await startServer(platform, { port: 0, host: "127.0.0.1" });
    const clients = fx.tenants.map((t) => createClient({ url: app.url, token: t.token }));
    const api = await closedLoop(c, args.seconds, async (i, n) => {
      await (clients[i] as (typeof clients)[number]).request(CreateInstanceDocument, {
        input: { poolId: fx.poolId, flavor: "small", imageId: fx.imageId, idempotencyKey: `api-${n}` },
      });
    });
    console.log(
      `admission, whole API (HTTP+Redis): ${api.perSecond.toFixed(0)} creates/s  ratio ${(api.perSecond / pgbench).toFixed(3)}  p50 ${api.p50.toFixed(1)} ms  p99 ${api.p99.toFixed(1)} ms  errors ${api.errors}`,
    );
    console.log(
      `goal: ratio >= 0.25 — core ${core.perSecond / pgbench >= 0.25 ? "met" : "NOT met"}, API ${api.perSecond / pgbench >= 0.25 ? "met" : "NOT met"}`,
    );
    await app.close();
  } finally {
    await close();
  }
}

run().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
