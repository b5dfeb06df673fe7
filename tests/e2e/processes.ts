import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Redis } from "ioredis";
import { type Database, openDatabase } from "../../infra/db/index.ts";
import {
  type Client,
  CreateFlavorDocument,
  CreateJoinTokenDocument,
  CreatePoolDocument,
  createClient,
  NodesDocument,
  RegisterImageDocument,
} from "../../sdk/client.ts";
import { sha256Of, until } from "../support/fixtures.ts";
import { redisUrl } from "../support/harness.ts";
import { hostEnv } from "../support/hosts.ts";
import { cloneDatabase } from "../support/pg.ts";

/** A TCP port nobody listens on right now (for a process that must keep its port across restarts). */
export async function freePort(): Promise<number> {
  const { createServer } = await import("node:net");
  return new Promise((resolve, reject) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

/** A `bc` process, with what it printed kept for the failure message. */
class Proc {
  out = "";
  child: ChildProcess;
  constructor(
    readonly name: string,
    args: string[],
    env: NodeJS.ProcessEnv,
  ) {
    this.child = spawn(process.execPath, ["bin/bc.mjs", ...args], { env, stdio: ["ignore", "pipe", "pipe"] });
    this.child.stdout?.on("data", (d) => (this.out += d));
    this.child.stderr?.on("data", (d) => (this.out += d));
  }
  get exited() {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }
  async waitFor(pattern: RegExp, timeoutMs = 60_000): Promise<RegExpExecArray> {
    await until(`${this.name} to print ${pattern}`, () => pattern.test(this.out) || this.exited, timeoutMs);
    const m = pattern.exec(this.out);
    if (!m) throw new Error(`${this.name} exited before ${pattern}:\n${this.out.slice(-3000)}`);
    return m;
  }
  async stop(signal: NodeJS.Signals = "SIGTERM") {
    if (this.exited) return;
    this.child.kill(signal);
    await until(`${this.name} to exit`, () => this.exited, 20_000);
  }
}

/**
 * The platform as separate processes, as it is deployed: `bc server`, `bc worker` and `bc agent`s (fake runtime)
 * on PostgreSQL and Redis. Agents keep their node credential in their state dir, so a killed one restarts as
 * the same node.
 */
export async function startCluster(opts: {
  hosts: number;
  capacity?: { vcpus: number; memoryMib: number; diskGib: number };
  /** The agents' runtime (default fake) and extra flags for it; extra environment for every process. */
  runtime?: string;
  agentArgs?: string[];
  env?: Record<string, string>;
  /** A Redis of the test's own (one it may restart); the shared test Redis otherwise. */
  redisUrl?: string;
}) {
  const redis = opts.redisUrl ?? redisUrl;
  const db = await cloneDatabase();
  const prefix = `bce_${randomBytes(5).toString("hex")}`;
  const operatorToken = `op_${randomBytes(20).toString("hex")}`;
  const root = mkdtempSync(join(tmpdir(), "bc-e2e-"));
  // A real hypervisor's QEMU runs as its own user and must reach the agents' disks below this directory.
  chmodSync(root, 0o755);
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    ...hostEnv,
    DATABASE_URL: db.url,
    REDIS_URL: redis,
    REDIS_PREFIX: prefix,
    OPERATOR_TOKEN: operatorToken,
    SEAL_KEY: randomBytes(32).toString("base64"),
    LOG_LEVEL: "warn",
    // As in the in-process harness: tests drive the API from one credential as fast as the machine goes (a churn
    // sends well over the default 60 requests/s now), and the rate limit has tests of its own.
    LIMIT_RATE_POINTS: "1000000",
    // A fixed port, so agents find a restarted server where they left it.
    PORT: String(await freePort()),
    HOST: "127.0.0.1",
    ...opts.env,
  };
  const server = new Proc("server", ["server"], env);
  const url = (await server.waitFor(/GraphQL:\s+(\S+)/))[1] as string;
  const operator = createClient({ url, token: operatorToken });
  const { createPool } = await operator.request(CreatePoolDocument, { input: { name: "e2e", class: "VPS_HOST", ipv4Range: "10.90.0.0/22" } });
  for (const f of [
    { name: "tiny", vcpus: 1, memoryMib: 256, diskGib: 2 },
    { name: "small", vcpus: 2, memoryMib: 512, diskGib: 4 },
  ])
    await operator.request(CreateFlavorDocument, { input: { poolId: createPool.id, ...f } });
  const { registerImage } = await operator.request(RegisterImageDocument, {
    input: { name: "debian", source: "https://images.invalid/debian.qcow2", sha256: sha256Of("e"), format: "QCOW2", public: true },
  });
  const cap = opts.capacity ?? { vcpus: 128, memoryMib: 65536, diskGib: 2000 };
  let inspector: Promise<Database> | undefined;
  const agentArgs = (i: number, joinToken?: string) => [
    "agent",
    "--server",
    url,
    "--runtime",
    opts.runtime ?? "fake",
    "--name",
    `host-${i + 1}`,
    "--state-dir",
    join(root, `host-${i + 1}`),
    "--heartbeat-ms",
    "300",
    "--vcpus",
    String(cap.vcpus),
    "--memory-mib",
    String(cap.memoryMib),
    "--disk-gib",
    String(cap.diskGib),
    ...(opts.agentArgs ?? []),
    ...(joinToken ? ["--join-token", joinToken] : []),
  ];
  const cluster = {
    url,
    operatorToken,
    /** Where the agents keep their state (host-<i>/). */
    root,
    operator,
    poolId: createPool.id,
    imageId: registerImage.id,
    dbUrl: db.url,
    server,
    worker: new Proc("worker", ["worker"], env),
    /** More `bc worker` processes (see `addWorker`). */
    workers: [] as Proc[],
    agents: [] as Proc[],
    /** More `bc server` processes on the same database and Redis (see `addServer`). */
    replicas: [] as Proc[],
    client: (token?: string): Client => createClient({ url, token }),
    /** The error lines every process printed, for a failing test's message. */
    errors: () =>
      [cluster.server, ...cluster.replicas, cluster.worker, ...cluster.workers, ...cluster.agents].flatMap((p) =>
        p.out
          .split("\n")
          .filter((l) => /"level":"error"|Error/.test(l))
          .map((l) => `${p.name}: ${l}`),
      ),
    /** The fake runtimes' domain folders, one per host. */
    hostDirs: () => Array.from({ length: opts.hosts }, (_, i) => join(root, `host-${i + 1}`, "fake-host", "domains")),
    /** Another server replica on a port of its own, which a test can restart. */
    async addServer(): Promise<{ url: string; restart: (signal?: NodeJS.Signals) => Promise<void> }> {
      const replicaEnv = { ...env, PORT: String(await freePort()) };
      const i = cluster.replicas.length;
      cluster.replicas.push(new Proc(`server ${i + 2}`, ["server"], replicaEnv));
      const replicaUrl = (await (cluster.replicas[i] as Proc).waitFor(/GraphQL:\s+(\S+)/))[1] as string;
      return {
        url: replicaUrl,
        async restart(signal: NodeJS.Signals = "SIGTERM") {
          await cluster.replicas[i]?.stop(signal);
          cluster.replicas[i] = new Proc(`server ${i + 2}`, ["server"], replicaEnv);
          await (cluster.replicas[i] as Proc).waitFor(/GraphQL:\s+(\S+)/);
        },
      };
    },
    /** Another worker on the same database and Redis, which a test can restart. */
    async addWorker(): Promise<{ restart: (signal?: NodeJS.Signals) => Promise<void> }> {
      const i = cluster.workers.length;
      cluster.workers.push(new Proc(`worker ${i + 2}`, ["worker"], env));
      await (cluster.workers[i] as Proc).waitFor(/worker running/);
      return {
        async restart(signal: NodeJS.Signals = "SIGKILL") {
          await cluster.workers[i]?.stop(signal);
          cluster.workers[i] = new Proc(`worker ${i + 2}`, ["worker"], env);
          await (cluster.workers[i] as Proc).waitFor(/worker running/);
        },
      };
    },
    async restartServer(signal: NodeJS.Signals = "SIGTERM") {
      await cluster.server.stop(signal);
      cluster.server = new Proc("server", ["server"], env);
      await cluster.server.waitFor(/GraphQL:\s+(\S+)/);
    },
    /** A database handle for checking the rows (the ledger and event checks of tests/support). */
    async inspect<T>(fn: (platform: { db: Database }) => Promise<T>): Promise<T> {
      inspector ??= openDatabase({ databaseUrl: db.url, poolSize: 2, prisma: true });
      return fn({ db: await inspector });
    },
    async restartWorker(signal: NodeJS.Signals = "SIGKILL") {
      await cluster.worker.stop(signal);
      cluster.worker = new Proc("worker", ["worker"], env);
      await cluster.worker.waitFor(/worker running/);
    },
    async restartAgent(i: number, signal: NodeJS.Signals = "SIGKILL") {
      await cluster.agents[i]?.stop(signal);
      cluster.agents[i] = new Proc(`agent ${i + 1}`, agentArgs(i), env);
      await cluster.agents[i].waitFor(/agent host-\d+ running/);
    },
    async close() {
      for (const p of [...cluster.agents, cluster.worker, ...cluster.workers, ...cluster.replicas, cluster.server])
        await p.stop().catch(() => p.child.kill("SIGKILL"));
      await (await inspector)?.close();
      await db.drop();
      const r = new Redis(redis);
      const keys = await r.keys(`${prefix}:*`);
      if (keys.length) await r.del(...keys);
      r.disconnect();
      rmSync(root, { recursive: true, force: true });
    },
  };
  await cluster.worker.waitFor(/worker running/);
  for (let i = 0; i < opts.hosts; i++) {
    const { createJoinToken } = await operator.request(CreateJoinTokenDocument, { poolId: createPool.id });
    const p = new Proc(`agent ${i + 1}`, agentArgs(i, createJoinToken.token), env);
    cluster.agents.push(p);
    await p.waitFor(/agent host-\d+ running/);
  }
  // Placement needs each node's capacity, which arrives with its agent's first report.
  await until(
    "every node to report its capacity",
    async () =>
      (await operator.request(NodesDocument, { poolId: createPool.id })).nodes.filter((n) => n.lastReportAt && n.capacity.vcpus > 0).length === opts.hosts,
    60_000,
  );
  return cluster;
}
export type Cluster = Awaited<ReturnType<typeof startCluster>>;
