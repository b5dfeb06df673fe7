import { z } from "zod";

/**
 * Every job the platform runs, in one list: its payload, how it is deduplicated, how it retries, and for
 * periodic ones how often. Producers (the server, the reconcilers) and the worker both read this list, so a
 * job cannot be enqueued in a shape nobody handles.
 */

/** The deployment settings schedules read (a structural slice of the platform's config). */
interface Settings {
  hosts: { sweepMs: number };
  sandboxes: { sweepMs: number };
  providers: { sweepMs: number };
  retention: { sweepMs: number };
}

const instanceId = z.string().regex(/^inst_[a-z2-7]{52}$/);

export const jobCatalog = {
  /** Reconcile one instance toward its desired state. One job per instance: a burst of changes is one run. */
  "vps.instances": {
    payload: z.object({ instanceId }),
    jobId: (p: { instanceId: string }) => p.instanceId,
    attempts: 5,
    backoffMs: 500,
    concurrency: 8,
    everyMs: undefined,
  },
  /**
   * Look at a provider instance again later: enqueued with a delay by its reconciler while the provider is
   * still working (backoff, and no sooner than the provider's rate limit allows). It only wakes `vps.instances`,
   * so a poll due while that job runs is not lost; one poll waits per instance, the earliest.
   */
  "vps.poll": {
    payload: z.object({ instanceId }),
    jobId: (p: { instanceId: string }) => p.instanceId,
    attempts: 1,
    backoffMs: 1000,
    concurrency: 4,
    everyMs: undefined,
  },
  /**
   * Provider accounts: read each account's offers, and find machines labelled as ours that no live instance
   * owns (orphans), removing them after a grace. With an account id, that account only (new accounts).
   */
  "vps.providers": {
    payload: z.object({ accountId: z.string().optional() }),
    jobId: (p: { accountId?: string }) => `providers-${p.accountId ?? "all"}`,
    attempts: 3,
    backoffMs: 2000,
    concurrency: 2,
    everyMs: (c: Settings) => c.providers.sweepMs,
  },
  /**
   * Sandboxes: delete those past their deadline (the reason says ttl), and keep each template's warm pool at its
   * target — boot what is missing, drain instances of older versions and of deleted templates. Periodic, woken
   * by template and sandbox changes, and enqueued with a delay at each deadline so expiry is on time.
   */
  "vps.sandboxes": {
    payload: z.object({}),
    jobId: () => "sandboxes",
    attempts: 3,
    backoffMs: 500,
    concurrency: 1,
    everyMs: (c: Settings) => c.sandboxes.sweepMs,
  },
  /** One sandbox's deadline, enqueued with a delay when it is set: expiry on time without a tight sweep. */
  "vps.sandbox.expire": {
    payload: z.object({ sandboxId: z.string().regex(/^sbx_[a-z2-7]+$/) }),
    jobId: (p: { sandboxId: string }) => p.sandboxId,
    attempts: 3,
    backoffMs: 500,
    concurrency: 2,
    everyMs: undefined,
  },
  /**
   * A deleted tenant's teardown (core/teardown/teardown.ts): ask for the deletion of everything it has, and remove
   * the tenant once nothing is left. Enqueued by deleteTenant, and by the sweep until the tenant is gone.
   */
  "vps.tenants": {
    payload: z.object({ tenantId: z.string().regex(/^ten_[a-z2-7]+$/) }),
    jobId: (p: { tenantId: string }) => `tenant-${p.tenantId}`,
    attempts: 3,
    backoffMs: 1000,
    concurrency: 1,
    everyMs: undefined,
  },
  /**
   * Metering: close every 5-minute window that is due, counting what each hosted allocation held into usage
   * records (core/books/usage.ts). Exactly once per window however many workers run it, and whenever.
   */
  "vps.usage": {
    payload: z.object({}),
    jobId: () => "usage",
    attempts: 3,
    backoffMs: 5000,
    concurrency: 1,
    everyMs: () => 5 * 60_000,
  },
  /**
   * Retention: delete instance events, audit rows and settled host commands older than the configured time, in
   * batches (core/books/retention.ts). One run at a time; a run that dies has deleted whole batches.
   */
  "vps.retention": {
    payload: z.object({}),
    jobId: () => "retention",
    attempts: 1,
    backoffMs: 5000,
    concurrency: 1,
    everyMs: (c: Settings) => c.retention.sweepMs,
  },
  /**
   * The safety net: silent nodes become lost, orphans past their grace are removed, specs an agent has not
   * acknowledged are sent again, host commands past their deadline are settled, and every instance not at
   * rest is woken. A lost wake-up only delays.
   */
  "vps.sweep": {
    payload: z.object({}),
    jobId: () => "sweep",
    attempts: 1,
    backoffMs: 1000,
    concurrency: 1,
    everyMs: (c: Settings) => c.hosts.sweepMs,
  },
} as const;

export type JobName = keyof typeof jobCatalog;
export type JobPayload<N extends JobName> = z.infer<(typeof jobCatalog)[N]["payload"]>;
