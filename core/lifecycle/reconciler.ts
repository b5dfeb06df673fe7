import { type HostCommandRow, unsettledCommandsStatement } from "../commands/commands.ts";
import { settleCommands } from "../commands/reports.ts";
import type { Instance } from "../instances/model.ts";
import { batch } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import type { DriverDeps, Pool } from "../pools/driver.ts";
import { heldInstanceAndPool, lockInstanceAndPoolStatement } from "../pools/pools.ts";
import { driverFor } from "../pools/registry.ts";

/**
 * One look at one instance, in the Write's transaction: lock it, re-read it, settle what its host commands
 * finished, then let its pool's driver take at most one guarded step. Returns the instance when something
 * changed (null otherwise), so a stale or duplicate wake-up does nothing.
 */
export async function reconcileOnce(w: Write, deps: DriverDeps, instanceId: string): Promise<Instance | null> {
  const held = await lockForPass(w, instanceId);
  return held ? step(w, deps, held) : null;
}

interface Held {
  inst: Instance;
  pool: Pool;
  /** Its unsettled host commands, read once per pass (settling takes them off). */
  pending: HostCommandRow[];
}

/**
 * The instance, locked, with its pool (one statement), then its unsettled commands, locked after it: both
 * statements in one round trip.
 */
async function lockForPass(w: Write, instanceId: string): Promise<Held | null> {
  const [rows, pending] = await batch(w.sql, [lockInstanceAndPoolStatement(instanceId), unsettledCommandsStatement(instanceId)]);
  const held = heldInstanceAndPool(rows ?? [], null);
  return held ? { ...held, pending: pending as HostCommandRow[] } : null;
}

async function step(w: Write, deps: DriverDeps, { inst, pool, pending }: Held): Promise<Instance | null> {
  const settled = await settleCommands(w, inst, pending);
  if (settled) return settled;
  return driverFor(pool.class).reconcile(w, inst, pool, deps);
}

/** Steps per pass: enough to walk pending → running, bounded so a flapping instance cannot hold a writer. */
const MAX_STEPS = 16;

/**
 * Every guarded step the instance's situation proves, in the Write's one transaction, until it has nothing left
 * to do without news from its host: the row is locked once and each step works on the row the previous one
 * wrote (every step returns the instance as its UPDATE left it) and writes its own event, in order; the host
 * hears of the result once, at commit. Returns the instance if anything changed. A pass that ran out of steps
 * wakes the instance again; one that ran out of things to do does not.
 */
export async function reconcilePass(w: Write, deps: DriverDeps, instanceId: string): Promise<Instance | null> {
  const held = await lockForPass(w, instanceId);
  if (!held) return null;
  let last: Instance | null = null;
  for (let n = 0; n < MAX_STEPS; n++) {
    const next = await step(w, deps, last ? { ...held, inst: last } : held);
    if (!next) {
      w.settle(instanceId);
      break;
    }
    last = next;
  }
  return last;
}

/** At most this many instances are reconciled where their news arrived; a larger report is the worker's. */
export const INLINE_PASSES = 8;

/**
 * A host's report just told something new about these instances: take their passes now, each in its own
 * transaction, where the news arrived, instead of after a trip through the job queue. Which they are, and how
 * many at most (INLINE_PASSES), recordReport decides (`passesHere`): it enqueued no jobs for them, so a pass
 * that fails is handed to `onError`, which queues one.
 */
export async function reconcileNews(
  write: (fn: (w: Write) => Promise<Instance | null>) => Promise<Instance | null>,
  deps: DriverDeps,
  instanceIds: readonly string[],
  onError: (instanceId: string, e: unknown) => void,
): Promise<void> {
  for (const id of instanceIds) await write((w) => reconcilePass(w, deps, id)).catch((e) => onError(id, e));
}
