import { resolve } from "node:path";
import { startAgent } from "../agent/index.ts";
import { fakeRuntime } from "../agent/runtimes/registry.ts";
import { loadConfig } from "../infra/config.ts";
import { openPlatform } from "../infra/platform.ts";
import { startHetznerEmulator } from "../providers/hetzner-cloud/emulator.ts";
import { builtinProviders } from "../providers/index.ts";
import { startServer } from "../server/app.ts";
import { startWorker } from "../worker/index.ts";
import { seedProviderPool, seedQuickStart } from "./seed.ts";

/** `bc dev` and `bc server`: the API (and for dev, the worker and simulated hosts) in this process. */
export async function serve(opts: { embedded: boolean; worker: boolean; sim: number }) {
  const loaded = await loadConfig();
  // The quick start's provider pool needs its plugin: dev lists the built-in providers unless the config names some.
  const quickStart = opts.embedded && opts.sim > 0;
  const listed = quickStart && !loaded.vps.providers.length ? { ...loaded, vps: { ...loaded.vps, providers: [...builtinProviders] } } : loaded;
  const emulated = quickStart && listed.vps.providers.some((p) => p.id === "hetzner-cloud");
  // The quick start's Hetzner Cloud emulator answers plain http on loopback, which provider endpoints may
  // reach only where the config allows: dev allows it for its own emulator, and nothing wider.
  const { endpoints } = listed.providers;
  const config = emulated
    ? { ...listed, providers: { ...listed.providers, endpoints: { allowHttp: true, allow: [...endpoints.allow, "127.0.0.1/32"] } } }
    : listed;
  const platform = await openPlatform(config, { embedded: opts.embedded });
  const app = await startServer(platform);
  const worker = opts.worker ? await startWorker(platform) : null;
  const agents: Awaited<ReturnType<typeof startAgent>>[] = [];
  const mode = config.databaseUrl ? "PostgreSQL" : `PGlite in ${config.dataDir}`;
  const bus = config.redisUrl ? "Redis" : "in-memory pub/sub and jobs";
  const lines = [
    `Better Compute is up (${mode}; ${bus})`,
    `  Dashboard: ${app.url.replace(/\/graphql$/, "/")}  (sign in with a token below)`,
    `  GraphQL:  ${app.url}  (GraphiQL in a browser)`,
  ];
  if (opts.embedded && platform.operatorToken) lines.push(`  Operator: ${platform.operatorToken}`);
  let emulator: Awaited<ReturnType<typeof startHetznerEmulator>> | null = null;
  if (opts.sim > 0) {
    const seed = await seedQuickStart(platform, opts.sim);
    for (let i = 1; i <= opts.sim; i++) {
      const stateDir = resolve(config.dataDir, "sim", `host-${i}`);
      const runtime = await fakeRuntime({ stateDir });
      agents.push(
        await startAgent({
          server: app.url,
          joinToken: seed.joinTokens[i - 1],
          name: `sim-${i}`,
          stateDir,
          runtime,
          log: (m, f) => platform.log.debug(`agent sim-${i}: ${m}`, f),
        }),
      );
    }
    lines.push(
      `  Tenant:   ${seed.tenantToken}  (tenant "demo")`,
      `  ${opts.sim} simulated hosts in pool "local" (${seed.poolId}); flavors small, medium, large; image ${seed.imageId}`,
      "  Try:",
      `    curl -s ${app.url} -H "authorization: Bearer ${seed.tenantToken}" -H 'content-type: application/json' \\`,
      `      -d '{"query":"mutation { createInstance(input: {poolId: \\"${seed.poolId}\\", flavor: \\"small\\", imageId: \\"${seed.imageId}\\"}) { id state } }"}'`,
    );
    if (emulated) {
      // Actions take a few seconds, as on the real cloud, so a newcomer can watch the states go by.
      emulator = await startHetznerEmulator({ actionMs: 2000 });
      const cloud = await seedProviderPool(platform, emulator);
      lines.push(
        `  Provider pool "cloud" (${cloud.poolId}) on a Hetzner Cloud emulator at ${emulator.url}; flavor small, image ${cloud.image}`,
        `    same createInstance with poolId \\"${cloud.poolId}\\" and imageId \\"${cloud.image}\\"`,
      );
    }
  }
  process.stdout.write(`${lines.join("\n")}\n`);
  const stop = async () => {
    for (const a of agents) await a.close();
    await worker?.close();
    await emulator?.close();
    await app.close();
    await platform.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}
