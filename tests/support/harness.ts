import { randomBytes } from "node:crypto";
import { Redis } from "ioredis";
import type { IdSource } from "../../core/kernel/ids.ts";
import { parseConfig } from "../../infra/config.ts";
import { type Database, openDatabase } from "../../infra/db/index.ts";
import type { Logger } from "../../infra/log.ts";
import { openPlatform, type Platform } from "../../infra/platform.ts";
import {
  type Client,
  CreateApiTokenDocument,
  CreateFlavorDocument,
  CreateNodeDocument,
  CreatePoolDocument,
  CreateTenantDocument,
  createClient,
  RegisterImageDocument,
} from "../../sdk/client.ts";
import { type App, startServer } from "../../server/app.ts";
import { sha256Of } from "./fixtures.ts";
import { cloneDatabase } from "./pg.ts";

export const redisUrl = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379";

export interface Harness {
  platform: Platform;
  app: App;
  url: string;
  operator: Client;
  operatorToken: string;
  dbUrl: string;
  redisPrefix: string;
  client(token?: string): Client;
  /** A tenant and a token for it (every tenant scope unless `scopes`). */
  tenant(opts?: {
    name?: string;
    quota?: Record<string, unknown>;
    scopes?: string[];
  }): Promise<{ id: string; token: string; identityId: string; client: Client }>;
  /** A hosted pool with nodes and flavors, and a public image. */
  hostedPool(opts?: HostedPoolOpts): Promise<{ poolId: string; nodeIds: string[]; imageId: string }>;
  close(): Promise<void>;
}

export interface HostedPoolOpts {
  name?: string;
  ipv4Range?: string;
  singleTenant?: boolean;
  nodes?: { vcpus: number; memoryMib: number; diskGib: number; gpus?: { model: string; count: number }[] }[];
  flavors?: { name: string; vcpus: number; memoryMib: number; diskGib: number; gpus?: { model: string; count: number }[] }[];
}

const rnd = () => randomBytes(6).toString("hex");

/**
 * What tests allow beyond a deployment's defaults: provider emulators answer plain http on 127.0.0.1, and
 * tests name credential variables freely. A test of the defaults passes these as "" (unset).
 */
export const testAllowances = { PROVIDER_ENDPOINT_HTTP: "true", PROVIDER_ENDPOINT_ALLOW: "127.0.0.1/32", PROVIDER_SECRET_ENV_PREFIX: "" };

export interface HarnessOptions {
  now?: () => Date;
  log?: Logger;
  ids?: IdSource;
  /** What the platform is given of its database (tests/support/fast-paths: one whose writes lack Sql.commitBatch). */
  database?: (db: Database) => Database;
}

/** A whole platform on a database and Redis prefix of its own, served on an ephemeral port. */
export async function startHarness(env: Record<string, string> = {}, opts: HarnessOptions = {}): Promise<Harness> {
  const db = await cloneDatabase();
  const redisPrefix = `bct_${rnd()}`;
  const operatorToken = `op_${randomBytes(24).toString("hex")}`;
  const config = parseConfig(
    {},
    {
      DATABASE_URL: db.url,
      REDIS_URL: redisUrl,
      REDIS_PREFIX: redisPrefix,
      OPERATOR_TOKEN: operatorToken,
      SEAL_KEY: randomBytes(32).toString("base64"),
      LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? "silent",
      // Tests drive the API from one credential as fast as the machine goes; the rate limit has tests of its own.
      LIMIT_RATE_POINTS: "1000000",
      ...testAllowances,
      // An empty value unsets: `REDIS_URL: ""` runs the embedded in-memory bus and jobs on this database.
      ...Object.fromEntries(Object.entries(env).map(([k, v]) => [k, v === "" ? undefined : v])),
    },
  );
  const { apiConnections: connections, apiStatementTimeoutMs: statementTimeoutMs } = config.limits;
  const database = await openDatabase({ databaseUrl: db.url, poolSize: 20, prisma: true, api: { connections, statementTimeoutMs } });
  const platform = await openPlatform(config, {
    db: opts.database ? opts.database(database) : database,
    ...(opts.now ? { now: opts.now } : {}),
    ...(opts.log ? { log: opts.log } : {}),
    ...(opts.ids ? { ids: opts.ids } : {}),
  });
  const app = await startServer(platform, { port: 0, host: "127.0.0.1" });
  const client = (token?: string) => createClient({ url: app.url, token });
  const operator = client(operatorToken);
  let n = 0;

  return {
    platform,
    app,
    url: app.url,
    operator,
    operatorToken,
    dbUrl: db.url,
    redisPrefix,
    client,
    async tenant(opts = {}) {
      const { createTenant } = await operator.request(CreateTenantDocument, { input: { name: opts.name ?? `t${++n}-${rnd()}`, quota: opts.quota ?? null } });
      const { createApiToken } = await operator.request(CreateApiTokenDocument, {
        input: { tenantId: createTenant.id, name: "test", scopes: opts.scopes ?? null },
      });
      return { id: createTenant.id, token: createApiToken.token, identityId: createApiToken.apiToken.identityId, client: client(createApiToken.token) };
    },
    async hostedPool(opts = {}) {
      const { createPool } = await operator.request(CreatePoolDocument, {
        input: {
          name: opts.name ?? `p${++n}-${rnd()}`,
          class: "VPS_HOST",
          // Ranges of hosted pools may not overlap: each pool gets a /24 of its own unless the test names one.
          ipv4Range: opts.ipv4Range ?? `172.${16 + Math.floor(n / 256)}.${n % 256}.0/24`,
          singleTenant: opts.singleTenant ?? null,
        },
      });
      const nodeIds: string[] = [];
      for (const [i, cap] of (opts.nodes ?? [{ vcpus: 16, memoryMib: 65536, diskGib: 1000 }]).entries()) {
        const { createNode } = await operator.request(CreateNodeDocument, {
          input: { poolId: createPool.id, name: `host-${i + 1}`, capacity: { ...cap, gpus: cap.gpus ?? null } },
        });
        nodeIds.push(createNode.id);
      }
      for (const f of opts.flavors ?? [{ name: "small", vcpus: 2, memoryMib: 2048, diskGib: 20 }]) {
        await operator.request(CreateFlavorDocument, { input: { poolId: createPool.id, ...f, gpus: f.gpus ?? null } });
      }
      const { registerImage } = await operator.request(RegisterImageDocument, {
        input: { name: "debian-12", source: "https://images.invalid/debian-12.qcow2", sha256: sha256Of("a"), format: "QCOW2", public: true },
      });
      return { poolId: createPool.id, nodeIds, imageId: registerImage.id };
    },
    async close() {
      await app.close();
      await platform.close();
      await db.drop();
      const redis = new Redis(redisUrl);
      const keys = await redis.keys(`${redisPrefix}:*`);
      if (keys.length) await redis.del(...keys);
      redis.disconnect();
    },
  };
}

/** Expect an SDK call to fail with `code`; returns the error for further checks. */
export async function expectCode(p: Promise<unknown>, code: string): Promise<Error & { code: string; message: string }> {
  try {
    await p;
  } catch (e) {
    const err = e as Error & { code: string };
    if (err.code !== code) throw new Error(`expected ${code}, got ${err.code}: ${err.message}`);
    return err;
  }
  throw new Error(`expected ${code}, but the call succeeded`);
}
