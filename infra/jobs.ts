import { Queue, Worker } from "bullmq";
import { type JobName, type JobPayload, jobCatalog } from "../contracts/jobs.ts";
import type { Config } from "./config.ts";
import type { Logger } from "./log.ts";

/** The producer side of the job catalog: what the server and the reconcilers use to wake work. */
export interface Jobs {
  enqueue<N extends JobName>(name: N, payload: JobPayload<N>): Promise<void>;
  /** Run the catalog's jobs in this process with these handlers (the worker). */
  run(handlers: Handlers, config: Config, log: Logger): Promise<{ close(): Promise<void> }>;
  close(): Promise<void>;
}

export type Handlers = { [N in JobName]: (payload: JobPayload<N>) => Promise<void> };

/** BullMQ queue names cannot hold `:`; the catalog's dotted names map to one queue each. */
export const queueName = (name: JobName) => name.replace(/[^A-Za-z0-9_.-]/g, "-");

export function bullJobs(opts: { redisUrl: string; prefix: string }): Jobs {
  const connection = { url: opts.redisUrl };
  const queues = new Map<JobName, Queue>();
  const queueFor = (name: JobName) => {
    let q = queues.get(name);
    if (!q) {
      q = new Queue(queueName(name), { connection, prefix: opts.prefix });
      queues.set(name, q);
    }
    return q;
  };
  return {
    async enqueue(name, payload) {
      const spec = jobCatalog[name];
      const data = spec.payload.parse(payload);
      // A job id already waiting makes add() a no-op: that is the dedup. Completed jobs are removed so the
      // next wake-up of the same instance is a new job, not swallowed by a kept one (docs/architecture.md, Pitfalls).
      await queueFor(name).add(name, data, {
        jobId: spec.jobId(data as never),
        attempts: spec.attempts,
        backoff: { type: "exponential", delay: spec.backoffMs },
        removeOnComplete: true,
        removeOnFail: 1000,
      });
    },
    async run(handlers, config, log) {
      const workers: Worker[] = [];
      for (const name of Object.keys(jobCatalog) as JobName[]) {
        const spec = jobCatalog[name];
        const worker = new Worker(queueName(name), async (job) => handlers[name](spec.payload.parse(job.data) as never), {
          connection,
          prefix: opts.prefix,
          concurrency: spec.concurrency,
          // Jobs are short; short locks (renewed while a job runs) let another worker take over a dead
          // worker's jobs within seconds. Until then their ids block every wake-up of those instances.
          lockDuration: 5000,
          stalledInterval: 5000,
          maxStalledCount: 3,
        });
        worker.on("failed", (job, err) => log.warn("job failed", { job: name, id: job?.id, err: err.message }));
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
    async close() {
      await Promise.all([...queues.values()].map((q) => q.close()));
    },
  };
}

/**
 * The embedded mode's job runner: the same catalog and semantics as BullMQ (one waiting job per job id,
 * retries with backoff, periodic jobs), in this process. A wake-up for a job that is running is not lost:
 * it runs again once the current run ends. Jobs wait until `run` provides the handlers.
 */
export function memoryJobs(): Jobs {
  const waiting = new Map<string, { name: JobName; payload: unknown; attempt: number }>();
  const active = new Set<string>();
  const again = new Set<string>();
  const timers = new Set<NodeJS.Timeout>();
  let handlers: Handlers | null = null;
  let log: Logger | null = null;
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
    try {
      log?.debug("job", { job: job.name, key });
      await handlers[job.name](job.payload as never);
    } catch (e) {
      log?.warn("job failed", { job: job.name, key, attempt: job.attempt, err: String(e) });
      if (job.attempt < spec.attempts && !waiting.has(key)) {
        waiting.set(key, { ...job, attempt: job.attempt + 1 });
        schedule(key, spec.backoffMs * 2 ** (job.attempt - 1));
      }
    } finally {
      active.delete(key);
      if (again.delete(key) && !waiting.has(key)) {
        waiting.set(key, { ...job, attempt: 1 });
        schedule(key);
      } else if (waiting.has(key)) schedule(key);
    }
  }
  return {
    async enqueue(name, payload) {
      const spec = jobCatalog[name];
      const data = spec.payload.parse(payload);
      const key = `${name}/${spec.jobId(data as never)}`;
      if (active.has(key)) again.add(key);
      if (waiting.has(key) || active.has(key)) return;
      waiting.set(key, { name, payload: data, attempt: 1 });
      schedule(key);
    },
    async run(h, config, l) {
      handlers = h;
      log = l;
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
    async close() {
      closed = true;
      for (const t of timers) clearTimeout(t);
    },
  };
}
