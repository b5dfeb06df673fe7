import { type Job, Queue, Worker } from "bullmq";
import { Redis } from "ioredis";
import { type JobName, type JobPayload, jobCatalog } from "../contracts/jobs.ts";
import type { Config } from "./config.ts";
import type { Logger } from "./log.ts";

/** The producer side of the job catalog: what the server and the reconcilers use to wake work. */
export interface Jobs {
  /** Wake a job; with `delayMs`, not before then (a job of that id already waiting keeps its own time). */
  enqueue<N extends JobName>(name: N, payload: JobPayload<N>, opts?: { delayMs?: number }): Promise<void>;
  /** Run the catalog's jobs in this process with these handlers (the worker), telling `observe` how each went. */
  run(handlers: Handlers, config: Config, log: Logger, observe?: JobObserver): Promise<{ close(): Promise<void> }>;
  /** Jobs of each catalog entry waiting to run (due or delayed) and running now, for /metrics. */
  depth(): Promise<{ name: JobName; waiting: number; active: number }[]>;
  close(): Promise<void>;
}

export type Handlers = { [N in JobName]: (payload: JobPayload<N>) => Promise<void> };

/**
 * What the worker times (worker/metrics.ts). `waited`: from when the job was due — enqueued, or its delay over —
 * to its start, for a first attempt only (a retry's wait is its backoff). `ran`: each attempt's run.
 */
export interface JobObserver {
  waited(name: JobName, seconds: number): void;
  ran(name: JobName, seconds: number, outcome: "ok" | "failed"): void;
}

/** Runs one attempt of a job, telling the observer how long it ran and whether it threw. */
async function timed(name: JobName, observe: JobObserver | undefined, fn: () => Promise<void>): Promise<void> {
  const start = performance.now();
  let outcome: "ok" | "failed" = "failed";
  try {
    await fn();
    outcome = "ok";
  } finally {
    observe?.ran(name, (performance.now() - start) / 1000, outcome);
  }
}

/** BullMQ queue names cannot hold `:`; the catalog's dotted names map to one queue each. */
export const queueName = (name: JobName) => name.replace(/[^A-Za-z0-9_.-]/g, "-");

/** How long a wake-up that arrived during a run is remembered: past it, the sweep is the net. */
const WOKEN_TTL_MS = 10 * 60_000;

export function bullJobs(opts: { redisUrl: string; prefix: string }): Jobs {
  // One connection for every queue and the wake-up marks, made now: the first enqueue of each job (a warm
  // claim's deadline, say) does not wait for a connection of its own. Reconnects by itself; a mark or add that
  // fails while Redis is away fails its enqueue, which the sweep covers.
  const redis = new Redis(opts.redisUrl).on("error", () => {});
  const queues = new Map<JobName, Queue>();
  const queueFor = (name: JobName) => {
    let q = queues.get(name);
    if (!q) {
      q = new Queue(queueName(name), { connection: redis, prefix: opts.prefix });
      queues.set(name, q);
    }
    return q;
  };
  const wokenKey = (name: JobName, id: string) => `${opts.prefix}:woken:${queueName(name)}:${id}`;
  async function enqueue<N extends JobName>(name: N, payload: JobPayload<N>, opts: { delayMs?: number } = {}): Promise<void> {
    const spec = jobCatalog[name];
    const data = spec.payload.parse(payload);
    const jobId = spec.jobId(data as never);
    // A job id already present makes add() a no-op: that is the dedup, and it holds while that job runs too.
    // A run under way may have read its rows before what this wake-up is about, so the wake-up is marked
    // first; the run clears the mark as it starts, and one still marked when it ends runs again (`again`).
    await redis.set(wokenKey(name, jobId), "1", "PX", WOKEN_TTL_MS);
    // Finished jobs are removed, failed ones too, so no kept job swallows the next wake-up of its id
    // (docs/architecture.md, Pitfalls); failures are logged.
    await queueFor(name).add(name, data, {
      jobId,
      attempts: spec.attempts,
      backoff: { type: "exponential", delay: spec.backoffMs },
      removeOnComplete: true,
      removeOnFail: true,
      ...(opts.delayMs ? { delay: opts.delayMs } : {}),
    });
  }
  /** A job woken while it ran goes again, now that its id is free. */
  async function again(name: JobName, job: Job | undefined): Promise<void> {
    if (job?.id && (await redis.del(wokenKey(name, job.id))) > 0) await enqueue(name, job.data);
  }
  return {
    enqueue,
    async run(handlers, config, log, observe) {
      const workers: Worker[] = [];
      for (const name of Object.keys(jobCatalog) as JobName[]) {
        const spec = jobCatalog[name];
        const processJob = async (job: Job) => {
          // Both times are Date.now() readings, the producer's and this worker's: a skewed clock is clamped, not negative.
          if (job.attemptsMade === 0) observe?.waited(name, Math.max(0, (job.processedOn ?? Date.now()) - job.timestamp - (job.delay ?? 0)) / 1000);
          if (job.id) await redis.del(wokenKey(name, job.id));
          return timed(name, observe, () => handlers[name](spec.payload.parse(job.data) as never));
        };
        // Workers block on their connections: each makes its own from the URL.
        const worker = new Worker(queueName(name), processJob, {
          connection: { url: opts.redisUrl },
          prefix: opts.prefix,
          concurrency: spec.concurrency,
          // Jobs are short; short locks (renewed while a job runs) let another worker take over a dead
          // worker's jobs within seconds. Until then their ids block every wake-up of those instances.
          lockDuration: 5000,
          stalledInterval: 5000,
          maxStalledCount: 3,
        });
        const rerun = (job: Job | undefined) =>
          void again(name, job).catch((e) => log.warn("re-running a woken job failed", { job: name, id: job?.id, err: String(e) }));
        worker.on("completed", rerun);
        worker.on("failed", (job, err) => {
          log.warn("job failed", { job: name, id: job?.id, err: err.message });
          if (job && job.attemptsMade >= (job.opts.attempts ?? 1)) rerun(job);
        });
        workers.push(worker);
        if (spec.everyMs)
          await queueFor(name).upsertJobScheduler(
            name,
            { every: spec.everyMs(config) },
            { name, data: {}, opts: { removeOnComplete: true, removeOnFail: 100 } },
          );
      }
      return { close: async () => void (await Promise.all(workers.map((w) => w.close()))) };
    },
    async depth() {
      return Promise.all(
        (Object.keys(jobCatalog) as JobName[]).map(async (name) => {
          const c = await queueFor(name).getJobCounts("waiting", "delayed", "prioritized", "active");
          return { name, waiting: (c.waiting ?? 0) + (c.delayed ?? 0) + (c.prioritized ?? 0), active: c.active ?? 0 };
        }),
      );
    },
    async close() {
      await Promise.all([...queues.values()].map((q) => q.close()));
      redis.disconnect();
    },
  };
}

/**
 * The embedded mode's job runner: the same catalog and semantics as BullMQ (one waiting job per job id,
 * retries with backoff, periodic jobs), in this process. A wake-up for a job that is running is not lost:
 * it runs again once the current run ends. Jobs wait until `run` provides the handlers.
 */
export function memoryJobs(): Jobs {
  /** `due`: when the job may start (performance.now()), from which its wait is measured. */
  const waiting = new Map<string, { name: JobName; payload: unknown; attempt: number; due: number }>();
  const active = new Set<string>();
  const again = new Set<string>();
  const timers = new Set<NodeJS.Timeout>();
  let handlers: Handlers | null = null;
  let log: Logger | null = null;
  let observe: JobObserver | undefined;
  let closed = false;

  const schedule = (key: string, delay = 0) => {
    if (delay === 0) queueMicrotask(() => void run(key));
    else {
      const t = setTimeout(() => {
        timers.delete(t);
        void run(key);
      }, delay);
      timers.add(t);
    }
  };
  async function run(key: string) {
    const job = waiting.get(key);
    if (!job || !handlers || closed || active.has(key)) return;
    waiting.delete(key);
    active.add(key);
    const spec = jobCatalog[job.name];
    if (job.attempt === 1) observe?.waited(job.name, Math.max(0, performance.now() - job.due) / 1000);
    try {
      log?.debug("job", { job: job.name, key });
      const run = handlers[job.name];
      await timed(job.name, observe, () => run(job.payload as never));
    } catch (e) {
      log?.warn("job failed", { job: job.name, key, attempt: job.attempt, err: String(e) });
      if (job.attempt < spec.attempts && !waiting.has(key)) {
        const backoff = spec.backoffMs * 2 ** (job.attempt - 1);
        waiting.set(key, { ...job, attempt: job.attempt + 1, due: performance.now() + backoff });
        schedule(key, backoff);
      }
    } finally {
      active.delete(key);
      if (again.delete(key) && !waiting.has(key)) {
        waiting.set(key, { ...job, attempt: 1, due: performance.now() });
        schedule(key);
      } else if (waiting.has(key)) schedule(key);
    }
  }
  return {
    async enqueue(name, payload, opts = {}) {
      const spec = jobCatalog[name];
      const data = spec.payload.parse(payload);
      const key = `${name}/${spec.jobId(data as never)}`;
      if (active.has(key)) again.add(key);
      if (waiting.has(key) || active.has(key)) return;
      waiting.set(key, { name, payload: data, attempt: 1, due: performance.now() + (opts.delayMs ?? 0) });
      schedule(key, opts.delayMs ?? 0);
    },
    async run(h, config, l, o) {
      handlers = h;
      log = l;
      observe = o;
      for (const key of waiting.keys()) schedule(key);
      const intervals = (Object.keys(jobCatalog) as JobName[]).flatMap((name) => {
        const every = jobCatalog[name].everyMs;
        return every ? [setInterval(() => void this.enqueue(name, {} as never), every(config))] : [];
      });
      return {
        close: async () => {
          for (const i of intervals) clearInterval(i);
          handlers = null;
        },
      };
    },
    async depth() {
      const of = (keys: Iterable<string>, name: JobName) => [...keys].filter((k) => k.startsWith(`${name}/`)).length;
      return (Object.keys(jobCatalog) as JobName[]).map((name) => ({ name, waiting: of(waiting.keys(), name), active: of(active, name) }));
    },
    async close() {
      closed = true;
      for (const t of timers) clearTimeout(t);
    },
  };
}
