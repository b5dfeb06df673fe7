import type { Principal } from "../auth/principal.ts";
import { CHANGED_ROW, changeStatement, instanceLockStatement } from "../instances/changes.ts";
import type { Instance } from "../instances/model.ts";
import type { DesiredState } from "../instances/state.ts";
import type { Sql } from "../kernel/db.ts";
import { SQL } from "../kernel/sql.ts";
import { ContendedWrite, type Write } from "../kernel/write.ts";
import type { DriverWith } from "../pools/driver.ts";
import { driversWith } from "../pools/registry.ts";

/**
 * An owner's pause of a running instance, or resume of a paused one, in one message to the database: the
 * request setDesiredState makes most often, and the one a caller waiting for the guest to stop or go on waits
 * on, with the host's answer after it (core/commands/power.ts takes that answer in one message too).
 *
 * setDesiredState reads the instance under its lock, decides, then writes: two round trips. This sends the
 * lock and a change built ahead for the case it expects, guarded on everything setDesiredState would have
 * checked after reading (the caller's tenant, no sandbox or warm pool holding it, on a host, in the move's start
 * state with its owner wanting that too, and for a pause a pool whose class can pause), with what the class's
 * driver does for the move (hosted: the host's command, as a part of the statement), the audit row and the
 * event, then COMMIT. Where a guard does not hold (an instance stopped, in
 * error, another tenant's, already asked), the message committed nothing but the lock, and the write runs
 * again the general way (a ContendedWrite on the first attempt only): one round trip more for those.
 */
const MOVES: Partial<Record<DesiredState, { from: "running" | "paused"; to: "paused" | "running"; classGuard: boolean }>> = {
  paused: { from: "running", to: "paused", classGuard: true },
  // Resuming needs nothing of the pool's class that an instance paused on a host has not shown already.
  running: { from: "paused", to: "running", classGuard: false },
};

/**
 * The driver whose part the statement carries, before it has read the pool: the one class that can pause (an
 * instance paused is of a class that paused it). With several, the general path, which reads the pool, decides.
 */
function pausingDriver(): DriverWith<"pause"> | null {
  const able = driversWith("pause");
  return able.length === 1 ? (able[0] as DriverWith<"pause">) : null;
}

/** Whether this request may try the one message: a tenant's own, on its first attempt, on PostgreSQL. */
export function powerInOneMessage(w: Write, who: Principal, desired: DesiredState): boolean {
  return (
    w.attempt === 1 && !who.operator && who.tenantId !== null && MOVES[desired] !== undefined && w.sql.commitBatch !== undefined && pausingDriver() !== null
  );
}

export async function requestPower(w: Write, who: Principal, id: string, desired: DesiredState): Promise<Instance> {
  const { change, acted, move } = powerRequestChange(w, who, id, desired);
  const commit = w.sql.commitBatch as NonNullable<Sql["commitBatch"]>;
  const [, rows] = (await commit([instanceLockStatement(id), change.statement])) as [unknown[], Parameters<typeof change.applied>[0]];
  const inst = change.applied(rows);
  if (!inst)
    throw new ContendedWrite(`${id} is not where a ${move.to === "paused" ? "pause" : "resume"} starts from: the request runs again the general way`, {
      guess: true,
    });
  acted.queued(inst);
  // Nothing for a reconcile pass to do until the host answers, and its answer wakes the instance.
  w.settle(inst.id);
  return inst;
}

/** requestPower's change, built ahead for the move and guarded (see above), and what the driver does for it. */
export function powerRequestChange(w: Write, who: Principal, id: string, desired: DesiredState) {
  const move = MOVES[desired] as NonNullable<(typeof MOVES)[DesiredState]>;
  const driver = pausingDriver() as DriverWith<"pause">;
  const classes = move.classGuard ? [driver.poolClass] : [];
  // What the driver does for the move names the spec generation the change gives the instance, which only the statement knows.
  const acted = driver.power.inStatement(w, id, move.to, CHANGED_ROW);
  const change = changeStatement(w, { id, state: move.from, desiredState: move.from, nodeId: null }, { desired_state: desired }, `requested:${desired}`, {
    last: true,
    rowNode: true,
    guard: () =>
      SQL`tenant_id = ${who.tenantId} AND state = ${move.from} AND desired_state = ${move.from} AND node_id IS NOT NULL
         AND sandbox_id IS NULL AND warm_template_id IS NULL
         ${classes.length ? SQL`AND (SELECT p.class FROM pools p WHERE p.id = instances.pool_id) = ANY(${classes}::text[])` : SQL.empty}`,
    parts: () => {
      const audit = w.auditInStatement({ targetId: id, tenantId: who.tenantId }, SQL`jsonb_build_object('desired', ${desired}::text)`, CHANGED_ROW);
      return [acted.part, ...(audit ? [SQL`audited AS (${audit})`] : [])];
    },
  });
  return { change, acted, move };
}
