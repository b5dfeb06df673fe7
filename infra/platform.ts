import type { InstanceEventMessage } from "../contracts/channels.ts";
import { type ImageResolver, tableImages } from "../core/catalog/images.ts";
import { prismaSql, type Sql } from "../core/kernel/db.ts";
import { type IdSource, randomIds } from "../core/kernel/ids.ts";
import { type Sealer, sealer } from "../core/kernel/seal.ts";
import { ensureOperatorIdentity } from "../core/tenancy/tenants.ts";
import { type Bus, openBus } from "./bus.ts";
import { type Config, newOperatorToken, newSealKey, persistentSecret } from "./config.ts";
import { type Database, openDatabase } from "./db/index.ts";
import { migrate } from "./db/migrate.ts";
import type { Tx } from "./db/prisma.ts";
import { bullJobs, type Jobs, memoryJobs } from "./jobs.ts";
import { type Logger, logger } from "./log.ts";

/** What a committed change announces: its instance event, the nodes whose spec it changed, credentials it revoked. */
export interface Emission {
  event: InstanceEventMessage | null;
  specs?: { nodeId: string; generation: number }[];
  /** Credential keys (`tok:<id>`, `node:<id>`) whose live connections must end. */
  revoked?: string[];
}
export type Emit = (e: Emission | null) => void;

/** Everything a process of the platform shares: one per server, worker or dev process. */
export interface Platform {
  config: Config;
  db: Database;
  bus: Bus;
  jobs: Jobs;
  sealer: Sealer;
  images: ImageResolver;
  ids: IdSource;
  now: () => Date;
  log: Logger;
  operatorToken: string | undefined;
  /**
   * Run `fn` in one transaction; after it commits, publish the events it produced and wake the reconciler for
   * their instances. Nothing is published for a transaction that rolls back.
   */
  transact<T>(fn: (tx: Tx, emit: Emit) => Promise<T>): Promise<T>;
  /** The same on plain SQL: the instance domain's hot path (see core/sql.ts). */
  write<T>(fn: (sql: Sql, emit: Emit) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

export interface PlatformOptions {
  /** The embedded quick start may invent and keep its operator token and sealing key under the data dir. */
  embedded?: boolean;
  ids?: IdSource;
  now?: () => Date;
  /** Tests hand in a database they made (a clone of a migrated template). */
  db?: Database;
}

const RETRYABLE = new Set(["P2034", "40001", "40P01"]);

export async function openPlatform(config: Config, opts: PlatformOptions = {}): Promise<Platform> {
  const log = logger(config.logLevel);
  const embedded = opts.embedded ?? false;
  const sealKey = config.sealKey ?? (embedded ? persistentSecret(config.dataDir, "seal.key", newSealKey) : undefined);
  if (!sealKey) throw new Error("SEAL_KEY is required outside the embedded mode (32 random bytes, base64)");
  const operatorToken = config.operatorToken ?? (embedded ? persistentSecret(config.dataDir, "operator-token", newOperatorToken) : undefined);

  const db =
    opts.db ??
    (await openDatabase({
      databaseUrl: config.databaseUrl,
      dataDir: config.dataDir,
      onIdleError: (e) => log.warn("idle database connection lost", { err: e.message }),
    }));
  await db.session((sql) => migrate(sql));
  await db.prisma.$transaction((tx) => ensureOperatorIdentity(tx));
  const bus = await openBus({ redisUrl: config.redisUrl, prefix: config.redisPrefix });
  const jobs = config.redisUrl ? bullJobs({ redisUrl: config.redisUrl, prefix: config.redisPrefix }) : memoryJobs();

  const platform: Platform = {
    config,
    db,
    bus,
    jobs,
    sealer: sealer(sealKey),
    images: config.vps.images ?? tableImages,
    ids: opts.ids ?? randomIds,
    now: opts.now ?? (() => new Date()),
    log,
    operatorToken,
    transact: (fn) =>
      withRetry((emit, emitted) =>
        db.prisma.$transaction(async (tx) => sequenced(prismaSql(tx), emitted, await fn(tx, emit)), { maxWait: 30_000, timeout: 30_000 }),
      ),
    write: (fn) => withRetry((emit, emitted) => db.transaction(async (sql) => sequenced(sql, emitted, await fn(sql, emit)))),
    async close() {
      await jobs.close();
      await bus.close();
      await db.close();
    },
  };

  /** Run a transaction, retrying what the database asks to retry; after commit, publish what it emitted. */
  async function withRetry<T>(run: (emit: Emit, emitted: Emission[]) => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      const emitted: Emission[] = [];
      try {
        const result = await run((e) => {
          if (e) emitted.push(e);
        }, emitted);
        for (const e of emitted) await afterCommit(e);
        return result;
      } catch (e) {
        // Deadlocks and serialisation failures are the database asking for a retry, not a user error.
        const code = (e as { code?: string }).code;
        if (attempt < 4 && code && RETRYABLE.has(code)) continue;
        throw e;
      }
    }
  }

  /**
   * The transaction's last statement: give its events their positions in commit order (the function holds a
   * lock through COMMIT; see the live_positions migration). Cursors are positions, so they are set here.
   */
  async function sequenced<T>(sql: Sql, emitted: Emission[], result: T): Promise<T> {
    const events = emitted.flatMap((e) => (e.event ? [e.event] : []));
    if (!events.length) return result;
    const rows = await sql.query<{ id: string; position: string }>(
      `SELECT id::text AS id, position::text AS position FROM sequence_instance_events($1::bigint[])`,
      [events.map((e) => e.cursor)],
    );
    const positions = new Map(rows.map((r) => [r.id, r.position]));
    for (const e of events) e.cursor = positions.get(e.cursor) as string;
    return result;
  }

  /** Publishing and waking are hints: a failure here delays convergence (the sweep re-finds it), never loses state. */
  async function afterCommit(e: Emission) {
    try {
      for (const spec of e.specs ?? []) bus.publish("nodeSpecs", spec, spec.nodeId);
      for (const key of e.revoked ?? []) bus.publish("credentialsRevoked", { key });
      if (e.event) {
        bus.publish("instanceEvents", e.event);
        await jobs.enqueue("vps.instances", { instanceId: e.event.instanceId });
      }
    } catch (err) {
      log.warn("after-commit effects failed", { instanceId: e.event?.instanceId, err: String(err) });
    }
  }
  return platform;
}
