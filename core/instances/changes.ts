import type { InstanceEventMessage } from "../../contracts/channels.ts";
import { notFound } from "../../contracts/errors.ts";
import { type Principal, visibleTo } from "../auth/principal.ts";
import type { Statement } from "../kernel/db.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import type { Write } from "../kernel/write.ts";
import { releaseQuota } from "../tenancy/quota.ts";
import { INSTANCE_COLUMNS, type Instance } from "./model.ts";
import { assertTransition, type DesiredState, type InstanceState } from "./state.ts";

/**
 * The one way an instance row changes: `writeChange` moves `state` only along the state table, bumps
 * `version`, writes the change's one event in the same statement and records it on the Write, which
 * publishes it and wakes the reconciler once committed.
 */

/** Lock an instance row for the rest of the transaction, as the caller may see it. */
export async function lockInstance(w: Write, who: Principal | null, id: string): Promise<Instance> {
  const [inst] = await w.sql.query<Instance>(`SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = $1 FOR UPDATE`, [id]);
  if (!inst || (who && !visibleTo(who, inst.tenantId))) throw notFound("instance", id);
  return inst;
}

/** Lock an instance row, reading nothing: for a statement that follows it in the same message (changeStatement's `rowNode`). */
export const instanceLockStatement = (id: string): Statement => SQL`SELECT id FROM instances WHERE id = ${id} FOR UPDATE`;

/** Columns a change may set, and how each is bound (jsonb values are sent as JSON text). */
const settable = {
  state: "text",
  desired_state: "text",
  flavor: "text",
  vcpus: "int",
  memory_mib: "int",
  disk_gib: "int",
  gpus: "jsonb",
  charge: "jsonb",
  charge_released: "boolean",
  allocation_id: "text",
  node_id: "text",
  external_id: "text",
  addresses: "text[]",
  conditions: "jsonb",
  attempts: "int",
  excluded_nodes: "text[]",
  retry_requested: "boolean",
  spec_generation: "int",
  observed_state: "text",
  observed_error: "text",
  observed_generation: "int",
  observed_at: "timestamptz",
  sandbox_id: "text",
  claimed_at: "timestamptz",
  owner_identity_id: "text",
  env: "jsonb",
  network_policy: "jsonb",
} as const;
export type InstanceSet = Partial<Record<keyof typeof settable, unknown>>;

/** What a change's statement binds once for all its parts: the instance's id and the write's time. */
export interface ChangeKeys {
  id: Fragment;
  at: Fragment;
}

/** A change as a ChangeHook sees it, as its statement is built. */
export interface ChangeView extends ChangeKeys {
  /** The row as the caller knows it (a guarded change's caller has not read it: see changeStatement). */
  inst: Pick<Instance, "id" | "state" | "desiredState" | "nodeId">;
  set: InstanceSet;
  /** Where the change leaves the row: its state, desired state and node. */
  to: InstanceState;
  desired: DesiredState;
  nodeId: string | null;
  /** The change's guard, as SQL to append to a condition on the `instances` row (`` AND (…)``), or null for none. */
  guard: Fragment | null;
  /** changeStatement's `rowNode`: the row's node is the one it names, which the caller has not read. */
  rowNode: boolean;
}

/** What a ChangeHook adds to a change's one statement. */
export interface ChangeParts {
  /**
   * WITH parts that run before the instance's UPDATE, which holds the row locked already, so rows they lock are
   * taken after it, in the one lock order. Names other than `i`, `e` and the caller's parts.
   */
  before: Fragment[];
  /** More assignments of the UPDATE (they may read the parts before it). */
  assignments: Fragment[];
  /** An SQL expression returned with the changed row (over the parts before it); `applied` gets its value. */
  returned: Fragment;
  /** Once the statement has run and changed the row: record on the Write what the parts did. */
  applied(w: Write, value: unknown): void;
}

/**
 * What a pool class adds to every instance change, in the change's own statement: not a statement or a round
 * trip of its own, on the platform's hottest path (hosted pools: the spec generations of the nodes the change
 * concerns, core/pools/hosted/generations.ts). Pool drivers bring theirs (PoolDriver.changeHook) and the registry
 * sets them here when the drivers are registered: instances know no pool class.
 */
export interface ChangeHook {
  parts(change: ChangeView): ChangeParts | null;
}

/** Set with the pool drivers (core/pools/registry.ts); undefined until then, which no change may run without. */
let hooks: readonly ChangeHook[] | undefined;

export function setChangeHooks(list: readonly ChangeHook[]): void {
  hooks = list;
}

/** The WITH part of writeChange's statement that holds the changed row: statements riding in it may read it. */
export const CHANGED_ROW = SQL.ident("i");

/**
 * Apply one change to a locked instance: `version` goes up by one and the change's event is written with it.
 * `last`: the change is the write's last statement, and carries what that statement owes (the deferred
 * statements, which may read the changed row as CHANGED_ROW, and the audit row) and, where the database can,
 * the COMMIT: a request or report that ends in a change waits one round trip less.
 */
export async function writeChange(w: Write, inst: Instance, set: InstanceSet, reason: string, opts: { last?: boolean } = {}): Promise<Instance> {
  const change = changeStatement(w, inst, set, reason, opts);
  const run = opts.last && w.sql.commitWith ? w.sql.commitWith.bind(w.sql) : w.sql.query.bind(w.sql);
  const applied = change.applied(await run<ChangedRow>(change.statement));
  if (!applied) throw notFound("instance", inst.id);
  return applied;
}

/** `hooked`: what each ChangeHook's part returned, in order (null when none took part). */
type ChangedRow = Instance & { eventId: string; hooked: unknown[] | null };

/**
 * writeChange's statement, for a caller that sends it itself (with others, in one message: Sql.commitBatch),
 * and `applied` for its rows once sent: the changed instance, recorded on the Write, or null if it changed
 * nothing. `guard`: a condition on the row (as `instances`) that must hold for the change to be made, for a
 * caller that has not locked and read it first and so builds `inst` from what the guard makes sure of;
 * `computed`: columns set by SQL expressions (over the row as it was), beside `set`'s values; `parts`: more
 * WITH parts the statement carries (after the change and its event, so they may read CHANGED_ROW). The
 * write's closing parts (`last`) run whether or not the guard holds: a guarded change's audit row, if it owes
 * one, is the caller's to make conditional (Write.auditInStatement, in `parts`). `rowNode`: the instance stays
 * on the node its row names, which the caller has not read (its `inst.nodeId` says nothing): what the hooks do
 * for that node (hosted pools: its spec generation) is done only where the guard holds. Such a caller must hold the row
 * locked by an earlier statement of its transaction (instanceLockStatement), so that the node's row is still
 * taken after it, in the one lock order. `guard`, `computed` and `parts` are given the statement's ChangeKeys.
 */
export function changeStatement(
  w: Write,
  inst: Pick<Instance, "id" | "state" | "desiredState" | "nodeId">,
  set: InstanceSet,
  reason: string,
  opts: {
    last?: boolean;
    guard?: (keys: ChangeKeys) => Fragment;
    computed?: Partial<Record<keyof typeof settable, (keys: ChangeKeys) => Fragment>>;
    parts?: (keys: ChangeKeys) => Fragment[];
    rowNode?: boolean;
  } = {},
): { statement: Fragment; applied(rows: ChangedRow[]): Instance | null } {
  if (opts.rowNode && "node_id" in set) throw new Error("a change that moves an instance to a node must know the node it leaves");
  if (!hooks) throw new Error("instance changes need the pool drivers' hooks: the process must register its drivers first (core/drivers.ts)");
  const to = (set.state as InstanceState | undefined) ?? inst.state;
  if (to !== inst.state) assertTransition(inst.state, to);
  const asked = set;
  const nextNode = "node_id" in set ? (set.node_id as string | null) : inst.nodeId;
  // What the old host saw says nothing about the new one (and generations are per node).
  if (nextNode !== inst.nodeId) set = { ...set, observed_state: null, observed_error: null, observed_generation: -1 };
  const keys: ChangeKeys = { id: SQL.param(inst.id), at: SQL.param(w.now) };
  const guard = opts.guard ? SQL` AND (${opts.guard(keys)})` : null;
  // What the pool classes add (hosted: the nodes' spec generations), in this statement, before the UPDATE.
  const nextDesired = (set.desired_state as DesiredState | undefined) ?? inst.desiredState;
  const view: ChangeView = { ...keys, inst, set: asked, to, desired: nextDesired, nodeId: nextNode, guard, rowNode: opts.rowNode ?? false };
  const hooked = hooks.flatMap((h) => h.parts(view) ?? []);
  const statement = changeSql(w, inst.state, reason, keys, {
    assignments: [...assignmentsOf(set, opts.computed ?? {}, keys), ...hooked.flatMap((p) => p.assignments)],
    guard,
    hooked,
    parts: [...(opts.parts?.(keys) ?? []), ...(opts.last ? w.closingParts() : [])],
  });
  return {
    statement,
    applied(rows) {
      const [row] = rows;
      if (!row) return null;
      const { eventId, hooked: returned, ...instance } = row;
      for (const [k, p] of hooked.entries()) p.applied(w, returned?.[k] ?? null);
      w.event(eventMessage(instance, inst.state, eventId), {
        desiredState: instance.desiredState,
        reason,
        actor: w.actor,
        at: w.now,
        instance: { ...instance },
      });
      return instance;
    },
  };
}

/** The UPDATE's assignments of `set`'s values and of `computed`'s expressions. */
function assignmentsOf(set: InstanceSet, computed: Partial<Record<keyof typeof settable, (keys: ChangeKeys) => Fragment>>, keys: ChangeKeys): Fragment[] {
  const assignments = Object.entries(set).map(([col, value]) => {
    const type = settable[col as keyof typeof settable];
    if (!type) throw new Error(`${col} is not a column a change may set`);
    return SQL`${SQL.ident(col)} = ${type === "jsonb" ? JSON.stringify(value) : value}::${SQL.raw(type)}`;
  });
  for (const [col, expr] of Object.entries(computed)) assignments.push(SQL`${SQL.ident(col)} = ${(expr as (k: ChangeKeys) => Fragment)(keys)}`);
  return assignments;
}

const COLUMNS = SQL.raw(INSTANCE_COLUMNS);

/**
 * The change's statement: the hooks' parts, the UPDATE, its event, then `parts` (the caller's, then the write's
 * closing ones), returning the changed row with what each hook's part returned.
 */
function changeSql(
  w: Write,
  from: InstanceState,
  reason: string,
  { id, at }: ChangeKeys,
  c: { assignments: Fragment[]; guard: Fragment | null; hooked: ChangeParts[]; parts: Fragment[] },
): Fragment {
  const before = c.hooked.flatMap((p) => p.before.map((part) => SQL`${part},`));
  const sets = SQL.join([...c.assignments, SQL`version = version + 1`, SQL`updated_at = ${at}`]);
  const after = SQL.join(
    c.parts.map((part) => SQL`, ${part}`),
    "",
  );
  const returned = c.hooked.length ? SQL`json_build_array(${SQL.join(c.hooked.map((p) => p.returned))})` : SQL`NULL`;
  return SQL`WITH ${SQL.join(before, "")}
     ${CHANGED_ROW} AS (
       UPDATE instances SET ${sets} WHERE id = ${id}${c.guard ?? SQL.empty} RETURNING *),
     e AS (
       INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at)
       SELECT id, tenant_id, pool_id, project_id, ${from}, state, desired_state, ${reason}, ${w.actor}, version, ${at} FROM ${CHANGED_ROW} RETURNING id)
     ${after}
     SELECT ${COLUMNS}, (SELECT id::text FROM e) AS "eventId",
            ${returned} AS hooked FROM ${CHANGED_ROW}`;
}

/**
 * The bus message for a change. `cursor` holds the event row's id until, once the write has committed, the
 * sequencer gives the event its position (positionEvents in core/kernel/write.ts).
 */
export function eventMessage(inst: Instance, from: string | null, eventId: string): InstanceEventMessage {
  return {
    cursor: eventId,
    instanceId: inst.id,
    tenantId: inst.tenantId,
    poolId: inst.poolId,
    projectId: inst.projectId,
    fromState: from,
    toState: inst.state,
    version: inst.version,
  };
}

/**
 * Reaching `deleted`: what the pool's driver gave back (`released`) and the quota charge, once. Safe to call
 * for an instance whose charge was already released: `charge_released` guards it under the row lock.
 */
export async function markDeleted(w: Write, inst: Instance, reason: string, released: InstanceSet): Promise<Instance> {
  if (!inst.chargeReleased) await releaseQuota(w.sql, inst.tenantId, inst.charge);
  return writeChange(w, inst, { ...released, state: "deleted", charge_released: true }, reason);
}
