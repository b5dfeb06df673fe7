/**
 * Create → running on a provider, through the platform, against the provider's own minimum.
 *
 *   npm run bench:provider -- [--instances 20] [--action-ms 2000] [--pg 0]
 *
 * The Hetzner Cloud emulator takes `action-ms` per action (a create is two: build, then boot). The floor is what
 * the plugin's client alone needs: create, then `get` every 10 ms until running. The platform's figure is from
 * `createInstance` to the instance reading RUNNING through the API (read every 25 ms; the bench lifts the API rate limit), with the product's default polling
 * (first look after 1 s, then a third of the time waited, up to 30 s) — `instances` at once, on the embedded database or, with --pg 1,
 * PostgreSQL and Redis. Printed as p50 and max, and their ratios to the floor (goal: p50 within 1.5x).
 */
import { randomBytes } from "node:crypto";
import { startHetznerEmulator } from "../providers/hetzner-cloud/emulator.ts";
import { hetznerCloud } from "../providers/hetzner-cloud/index.ts";
import * as bc from "../sdk/client.ts";
import { startServer } from "../server/app.ts";
import { startWorker } from "../worker/index.ts";
import { benchArgs, benchPlatform, exitWhenDone, percentile } from "./lib.ts";

const args = benchArgs({ instances: 20, "action-ms": 2000, pg: 0 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const summary = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return { p50: percentile(s, 50), max: s[s.length - 1] as number };
};

async function floor(emu: Awaited<ReturnType<typeof startHetznerEmulator>>): Promise<number[]> {
  const session = hetznerCloud.connect(emu.config, { managedBy: "bench-floor", credential: async () => emu.credentials.token as string });
  return Promise.all(
    Array.from({ length: args.instances }, async (_, i) => {
      const t0 = performance.now();
      const id = `inst_${randomBytes(26)
        .toString("hex")
        .slice(0, 52)
        .replace(/[^a-z2-7]/g, "a")}`;
      const m = await session.create({
        instanceId: id,
        name: `floor-${i}`,
        offer: "cx22",
        image: emu.images[0] as string,
        sshKeys: [],
        userData: null,
        start: true,
      });
      while ((await session.get(m.externalId))?.status !== "running") await sleep(10);
      return performance.now() - t0;
    }),
  );
}

async function run() {
  const emu = await startHetznerEmulator({ actionMs: args["action-ms"] });
  const where = args.pg ? "PostgreSQL + Redis" : "embedded (PGlite, in-memory bus and jobs)";
  console.log(`provider bench: ${where}; Hetzner Cloud emulator, ${args["action-ms"]} ms per action; ${args.instances} instances at once`);
  const direct = summary(await floor(emu));
  console.log(`floor (the client alone):      p50 ${direct.p50.toFixed(0)} ms, max ${direct.max.toFixed(0)} ms`);

  const { platform, operatorToken, close } = await benchPlatform({
    poolSize: 10,
    embedded: !args.pg,
    // The emulator answers plain http on loopback: allowed here, as a deployment would allow its own network.
    env: { PROVIDERS: "hetzner-cloud", LIMIT_RATE_POINTS: "0", PROVIDER_ENDPOINT_HTTP: "true", PROVIDER_ENDPOINT_ALLOW: "127.0.0.1/32" },
  });
  const app = await startServer(platform, { port: 0, host: "127.0.0.1" });
  const worker = await startWorker(platform);
  try {
    const op = bc.createClient({ url: app.url, token: operatorToken });
    const { createProviderAccount: acct } = await op.request(bc.CreateProviderAccountDocument, {
      input: { name: "bench", provider: "hetzner-cloud", config: emu.config, credentials: { token: { value: emu.credentials.token } } },
    });
    const { createPool: pool } = await op.request(bc.CreatePoolDocument, { input: { name: "cloud", class: "PROVIDER", providerAccountId: acct.id } });
    await op.request(bc.CreateFlavorDocument, { input: { poolId: pool.id, name: "small", vcpus: 2, memoryMib: 4096, diskGib: 40 } });
    while (!(await op.request(bc.ProviderOffersDocument, { poolId: pool.id })).providerOffers.length) await sleep(20);
    const { createTenant } = await op.request(bc.CreateTenantDocument, { input: { name: "bench" } });
    const { createApiToken } = await op.request(bc.CreateApiTokenDocument, { input: { tenantId: createTenant.id, name: "bench" } });
    const t = bc.createClient({ url: app.url, token: createApiToken.token });
    const through = summary(
      await Promise.all(
        Array.from({ length: args.instances }, async () => {
          const t0 = performance.now();
          const { createInstance } = await t.request(bc.CreateInstanceDocument, {
            input: { poolId: pool.id, flavor: "small", imageId: emu.images[0] as string },
          });
          while ((await t.request(bc.InstanceDocument, { id: createInstance.id })).instance?.state !== "RUNNING") await sleep(25);
          return performance.now() - t0;
        }),
      ),
    );
    console.log(`through the platform:          p50 ${through.p50.toFixed(0)} ms, max ${through.max.toFixed(0)} ms`);
    console.log(
      `ratio to the floor:            p50 ${(through.p50 / direct.p50).toFixed(2)}x, max ${(through.max / direct.max).toFixed(2)}x (goal: p50 <= 1.5x)`,
    );
    console.log(`provider requests served:      ${emu.requests()} (rate-limited: ${emu.rateLimited()})`);
  } finally {
    await worker.close();
    await app.close();
    await close();
    await emu.close();
  }
}

exitWhenDone(run());
