import type { Sql } from "../../../core/kernel/db.ts";
import { type IdSource, randomIds } from "../../../core/kernel/ids.ts";
import type { Database } from "../../../infra/db/index.ts";
import { reconcileInstance } from "../../../worker/jobs/reconcile-instance.ts";
import { type Harness, startHarness } from "../harness.ts";

/**
 * One side of a fast-path comparison: a platform of its own (its own database), as deployed or with fast
 * paths turned off so that the same input takes the general path:
 *
 * - `power-requests`: its writes' Sql lacks `commitBatch`, as on PGlite, so `powerInOneMessage` says no and a
 *   pause or resume goes through setDesiredState's lock, read and change (so does a host's report naming its
 *   pause or resume: that property's hosts name none, on either side);
 * - `deferred-hold`: `placeStepByStep` (core/pools/driver.ts DriverDeps), the way GPU requests, restores and
 *   retries are placed (`place`);
 * - `catalog`: no `lookups`, so every create looks its catalog up (admission.ts: "without it every create looks
 *   its catalog up").
 *
 * A pause's or resume's report takes the general way when it does not name its command (`power`): that
 * property's two sides are both as deployed, and differ in what their hosts send.
 *
 * No worker: the reconcile passes the writes ask for (`vps.instances` wake-ups) are collected and taken by
 * `drain`, one at a time in the order of the labels `order` gives, so both sides take them alike (a node's
 * spec generations depend on the order its instances change in).
 */
export type GeneralWay = "power-requests" | "deferred-hold" | "catalog";

export interface Side {
  h: Harness;
  /** Take the reconcile passes asked for so far, and those they ask for, in `order`; what failed, by instance. */
  drain(order: (ids: string[]) => Promise<string[]>): Promise<{ instanceId: string; error: string }[]>;
  close(): Promise<void>;
}

/** A side with the fast paths `off` turned off (none: as deployed). */
export async function startSide(...off: GeneralWay[]): Promise<Side> {
  const h = await startHarness({}, { ids: orderedIds(), ...(off.includes("power-requests") ? { database: withoutCommitBatch } : {}) });
  if (off.includes("deferred-hold")) h.platform.admission = { ...h.platform.admission, placeStepByStep: true };
  if (off.includes("catalog")) {
    const { lookups: _, ...rest } = h.platform.admission;
    h.platform.admission = rest;
  }
  const woken = new Set<string>();
  const jobs = h.platform.jobs;
  const enqueue = jobs.enqueue.bind(jobs);
  jobs.enqueue = ((name, payload, opts) => {
    if (name !== "vps.instances") return enqueue(name, payload, opts);
    woken.add((payload as { instanceId: string }).instanceId);
    return Promise.resolve();
  }) as typeof jobs.enqueue;
  return {
    h,
    async drain(order) {
      const failed: { instanceId: string; error: string }[] = [];
      for (let round = 0; woken.size; round++) {
        if (round > 20) throw new Error(`reconcile passes keep waking each other: ${[...woken].join(", ")}`);
        const ids = await order([...woken]);
        woken.clear();
        for (const id of ids) await reconcileInstance(h.platform, id).catch((e) => failed.push({ instanceId: id, error: String(e) }));
      }
      return failed;
    },
    close: () => h.close(),
  };
}

/**
 * Ids that sort in the order they were made (a counter in letters, then random): where placement breaks a tie
 * by node id, both sides' first node is the first made.
 */
export function orderedIds(): IdSource {
  let n = 0;
  return (kind) => {
    let v = ++n;
    let count = "";
    for (let i = 0; i < 8; i++, v = Math.floor(v / 26)) count = String.fromCharCode(97 + (v % 26)) + count;
    return `${kind}_${count}${randomIds(kind).slice(kind.length + 1 + 8)}`;
  };
}

/** The database as PGlite offers it to writes: no Sql.commitBatch, which `powerInOneMessage` and `settlesInOneMessage` ask for. */
export function withoutCommitBatch(db: Database): Database {
  const strip = (sql: Sql): Sql => new Proxy(sql, { get: (t, k) => (k === "commitBatch" ? undefined : Reflect.get(t, k)) });
  const stripped =
    (on: Pick<Database, "transaction">): Database["transaction"] =>
    (fn, opts) =>
      on.transaction((sql) => fn(strip(sql)), opts);
  return new Proxy(db, {
    get(t, k) {
      if (k === "transaction") return stripped(t);
      if (k === "api")
        return (caller: string) => {
          const share = t.api(caller);
          return { read: share.read.bind(share), transaction: stripped(share) };
        };
      const v = Reflect.get(t, k);
      return typeof v === "function" ? v.bind(t) : v;
    },
  });
}
