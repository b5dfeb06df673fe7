import type { Registry } from "prom-client";
import { tracePoint } from "../contracts/trace.ts";
import { ensureOperatorIdentity, newOperatorToken } from "../core/auth/tokens.ts";
import { type ImageResolver, tableImages } from "../core/catalog/images.ts";
import { registerBuiltInDrivers } from "../core/drivers.ts";
import type { WatchedEvent } from "../core/instances/events.ts";
import type { Instance } from "../core/instances/model.ts";
import { type Clock, systemClock } from "../core/kernel/clock.ts";
import type { Sql } from "../core/kernel/db.ts";
import { type IdSource, randomIds } from "../core/kernel/ids.ts";
import { newSealKey, type Sealer, sealer } from "../core/kernel/seal.ts";
import { ContendedWrite, type EventDetail, finishWrite, positionEvents, Write, type WriteOptions } from "../core/kernel/write.ts";
import type { AdmissionDeps } from "../core/lifecycle/admission.ts";
import { lookupCache } from "../core/lifecycle/lookup.ts";
import type { DriverDeps, SyncIo } from "../core/pools/driver.ts";
import { type Bus, openBus } from "./bus.ts";
import type { Config } from "./config.ts";
import { persistentSecret } from "./data-dir.ts";
import { type Database, openDatabase } from "./db/index.ts";
import { migrate } from "./db/migrate.ts";
import { bullJobs, type Jobs, memoryJobs } from "./jobs.ts";
import { type Logger, logger } from "./log.ts";
import { platformMetrics, type WriteCounts } from "./metrics.ts";
import { providerSessions, secretRefPolicy } from "./providers.ts";
import { eventSequencer } from "./sequencer.ts";

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

const RETRYABLE = new Set(["40001", "40P01"]);
// Keys that concurrent identical requests race to insert (idempotent creates): the write that lost runs again
// and finds the winner's row.
const RETRY_ON_DUPLICATE = new Set(["instances_pkey", "ip_addresses_instance_id_key", "allocations_instance_id_key"]);

export async function openPlatform(config: Config, opts: PlatformOptions = {}): Promise<Platform> {
  // Before anything reads a pool's class or changes an instance (core/drivers.ts).
  registerBuiltInDrivers();
  const log = opts.log ?? logger(config.logLevel);
  const embedded = opts.embedded ?? false;
  const sealKey = config.sealKey ?? (embedded ? persistentSecret(config.dataDir, "seal.key", newSealKey) : undefined);
  if (!sealKey) throw new Error("SEAL_KEY is required outside the embedded mode (32 random bytes, base64)");
  const operatorToken = config.operatorToken ?? (embedded ? persistentSecret(config.dataDir, "operator-token", newOperatorToken) : undefined);

  const db =
    opts.db ??
    (await openDatabase({
      databaseUrl: config.databaseUrl,
      dataDir: config.dataDir,
      api: { connections: config.limits.apiConnections, statementTimeoutMs: config.limits.apiStatementTimeoutMs },
      onIdleError: (e) => log.warn("idle database connection lost", { err: e.message }),
    }));
  await db.session((sql) => migrate(sql));
  await db.transaction((sql) => ensureOperatorIdentity(sql));
  const bus = await openBus({ redisUrl: config.redisUrl, prefix: config.redisPrefix });
  const jobs = config.redisUrl ? bullJobs({ redisUrl: config.redisUrl, prefix: config.redisPrefix }) : memoryJobs();
  const ids = opts.ids ?? randomIds;
  const now = opts.now ?? systemClock;
  const images = config.vps.images ?? tableImages;

  const counts: WriteCounts = { writes: 0, eventsPublished: 0, retries: 0, guessesMissed: 0 };
  const metrics = platformMetrics(counts, jobs);

  /**
   * What hosts and live connections must hear of a write at once, sent before its events are positioned: none
   * of it needs a position, and a warm claim's resume or a new instance's spec would otherwise wait for the
   * sequencer's round trip.
   */
  function tellHosts(w: Write): void {
    try {
      // Commands first: a resume's agent then holds its instance before the spec that says the same arrives.
      for (const [nodeId, commands] of w.commandsFor) bus.publish("hostCommands", { nodeId, commands }, nodeId);
      for (const [nodeId, generation] of w.specs) bus.publish("nodeSpecs", { nodeId, generation }, nodeId);
      for (const key of w.revoked) bus.publish("credentialsRevoked", { key });
    } catch (err) {
      log.warn("after-commit effects failed", { actor: w.actor, err: String(err) });
    }
  }

  /**
   * Publishing and waking are hints: a failure here delays convergence (the sweep re-finds it), never loses state.
   * The jobs go to the queue at once, not one after another: each is a few round trips to Redis, and a warm
   * claim's answer (and the host's report coming in meanwhile) would wait for all of them in turn.
   */
  async function apply(w: Write): Promise<void> {
    const enqueued: Promise<void>[] = [];
    try {
      if (localEvents.size && w.events.length) {
        const watched = watchedEvents(w);
        // A feed that fails here reads the events when their messages come: the messages must still go out.
        if (watched)
          for (const feed of localEvents)
            try {
              feed(watched);
            } catch (err) {
              log.warn("handing events to the live feed failed", { actor: w.actor, err: String(err) });
            }
      }
      if (w.events.length) bus.publish("instanceEvents", { events: w.events });
      counts.eventsPublished += w.events.length;
      for (const commandId of w.execOutputs) bus.publish("execOutput", { commandId }, commandId);
      for (const instanceId of w.wakes) if (!w.settled.has(instanceId)) enqueued.push(jobs.enqueue("vps.instances", { instanceId }));
      for (const accountId of w.providerAccounts) enqueued.push(jobs.enqueue("vps.providers", { accountId }));
      for (const tenantId of w.tenantsToTearDown) enqueued.push(jobs.enqueue("vps.tenants", { tenantId }));
      if (w.sandboxes) enqueued.push(jobs.enqueue("vps.sandboxes", {}, { delayMs: w.sandboxes.delayMs }));
      // Deadlines are on the platform's clock; the delay is measured from the write's own time.
      for (const [sandboxId, at] of w.deadlines)
        enqueued.push(jobs.enqueue("vps.sandbox.expire", { sandboxId }, { delayMs: Math.max(0, at.getTime() - w.now.getTime()) }));
    } catch (err) {
      log.warn("after-commit effects failed", { actor: w.actor, err: String(err) });
    }
    for (const r of await Promise.allSettled(enqueued))
      if (r.status === "rejected") log.warn("after-commit effects failed", { actor: w.actor, err: String(r.reason) });
  }

  const sequencer = eventSequencer(db);
  const localEvents = new Set<(events: WatchedEvent[]) => void>();

  /** The write path on `on`: the database itself (host work) or an API caller's share of it. */
  const writeOn =
    (on: Pick<Database, "transaction">): Platform["write"] =>
    async (wopts, fn) => {
      // Three retries for contention; a guess that missed (only ever on attempt 1) takes none of them.
      let retried = 0;
      for (let attempt = 1; ; attempt++) {
        tracePoint("write.begin", wopts.action ?? wopts.actor);
        const sequencing = sequencer.write();
        try {
          const [result, w] = await on
            .transaction(async (sql) => {
              const w = new Write(sql, ids, now(), wopts, attempt);
              const result = await fn(w);
              await finishWrite(w);
              return [result, w] as const;
            }, sequencing.options)
            .finally(sequencing.end);
          counts.writes++;
          tellHosts(w);
          tracePoint("write.committed", wopts.action ?? wopts.actor);
          // Committed whatever happens here: without positions its events are not published (subscribers'
          // polls read them), rather than the write reported as failed.
          await positionEvents(w, sequencing.positions).catch((err) => {
            log.warn("positioning committed events failed", { actor: wopts.actor, err: String(err) });
            w.events.splice(0);
          });
          await apply(w);
          tracePoint("write.applied", wopts.action ?? wopts.actor);
          return result;
        } catch (e) {
          // Deadlocks and serialisation failures are the database asking for a retry, not a user error.
          const { code, constraint } = e as { code?: string; constraint?: string };
          if (e instanceof ContendedWrite && e.guess && attempt === 1) {
            counts.guessesMissed++;
            continue;
          }
          if (retried < 3 && code && (RETRYABLE.has(code) || (code === "23505" && constraint && RETRY_ON_DUPLICATE.has(constraint)))) {
            retried++;
            counts.retries++;
            continue;
          }
          throw e;
        }
      }
    };

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
    sync: {
      write,
      read,
      sealer: seal,
      log,
      poll: { minMs: config.providers.pollMinMs, maxMs: config.providers.pollMaxMs },
      createLeaseMs: config.providers.createLeaseMs,
      providers: providerSessions({
        read,
        providers: config.vps.providers,
        sealer: seal,
        ...(config.vps.secrets ? { custom: config.vps.secrets } : {}),
        refs: secretRefPolicy(config),
        endpoints: config.providers.endpoints,
        // Labels this deployment's machines: stable for one seal key, and says nothing of it.
        managedBy: `bc-${seal.digest("provider machines", "managed-by").slice(0, 12)}`,
        credentialTtlMs: config.providers.credentialTtlMs,
      }),
    },
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

/**
 * A committed write's events as a live feed delivers them, each with its instance as the write left it (the
 * last row it wrote for that instance, as a read right after the commit would find it); null when an event
 * lacks what its row holds (its writer did not say), and the feed reads them from the table as usual.
 */
function watchedEvents(w: Write): WatchedEvent[] | null {
  const latest = new Map<string, object>();
  for (const e of w.events) {
    const detail = w.eventDetails.get(e);
    if (!detail || !/^\d{1,19}$/.test(e.cursor)) return null;
    latest.set(e.instanceId, detail.instance);
  }
  return w.events.map((e) => {
    const d = w.eventDetails.get(e) as EventDetail;
    return {
      position: BigInt(e.cursor),
      instanceId: e.instanceId,
      tenantId: e.tenantId,
      poolId: e.poolId,
      projectId: e.projectId,
      fromState: e.fromState,
      toState: e.toState,
      desiredState: d.desiredState,
      reason: d.reason,
      actor: d.actor,
      version: e.version,
      at: d.at,
      instance: latest.get(e.instanceId) as Instance,
    };
  });
}
