import { Queue } from "bullmq";
import { type JobName, type JobPayload, jobCatalog } from "../worker/catalog.ts";

/** The producer side of the job catalog: what the server and the reconcilers use to wake work. */
export interface Jobs {
  enqueue<N extends JobName>(name: N, payload: JobPayload<N>): Promise<void>;
  close(): Promise<void>;
}

/** BullMQ queue names cannot hold `:`; the catalog's dotted names map to one queue each. */
export const queueName = (name: JobName) => name.replace(/[^A-Za-z0-9_.-]/g, "-");

export function bullJobs(opts: { redisUrl: string; prefix: string }): Jobs {
  const queues = new Map<JobName, Queue>();
  const queueFor = (name: JobName) => {
    let q = queues.get(name);
    if (!q) {
      q = new Queue(queueName(name), { connection: { url: opts.redisUrl }, prefix: opts.prefix });
      queues.set(name, q);
    }
    return q;
  };
  return {
    async enqueue(name, payload) {
      const spec = jobCatalog[name];
      const data = spec.payload.parse(payload);
      // A job id already waiting makes add() a no-op: that is the dedup. Completed jobs are removed so the
      // next wake-up of the same instance is a new job, not swallowed by a kept one (STACK.md, pitfall 7).
      await queueFor(name).add(name, data, {
        jobId: spec.jobId(data),
        attempts: spec.attempts,
        backoff: { type: "exponential", delay: spec.backoffMs },
        removeOnComplete: true,
        removeOnFail: 1000,
      });
    },
    async close() {
      await Promise.all([...queues.values()].map((q) => q.close()));
    },
  };
}

export type Handler<N extends JobName> = (payload: JobPayload<N>) => Promise<void>;

/**
 * The embedded mode's job runner: the same catalog and the same dedup (one waiting job per job id), run in
 * this process. Jobs wait until a handler for their name is registered.
 */
export function memoryJobs(): Jobs & { handle<N extends JobName>(name: N, fn: Handler<N>): void; pending(): number } {
  const waiting = new Map<string, { name: JobName; payload: unknown }>();
  const handlers = new Map<JobName, Handler<JobName>>();
  let closed = false;
  const run = (key: string) => {
    const job = waiting.get(key);
    const fn = job && handlers.get(job.name);
    if (!job || !fn || closed) return;
    waiting.delete(key);
    void fn(job.payload as never).catch(() => {
      // Retries are the worker's business (issue: reconcilers); a failed wake-up is re-found by the sweep.
    });
  };
  return {
    async enqueue(name, payload) {
      const spec = jobCatalog[name];
      const data = spec.payload.parse(payload);
      const key = `${name}/${spec.jobId(data)}`;
      if (waiting.has(key)) return;
      waiting.set(key, { name, payload: data });
      queueMicrotask(() => run(key));
    },
    handle(name, fn) {
      handlers.set(name, fn as Handler<JobName>);
      for (const key of [...waiting.keys()]) run(key);
    },
    pending: () => waiting.size,
    async close() {
      closed = true;
    },
  };
}
