import type { Registry } from "prom-client";
import { ensureOperatorIdentity, newOperatorToken } from "../core/auth/tokens.ts";
import { type ImageResolver, tableImages } from "../core/catalog/images.ts";
import { registerBuiltInDrivers } from "../core/drivers.ts";
import type { WatchedEvent } from "../core/instances/events.ts";
import { type Clock, systemClock } from "../core/kernel/clock.ts";
import type { Sql } from "../core/kernel/db.ts";
import { type IdSource, randomIds } from "../core/kernel/ids.ts";
import { newSealKey, type Sealer, sealer } from "../core/kernel/seal.ts";
import type { Write, WriteOptions } from "../core/kernel/write.ts";
import type { AdmissionDeps } from "../core/lifecycle/admission.ts";
import { lookupCache } from "../core/lifecycle/lookup.ts";
import type { DriverDeps, SyncIo } from "../core/pools/driver.ts";
import { type Bus, openBus } from "./bus.ts";
import type { Config } from "./config.ts";
import { persistentSecret } from "./data-dir.ts";
import { type Database, openDatabase } from "./db/index.ts";
import { migrate } from "./db/migrate.ts";
import { type LocalFeed, writeEffects } from "./effects.ts";
import { bullJobs, type Jobs, memoryJobs } from "./jobs.ts";
import { type Logger, logger } from "./log.ts";
import { platformMetrics, type WriteCounts } from "./metrics.ts";
import { providerSessions, secretRefPolicy } from "./providers.ts";
import { eventSequencer } from "./sequencer.ts";
import { writeRunner } from "./write-runner.ts";

/** Everything a process of the platform shares: one per server, worker or dev process. */
export interface Platform {
  config: Config;
  db: Database;
  bus: Bus;
  jobs: Jobs;
  sealer: Sealer;
  images: ImageResolver;
  ids: IdSource;
  now: Clock;
  log: Logger;
  operatorToken: string | undefined;
  /** What pool drivers need of the deployment. */
  drivers: DriverDeps;
  /** What admitting an instance needs (a create, a sandbox's instance, a warm one). */
  admission: AdmissionDeps;
  /** What drivers that converge through an outside API need (provider sessions, pacing): the worker's side. */
  sync: SyncIo;
  /**
   * The write path: run `fn` as one Write (one transaction), then apply what it recorded — publish its
   * events and spec changes, wake the reconciler, end revoked connections, tell hosts of new commands.
   * Nothing is applied for a write that rolls back; deadlocks and serialisation failures are retried.
   */
  write<T>(opts: WriteOptions, fn: (w: Write) => Promise<T>): Promise<T>;
  /** Reads outside a transaction. */
  read<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
  /**
   * The platform for work an API caller (a tenant, an operator, an anonymous address) asked for: its reads and
   * writes wait behind host work and take turns with other callers (infra/db/lanes.ts). Host work — the host
   * gateway, the reconciler, the sweep — uses the platform itself.
   */
  api(caller: string): Platform;
  /** `bc dev`: the one-process development platform (anonymous callers may introspect the schema). */
  dev: boolean;
  /**
   * This process's live feeds (server/live/feed.ts): each is handed the events of every write committed here,
   * positioned and whole, before their bus messages go out, so it need not read back what it was just told.
   */
  readonly localEvents: Set<(events: WatchedEvent[]) => void>;
  /** What this process's writes have done, counted for /metrics: committed writes and the events they published. */
  readonly counts: WriteCounts;
  /** The process's metrics (infra/metrics.ts): the server's /metrics shows them, and the worker adds its jobs' timings. */
  readonly metrics: Registry;
  close(): Promise<void>;
}

export interface PlatformOptions {
  /** The embedded quick start may invent and keep its operator token and sealing key under the data dir. */
  embedded?: boolean;
  ids?: IdSource;
  now?: Clock;
  /** Tests hand in a database they made (a clone of a migrated template). */
  db?: Database;
  /** Tests hand in a logger writing where they can read it (infra/log.ts takes a destination). */
  log?: Logger;
}

/** The seal key and the operator token: the configured ones, or in the embedded mode those kept under the data dir. */
function processSecrets(config: Config, embedded: boolean): { sealKey: string; operatorToken: string | undefined } {
  const sealKey = config.sealKey ?? (embedded ? persistentSecret(config.dataDir, "seal.key", newSealKey) : undefined);
  if (!sealKey) throw new Error("SEAL_KEY is required outside the embedded mode (32 random bytes, base64)");
  const operatorToken = config.operatorToken ?? (embedded ? persistentSecret(config.dataDir, "operator-token", newOperatorToken) : undefined);
  return { sealKey, operatorToken };
}

/** The database with its API lane (infra/db/lanes.ts), migrated, with the operator's identity in it. */
async function openStore(config: Config, given: Database | undefined, log: Logger): Promise<Database> {
  const db =
    given ??
    (await openDatabase({
      databaseUrl: config.databaseUrl,
      dataDir: config.dataDir,
      api: { connections: config.limits.apiConnections, statementTimeoutMs: config.limits.apiStatementTimeoutMs },
      onIdleError: (e) => log.warn("idle database connection lost", { err: e.message }),
    }));
  await db.session((sql) => migrate(sql));
  await db.transaction((sql) => ensureOperatorIdentity(sql));
  return db;
}

/** What drivers that converge through an outside API need: the write path, pacing, and provider sessions behind the secret broker. */
function syncIo(config: Config, io: Pick<SyncIo, "write" | "read" | "sealer" | "log">): SyncIo {
  return {
    ...io,
    poll: { minMs: config.providers.pollMinMs, maxMs: config.providers.pollMaxMs },
    createLeaseMs: config.providers.createLeaseMs,
    providers: providerSessions({
      read: io.read,
      providers: config.vps.providers,
      sealer: io.sealer,
      ...(config.vps.secrets ? { custom: config.vps.secrets } : {}),
      refs: secretRefPolicy(config),
      endpoints: config.providers.endpoints,
      // Labels this deployment's machines: stable for one seal key, and says nothing of it.
      managedBy: `bc-${io.sealer.digest("provider machines", "managed-by").slice(0, 12)}`,
      credentialTtlMs: config.providers.credentialTtlMs,
    }),
  };
}

export async function openPlatform(config: Config, opts: PlatformOptions = {}): Promise<Platform> {
  // Before anything reads a pool's class or changes an instance (core/drivers.ts).
  registerBuiltInDrivers();
  const log = opts.log ?? logger(config.logLevel);
  const embedded = opts.embedded ?? false;
  const { sealKey, operatorToken } = processSecrets(config, embedded);
  const db = await openStore(config, opts.db, log);
  const bus = await openBus({ redisUrl: config.redisUrl, prefix: config.redisPrefix });
  const jobs = config.redisUrl ? bullJobs({ redisUrl: config.redisUrl, prefix: config.redisPrefix }) : memoryJobs();
  const ids = opts.ids ?? randomIds;
  const now = opts.now ?? systemClock;
  const images = config.vps.images ?? tableImages;
  const counts: WriteCounts = { writes: 0, eventsPublished: 0, retries: 0, guessesMissed: 0 };
  const metrics = platformMetrics(counts, jobs);
  const localEvents = new Set<LocalFeed>();
  const effects = writeEffects({ bus, jobs, log, counts, localEvents });
  const writeOn = writeRunner({ sequencer: eventSequencer(db), ids, now, counts, log, effects });

  const seal = sealer(sealKey);
  const drivers: DriverDeps = { images, runtimes: config.vps.runtimes, maxRecreateAttempts: config.hosts.maxRecreateAttempts };
  const read: Platform["read"] = (fn) => db.read(fn);
  const write = writeOn(db);
  const platform: Platform = {
    counts,
    metrics,
    localEvents,
    config,
    db,
    bus,
    jobs,
    sealer: seal,
    images,
    ids,
    now,
    log,
    operatorToken,
    dev: embedded,
    drivers,
    admission: { ...drivers, sealer: seal, newIdempotencyKey: () => crypto.randomUUID(), lookups: lookupCache() },
    write,
    read,
    sync: syncIo(config, { write, read, sealer: seal, log }),
    api(caller) {
      const share = db.api(caller);
      return { ...platform, read: (fn) => share.read(fn), write: writeOn(share) };
    },
    async close() {
      await jobs.close();
      await bus.close();
      await db.close();
    },
  };
  return platform;
}
