import { hostname } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { startAgent } from "../agent/index.ts";
import { fakeRuntime, type RuntimeOptions, runtimes } from "../agent/runtimes/registry.ts";
import { AppError, isAppError } from "../contracts/errors.ts";
import { openDatabase } from "../infra/db/index.ts";
import { migrate } from "../infra/db/migrate.ts";
import { logger } from "../infra/log.ts";
import { openPlatform } from "../infra/platform.ts";
import { startServer } from "../server/app.ts";
import { startWorker } from "../worker/index.ts";
import { loadConfig } from "./config-file.ts";
import { seedQuickStart } from "./seed.ts";

const usage = `bc — the Better Compute control plane

  bc dev [--sim N]       the whole platform in one process: server, worker and N simulated hosts; embedded
                         (PGlite under .data/, in-memory pub/sub and jobs) unless DATABASE_URL / REDIS_URL
  bc server              the GraphQL API (HTTP + websocket) and host gateway on PORT; needs SEAL_KEY
  bc worker              the reconcilers and periodic jobs (BullMQ on REDIS_URL)
  bc agent --server URL [--join-token T] [--runtime fake] [--name N] [--state-dir D] [--heartbeat-ms MS]
           [--vcpus N --memory-mib N --disk-gib N] [--delay-ms MS]   (a simulated host: what it offers, how slow)
           [--runtime libvirt-kvm [--domain-type auto|kvm|qemu] [--kernel F --initrd F --cmdline S]
            [--shutdown-timeout-ms MS] [--gpu model=0000:65:00.0 ...] [--libvirt-uri URI]]
                         a host agent: joins once (the credential is kept in the state dir), then converges
  bc migrate             apply the committed migrations to DATABASE_URL (or the embedded database)
  bc migrate --create N  write prisma/migrations/<ts>_N from the schema's changes (development)
  bc migrate --check     exit 1 when prisma/schema.prisma has changes no migration holds
  bc schema              print the GraphQL schema (what schema.graphql holds)

Configuration: environment (PORT, HOST, DATABASE_URL, REDIS_URL, REDIS_PREFIX, OPERATOR_TOKEN, SEAL_KEY,
BC_DATA_DIR, VPS_RUNTIMES, PROVIDERS, VPS_HOST_NETWORK, LOG_LEVEL) over an optional compute.config.ts.
`;

async function main(argv: string[]) {
  const [command, ...rest] = argv;
  switch (command) {
    case "dev": {
      const { values } = parseArgs({ args: rest, options: { sim: { type: "string", default: "0" } } });
      return serve({ embedded: true, worker: true, sim: Number(values.sim) });
    }
    case "server":
      return serve({ embedded: false, worker: false, sim: 0 });
    case "worker":
      return workerCommand();
    case "agent":
      return agentCommand(rest);
    case "migrate":
      return migrateCommand(rest);
    case "schema": {
      const { printedSchema } = await import("../server/schema/index.ts");
      process.stdout.write(printedSchema());
      return;
    }
    case undefined:
    case "help":
    case "--help":
      process.stdout.write(usage);
      return;
    default:
      process.stderr.write(`unknown command ${command}\n\n${usage}`);
      process.exitCode = 2;
  }
}

async function serve(opts: { embedded: boolean; worker: boolean; sim: number }) {
  const config = await loadConfig();
  const platform = await openPlatform(config, { embedded: opts.embedded });
  const app = await startServer(platform);
  const worker = opts.worker ? await startWorker(platform) : null;
  const agents: Awaited<ReturnType<typeof startAgent>>[] = [];
  const mode = config.databaseUrl ? "PostgreSQL" : `PGlite in ${config.dataDir}`;
  const bus = config.redisUrl ? "Redis" : "in-memory pub/sub and jobs";
  const lines = [`Better Compute is up (${mode}; ${bus})`, `  GraphQL:  ${app.url}  (GraphiQL in a browser)`];
  if (opts.embedded && platform.operatorToken) lines.push(`  Operator: ${platform.operatorToken}`);
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
  }
  process.stdout.write(`${lines.join("\n")}\n`);
  const stop = async () => {
    for (const a of agents) await a.close();
    await worker?.close();
    await app.close();
    await platform.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}

async function workerCommand() {
  const config = await loadConfig();
  const platform = await openPlatform(config);
  const worker = await startWorker(platform);
  process.stdout.write(`worker running (${config.redisUrl ? "BullMQ on Redis" : "in-memory jobs"})\n`);
  const stop = async () => {
    await worker.close();
    await platform.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}

async function agentCommand(args: string[]) {
  const { values } = parseArgs({
    args,
    options: {
      server: { type: "string" },
      "join-token": { type: "string" },
      runtime: { type: "string", default: "fake" },
      name: {
        type: "string",
        default: hostname()
          .toLowerCase()
          .replace(/[^a-z0-9.-]/g, "-"),
      },
      "state-dir": { type: "string" },
      "heartbeat-ms": { type: "string", default: "5000" },
      // What a simulated host offers (the fake runtime); real runtimes read it from the host.
      vcpus: { type: "string", default: "16" },
      "memory-mib": { type: "string", default: "65536" },
      "disk-gib": { type: "string", default: "1000" },
      "delay-ms": { type: "string", default: "0" },
      // libvirt-kvm: the domain type (auto: kvm only with hardware virtualisation), direct kernel boot for
      // root-filesystem images, the shutdown bound, and the GPUs offered (model=0000:65:00.0, repeatable).
      "libvirt-uri": { type: "string" },
      "domain-type": { type: "string" },
      kernel: { type: "string" },
      initrd: { type: "string" },
      cmdline: { type: "string", default: "console=ttyS0 root=/dev/vda rw" },
      "shutdown-timeout-ms": { type: "string" },
      gpu: { type: "string", multiple: true },
    },
  });
  if (!values.server) throw new AppError("INVALID_CONFIG", "bc agent needs --server URL");
  const make = runtimes[values.runtime as string];
  if (!make) throw new AppError("INVALID_CONFIG", `unknown runtime ${values.runtime}; known: ${Object.keys(runtimes).join(", ")}`);
  const stateDir = resolve(values["state-dir"] ?? join(".data", "agent", values.name as string));
  const log = logger((process.env.LOG_LEVEL as "info") ?? "info", { agent: values.name });
  const agent = await startAgent({
    server: values.server,
    joinToken: values["join-token"],
    name: values.name as string,
    stateDir,
    runtime: await make({
      stateDir,
      capacity: { vcpus: Number(values.vcpus), memoryMib: Number(values["memory-mib"]), diskGib: Number(values["disk-gib"]), gpus: [] },
      delayMs: Number(values["delay-ms"]),
      libvirt: libvirtOptions(values),
    }),
    heartbeatMs: Number(values["heartbeat-ms"]),
    log: (m, f) => log.info(m, f),
  });
  process.stdout.write(`agent ${values.name} running as node ${agent.nodeId} (runtime ${values.runtime})\n`);
  void agent.ended.then(async (why) => {
    log.error("agent stopped", { why });
    await agent.close();
    process.exit(1);
  });
  const stop = async () => {
    await agent.close();
    process.exit(0);
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}

function libvirtOptions(v: Record<string, string | boolean | string[] | undefined>): RuntimeOptions["libvirt"] {
  const domainType = (v["domain-type"] as string | undefined) ?? process.env.LIBVIRT_DOMAIN_TYPE ?? "auto";
  if (!["auto", "kvm", "qemu"].includes(domainType)) throw new AppError("INVALID_CONFIG", `--domain-type must be auto, kvm or qemu, not ${domainType}`);
  const gpus = ((v.gpu as string[] | undefined) ?? []).map((g) => {
    const m = /^([^=]+)=([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$/.exec(g);
    if (!m) throw new AppError("INVALID_CONFIG", `--gpu ${g}: expected model=0000:65:00.0`);
    return { model: m[1] as string, pciAddress: m[2] as string };
  });
  return {
    uri: (v["libvirt-uri"] as string | undefined) ?? process.env.LIBVIRT_URI,
    domainType: domainType as "auto",
    boot: v.kernel
      ? { kernel: resolve(v.kernel as string), initrd: v.initrd ? resolve(v.initrd as string) : undefined, cmdline: v.cmdline as string }
      : undefined,
    shutdownTimeoutMs: v["shutdown-timeout-ms"] ? Number(v["shutdown-timeout-ms"]) : undefined,
    gpus,
  };
}

async function migrateCommand(args: string[]) {
  const { values } = parseArgs({ args, options: { create: { type: "string" }, check: { type: "boolean" } } });
  if (values.create || values.check) {
    const { createMigration, diffSql } = await import("../infra/db/migration-tool.ts");
    const paths = { schemaPath: "prisma/schema.prisma", migrationsDir: "prisma/migrations" };
    if (values.create) {
      const made = await createMigration({ ...paths, name: values.create });
      process.stdout.write(made ? `created prisma/migrations/${made}\n` : "no changes\n");
    } else {
      const pending = (await diffSql(paths)).trim();
      if (pending && !/^(--[^\n]*\n?)*$/.test(pending)) {
        process.stdout.write(`prisma/schema.prisma has changes no migration holds:\n${pending}\n`);
        process.exitCode = 1;
      } else process.stdout.write("migrations match the schema\n");
    }
    return;
  }
  const config = await loadConfig();
  const db = await openDatabase({ databaseUrl: config.databaseUrl, dataDir: config.dataDir });
  try {
    const applied = await db.session((sql) => migrate(sql));
    process.stdout.write(applied.length ? `applied ${applied.join(", ")}\n` : "database is up to date\n");
  } finally {
    await db.close();
  }
}

main(process.argv.slice(2)).catch((e) => {
  if (isAppError(e)) process.stderr.write(`${e.code}: ${e.message}\n`);
  else process.stderr.write(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exit(1);
});
