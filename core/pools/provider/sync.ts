import { lockInstance, markDeleted, writeChange } from "../../instances/changes.ts";
import { INSTANCE_COLUMNS, type Instance } from "../../instances/model.ts";
import { canTransition } from "../../instances/state.ts";
import { one } from "../../kernel/db.ts";
import type { SyncIo } from "../driver.ts";
import { isProviderError, type Machine, ProviderError, type ProviderSession } from "./contract.ts";
import { blocked, clearedProviderErrors, PROVIDER_ERROR, plan } from "./plan.ts";

/** Looks and calls per run: enough to walk pending → running when the provider is quick, bounded otherwise. */
const MAX_STEPS = 12;

/** Per instance in this worker: when its current stretch of waiting began (the next look's clock); reset by any change. */
const waitingSince = new Map<string, number>();

/**
 * How long to wait before the next look at a busy machine, once `waitedMs` have gone by since it last changed: a
 * third of that, between the configured shortest and longest wait. A machine that becomes ready is seen within
 * a third of the time it took (plus the shortest wait), where waits doubling from the shortest could add as much
 * again as it took (ready at 4.05 s, seen at 7 s); the looks still grow geometrically, about a dozen over a
 * minute's wait from a one-second start, against six when doubling.
 */
export function lookAfter(waitedMs: number, poll: { minMs: number; maxMs: number }): number {
  return Math.min(poll.maxMs, Math.max(poll.minMs, Math.round(waitedMs / 3)));
}

/**
 * One run of the provider reconciler for one instance (docs/architecture.md, "Providers"), outside any
 * transaction: look at the machine, let `plan` say what is next, make the call or the guarded change, and
 * repeat until the provider is busy (the caller polls again after the returned delay) or there is nothing to
 * do. Every change re-reads the row under its lock and is re-planned against it, so a request that arrived
 * meanwhile wins and a stale run changes nothing. The calls are idempotent, so a run repeated after a crash
 * repeats nothing: create adopts the machine labelled with the instance id.
 */
export async function syncProviderInstance(io: SyncIo, instanceId: string): Promise<number | null> {
  const row = await io.read((sql) =>
    one<Instance & { accountId: string }>(
      sql,
      `SELECT ${INSTANCE_COLUMNS}, (SELECT provider_account_id FROM pools p WHERE p.id = instances.pool_id) AS "accountId"
         FROM instances WHERE id = $1`,
      [instanceId],
    ),
  );
  if (!row || row.state === "deleted" || blocked(row)) return done(instanceId);
  const { accountId, ...first } = row;
  let inst: Instance = first;
  let session: ProviderSession;
  try {
    session = await io.providers.session(accountId);
  } catch (e) {
    return failed(io, inst, e);
  }
  for (let i = 0; i < MAX_STEPS; i++) {
    let machine: Machine | null;
    try {
      machine = inst.externalId ? await session.get(inst.externalId) : await session.find(inst.id);
      // A provider that reuses ids (Proxmox VE's VMIDs) may have given the recorded one to another machine since
      // ours went: that machine is someone else's, and this instance's is gone.
      if (machine && machine.instanceId !== inst.id) machine = null;
    } catch (e) {
      return failed(io, inst, e, session);
    }
    const step = plan(inst, machine);
    if (step.kind === "rest") return done(instanceId);
    if (step.kind === "wait") return later(io, instanceId, session);
    if (step.kind === "call") {
      try {
        if (step.call === "create") {
          const made = await withCreateLease(io, inst.id, async () => session.create(await createRequest(io, inst)));
          if (!made) return later(io, instanceId, session); // another run is creating it
          const next = await change(io, inst.id, (cur) =>
            cur.state === "scheduling" && !cur.externalId
              ? {
                  set: { state: "provisioning", external_id: made.externalId, addresses: made.addresses, ...clearedProviderErrors(cur) },
                  reason: "provider:created",
                }
              : null,
          );
          if (!next) return 0;
          inst = next;
          continue;
        }
        const target = machine?.externalId as string;
        if (step.call === "start") await session.start(target);
        else if (step.call === "stop") await session.stop(target);
        else await session.delete(target);
      } catch (e) {
        return failed(io, inst, e, session, step.call);
      }
      return later(io, instanceId, session);
    }
    waitingSince.delete(instanceId);
    const next =
      step.kind === "deleted"
        ? await io.write({ actor: "reconciler" }, async (w) => {
            const cur = await lockInstance(w, null, instanceId);
            if (cur.version !== inst.version) return null;
            return markDeleted(w, cur, "deleted", {});
          })
        : await change(io, instanceId, (cur) => (cur.version === inst.version ? { set: step.set, reason: step.reason } : null));
    if (!next) return 0; // someone changed it meanwhile: look again at once
    inst = next;
    if (inst.state === "deleted" || (step.kind === "change" && step.last)) return done(instanceId);
  }
  return later(io, instanceId, session);
}

type Change = { set: Parameters<typeof writeChange>[2]; reason: string };

/**
 * A guarded change: `decide` sees the row under its lock and says what to write, or null to write nothing. The
 * change settles the instance, so its event wakes no other run: the run writing it goes on from it, or ends
 * there after the plan's last step. A second run woken by it looked at the machine again at once, one provider
 * call for nothing, and its wait took the next step of the backoff before the first look was due. A run that
 * dies after the commit is taken again as a stalled job; the sweep catches the rest.
 */
async function change(io: SyncIo, id: string, decide: (cur: Instance) => Change | null): Promise<Instance | null> {
  return io.write({ actor: "reconciler" }, async (w) => {
    const cur = await lockInstance(w, null, id);
    const c = decide(cur);
    if (!c) return null;
    w.settle(id);
    return writeChange(w, cur, c.set, c.reason);
  });
}

/**
 * Run a create holding the instance's create lease, renewed while it runs and given back after. Create adopts
 * a machine labelled with the instance, but a provider without unique names (Proxmox VE) could still get two
 * clones from two runs at once — a job BullMQ took for stalled while it ran, say. Null: another run holds it.
 */
async function withCreateLease<T>(io: SyncIo, id: string, fn: () => Promise<T>): Promise<T | null> {
  const take = (renew: boolean) =>
    io.write({ actor: "reconciler" }, async (w) => {
      const until = new Date(w.now.getTime() + io.createLeaseMs);
      const rows = await w.sql.query(
        `UPDATE instances SET create_lease_until = $2 WHERE id = $1 AND ($3 OR create_lease_until IS NULL OR create_lease_until < $4) RETURNING id`,
        [id, until, renew, w.now],
      );
      return rows.length > 0;
    });
  if (!(await take(false))) return null;
  const renewal = setInterval(() => void take(true).catch(() => {}), Math.max(50, io.createLeaseMs / 3));
  try {
    return await fn();
  } finally {
    clearInterval(renewal);
    await io.write({ actor: "reconciler" }, (w) => w.sql.query(`UPDATE instances SET create_lease_until = NULL WHERE id = $1`, [id]));
  }
}

/** What the reconciler asks the provider to make for an instance (exported for the crash-and-adopt test). */
export async function createRequest(io: Pick<SyncIo, "sealer">, inst: Instance) {
  if (!inst.offer) throw new ProviderError("invalid", "the instance has no provider offer recorded");
  return {
    instanceId: inst.id,
    // A hostname that is the instance's own: the providers' name uniqueness is a second guard against twins.
    name: `bc-${inst.id.slice(5)}`,
    offer: inst.offer,
    image: inst.imageId,
    sshKeys: inst.sshKeys,
    userData: inst.userDataSealed ? io.sealer.open(inst.userDataSealed, inst.id) : null,
    start: inst.desiredState !== "stopped",
  };
}

function done(instanceId: string): null {
  waitingSince.delete(instanceId);
  return null;
}

/** The next look (lookAfter), never sooner than the provider's rate limit or what a refusal asked for. */
function later(io: SyncIo, instanceId: string, session?: ProviderSession, atLeast = 0): number {
  const now = Date.now();
  const since = waitingSince.get(instanceId) ?? now;
  waitingSince.set(instanceId, since);
  return Math.max(lookAfter(now - since, io.poll), atLeast, session?.pace() ?? 0);
}

/**
 * A failed look or call. Transient failures are noted on the instance (once) and tried again after the backoff;
 * the others are conditions that wait for a person — in error, except while deleting, which keeps trying at
 * the sweep's pace, because a machine nobody wants must not be left running on someone's bill.
 */
async function failed(io: SyncIo, inst: Instance, e: unknown, session?: ProviderSession, call?: string): Promise<number | null> {
  if (!isProviderError(e)) throw e;
  const message = call ? `${call}: ${e.message}` : e.message;
  // Transient failures (a rate limit, a busy machine) are routine and retried: they are noted, not warned of.
  (e.kind === "transient" ? io.log.info : io.log.warn)("provider call failed", { instanceId: inst.id, kind: e.kind, code: e.code, err: message });
  const condition = { type: PROVIDER_ERROR, reason: e.kind, message };
  const retried = e.kind === "transient" || inst.desiredState === "deleted";
  await change(io, inst.id, (cur) => {
    if (cur.version !== inst.version) return null;
    const known = cur.conditions.find((c) => c.type === PROVIDER_ERROR);
    const conditions = [...cur.conditions.filter((c) => c.type !== PROVIDER_ERROR), condition];
    if (retried || !canTransition(cur.state, "error")) {
      // Noted once per kind: a retried failure's message varies (a rate limit says how long to wait), and
      // writing each one would be an event, a new version and a wake-up that runs the instance again at once,
      // past the backoff — under a spent rate limit, thousands of writes and no progress.
      return known?.reason === condition.reason ? null : { set: { conditions }, reason: "provider:error" };
    }
    return { set: { state: "error", conditions, retry_requested: false }, reason: "provider:error" };
  });
  return retried ? later(io, inst.id, session, e.retryAfterMs ?? 0) : done(inst.id);
}
