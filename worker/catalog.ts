import { z } from "zod";

/**
 * Every job the platform runs, in one list: its payload, how it is deduplicated, how it retries. Producers
 * (the server) and the worker both read this list, so a job cannot be enqueued in a shape nobody handles.
 */
export const jobCatalog = {
  /** Reconcile one instance toward its desired state. One job per instance: a burst of changes is one run. */
  "vps.instances": {
    payload: z.object({ instanceId: z.string().regex(/^inst_[a-z2-7]{52}$/) }),
    jobId: (p: { instanceId: string }) => p.instanceId,
    attempts: 5,
    backoffMs: 500,
  },
} as const;

export type JobName = keyof typeof jobCatalog;
export type JobPayload<N extends JobName> = z.infer<(typeof jobCatalog)[N]["payload"]>;
