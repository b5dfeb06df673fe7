import type { InstanceEventMessage } from "../../contracts/channels.ts";
import { notFound } from "../../contracts/errors.ts";
import { type Principal, visibleTo } from "../auth/principal.ts";
import type { Statement } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import { sameSpecView, specNodes, specsBumpedSql } from "../pools/hosted/generations.ts";
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
export const instanceLockStatement = (id: string): Statement => ({ text: `SELECT id FROM instances WHERE id = $1 FOR UPDATE`, params: [id] });

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

/** Columns whose change alters the instance's part of its node's spec. */
const SPEC_FIELDS: readonly (keyof typeof settable)[] = [
  "node_id",
  "allocation_id",
  "vcpus",
  "memory_mib",
  "disk_gib",
  "gpus",
  "addresses",
  "env",
  "network_policy",
];

/** The WITH part of writeChange's statement that holds the changed row: statements riding in it may read it. */
export const CHANGED_ROW = "i";

/**
 * Apply one change to a locked instance: `version` goes up by one and the change's event is written with it.
 * `last`: the change is the write's last statement, and carries what that statement owes (the deferred
 * statements, which may read the changed row as CHANGED_ROW, and the audit row) and, where the database can,
 * the COMMIT: a request or report that ends in a change waits one round trip less.
 */
export async function writeChange(w: Write, inst: Instance, set: InstanceSet, reason: string, opts: { last?: boolean } = {}): Promise<Instance> {
  const change = changeStatement(w, inst, set, reason, opts);
  const run = opts.last && w.sql.commitWith ? w.sql.commitWith.bind(w.sql) : w.sql.query.bind(w.sql);
  const applied = change.applied(await run<ChangedRow>(change.text, change.params));
  if (!applied) throw notFound("instance", inst.id);
  return applied;
}

type ChangedRow = Instance & { eventId: string; specs: { nodeId: string; generation: number }[] | null };

/**
 * writeChange's statement, for a caller that sends it itself (with others, in one message: Sql.commitBatch),
 * and `applied` for its rows once sent: the changed instance, recorded on the Write, or null if it changed
 * nothing. `guard`: a condition on the row (as `instances`) that must hold for the change to be made, for a
 * caller that has not locked and read it first and so builds `inst` from what the guard makes sure of;
 * `computed`: columns set by SQL expressions (over the row as it was), beside `set`'s values; `parts`: more
 * WITH parts the statement carries (after the change and its event, so they may read CHANGED_ROW). The
 * write's closing parts (`last`) run whether or not the guard holds: a guarded change's audit row, if it owes
 * one, is the caller's to make conditional (Write.auditInStatement, in `parts`). `rowNode`: the instance stays
 * on the node its row names, which the caller has not read (its `inst.nodeId` says nothing): the generation of
 * that node moves, if the change needs it to, only where the guard holds. Such a caller must hold the row
 * locked by an earlier statement of its transaction (instanceLockStatement), so that the node's row is still
 * taken after it, in the one lock order.
 */
export function changeStatement(
  w: Write,
  inst: Pick<Instance, "id" | "state" | "desiredState" | "nodeId">,
  set: InstanceSet,
  reason: string,
  opts: {
    last?: boolean;
    guard?: (add: (v: unknown) => string) => string;
    computed?: Partial<Record<keyof typeof settable, (add: (v: unknown) => string) => string>>;
    parts?: (add: (v: unknown) => string) => string[];
    rowNode?: boolean;
  } = {},
): { text: string; params: unknown[]; applied(rows: ChangedRow[]): Instance | null } {
  if (opts.rowNode && "node_id" in set) throw new Error("a change that moves an instance to a node must know the node it leaves");
  const to = (set.state as InstanceState | undefined) ?? inst.state;
  if (to !== inst.state) assertTransition(inst.state, to);
  // The nodes it leaves and joins get a new spec generation in this same transaction; a host report is
  // stale for this instance until it echoes at least the generation of its node after this change.
  const nextNode = "node_id" in set ? (set.node_id as string | null) : inst.nodeId;
  const nextDesired = (set.desired_state as DesiredState | undefined) ?? inst.desiredState;
  // A step that leaves what the host is told unchanged (provisioning → starting → running on the host's own
  // report) keeps the generation, so the report that caused it still counts and the next step follows
  // without another round trip through the agent. Anything else the host must see, and confirm, anew.
  const neutral = nextNode === inst.nodeId && !SPEC_FIELDS.some((f) => f in set) && sameSpecView(inst.state, inst.desiredState, to, nextDesired);
  // What the old host saw says nothing about the new one (and generations are per node).
  if (nextNode !== inst.nodeId) set = { ...set, observed_state: null, observed_error: null, observed_generation: -1 };
  const params: unknown[] = [inst.id, w.now, inst.state, reason, w.actor];
  const add = (v: unknown) => `$${params.push(v)}`;
  const guard = opts.guard ? ` AND (${opts.guard(add)})` : "";
  const assignments = Object.entries(set).map(([col, value]) => {
    const type = settable[col as keyof typeof settable];
    return `${col} = ${add(type === "jsonb" ? JSON.stringify(value) : value)}::${type}`;
  });
  for (const [col, expr] of Object.entries(opts.computed ?? {})) assignments.push(`${col} = ${(expr as (a: typeof add) => string)(add)}`);
  // The generations move in the same statement (specsBumpedSql): the instance row is locked already, so the
  // node rows are still taken after it, in the one lock order.
  const nodes = neutral ? [] : specNodes([inst.nodeId, nextNode]);
  // The generations' statement would run whether or not the guard held, unless it reads the node from the row.
  if (opts.guard && nodes.length && !opts.rowNode) throw new Error(`a guarded change must leave the host's spec as it is (${inst.state} → ${to})`);
  const bumped = neutral
    ? null
    : opts.rowNode
      ? specsBumpedSql(`ARRAY(SELECT node_id FROM instances WHERE id = $1 AND node_id IS NOT NULL${guard})`)
      : nodes.length
        ? specsBumpedSql(add(nodes))
        : null;
  if (bumped)
    assignments.push(
      `spec_generation = COALESCE((SELECT generation FROM g WHERE "nodeId" = ${opts.rowNode ? "instances.node_id" : `${add(nextNode)}::text`}), spec_generation)`,
    );
  const extra = opts.parts?.(add) ?? [];
  const closing = opts.last ? w.closingParts(add) : [];
  const text = `WITH ${bumped ? `g AS (${bumped}),` : ""}
     ${CHANGED_ROW} AS (
       UPDATE instances SET ${[...assignments, "version = version + 1", "updated_at = $2"].join(", ")} WHERE id = $1${guard} RETURNING *),
     e AS (
       INSERT INTO instance_events (instance_id, tenant_id, pool_id, project_id, from_state, to_state, desired_state, reason, actor, version, at)
       SELECT id, tenant_id, pool_id, project_id, $3, state, desired_state, $4, $5, version, $2 FROM ${CHANGED_ROW} RETURNING id)
     ${[...extra, ...closing].map((part) => `, ${part}`).join("")}
     SELECT ${INSTANCE_COLUMNS}, (SELECT id::text FROM e) AS "eventId",
            ${bumped ? `(SELECT json_agg(json_build_object('nodeId', "nodeId", 'generation', generation)) FROM g)` : "NULL"} AS specs FROM ${CHANGED_ROW}`;
  return {
    text,
    params,
    applied(rows) {
      const [row] = rows;
      if (!row) return null;
      const { eventId, specs, ...instance } = row;
      for (const s of specs ?? []) w.spec(s.nodeId, s.generation);
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
