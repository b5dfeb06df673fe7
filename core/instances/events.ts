import { invalid, notFound } from "../../contracts/errors.ts";
import { type Principal, requireRead, visibleTo } from "../auth/principal.ts";
import type { Sql } from "../kernel/db.ts";
import { SQL } from "../kernel/sql.ts";
import { INSTANCE_COLUMNS, type Instance } from "./model.ts";

/**
 * Watching instances: which events a subscriber may see, and reading them from the event table in commit
 * order. The table is the source of truth for live delivery and for resuming; pub/sub only says "look".
 */

/** One committed change, as stored; `position` orders all events in commit order (see the live_positions migration). */
export interface StoredEvent {
  position: bigint;
  instanceId: string;
  tenantId: string;
  poolId: string;
  projectId: string | null;
  fromState: string | null;
  toState: string;
  desiredState: string;
  reason: string;
  actor: string;
  version: number;
  at: Date;
}

/** An event with the instance as it is when delivered. */
export interface WatchedEvent extends StoredEvent {
  instance: Instance;
}

/** What a subscriber sees: every field set must match. `tenantId` is forced for tenants. */
export interface EventFilter {
  tenantId?: string;
  poolId?: string;
  projectId?: string;
  instanceId?: string;
}

export const matches = (f: EventFilter, e: StoredEvent) =>
  (f.tenantId === undefined || f.tenantId === e.tenantId) &&
  (f.poolId === undefined || f.poolId === e.poolId) &&
  (f.projectId === undefined || f.projectId === e.projectId) &&
  (f.instanceId === undefined || f.instanceId === e.instanceId);

/** Cursors are opaque to clients; inside, the event's position. */
export const cursorOf = (position: bigint) => position.toString();
export function parseCursor(cursor: string): bigint {
  if (!/^\d{1,19}$/.test(cursor)) throw invalid("after is not an event cursor", { path: "after" });
  return BigInt(cursor);
}

/**
 * The same rule as for queries: tenants watch their own tenant's instances (with the read scope), operators
 * any pool or all of them, host agents nothing (requireRead refuses them).
 */
export function eventFilter(who: Principal | null, args: { poolId?: string | null; projectId?: string | null }): EventFilter {
  // requireRead also turns node credentials away: they hold no tenant and are not operators.
  const p = requireRead(who, "compute:instances:read");
  return {
    ...(p.operator ? {} : { tenantId: p.tenantId as string }),
    ...(args.poolId ? { poolId: args.poolId } : {}),
    ...(args.projectId ? { projectId: args.projectId } : {}),
  };
}

/** One instance's events: NOT_FOUND unless the caller could read the instance. */
export async function instanceFilter(sql: Sql, who: Principal | null, instanceId: string): Promise<EventFilter> {
  const p = requireRead(who, "compute:instances:read");
  const [row] = await sql.query<{ tenantId: string }>(`SELECT tenant_id AS "tenantId" FROM instances WHERE id = $1`, [instanceId]);
  if (!row || !visibleTo(p, row.tenantId)) throw notFound("instance", instanceId);
  return { instanceId };
}

const EVENT_COLUMNS = SQL`position::text AS position, instance_id AS "instanceId", tenant_id AS "tenantId", pool_id AS "poolId",
  project_id AS "projectId", from_state AS "fromState", to_state AS "toState", desired_state AS "desiredState", reason, actor,
  version, at`;

/** The newest position, or 0 before the first event. */
export async function headPosition(sql: Sql): Promise<bigint> {
  const [row] = await sql.query<{ head: string | null }>(`SELECT max(position)::text AS head FROM instance_events`);
  return BigInt(row?.head ?? 0);
}

/**
 * Events after `after` (and at most `upTo`) that match `filter`, in commit order, with their instances.
 * Unpositioned rows belong to transactions that have not committed yet and are never read.
 */
export async function readEvents(sql: Sql, filter: EventFilter, after: bigint, upTo: bigint | null, limit: number): Promise<WatchedEvent[]> {
  const where = [SQL`position > ${after.toString()}::bigint`];
  if (upTo !== null) where.push(SQL`position <= ${upTo.toString()}`);
  if (filter.tenantId !== undefined) where.push(SQL`tenant_id = ${filter.tenantId}`);
  if (filter.poolId !== undefined) where.push(SQL`pool_id = ${filter.poolId}`);
  if (filter.projectId !== undefined) where.push(SQL`project_id = ${filter.projectId}`);
  if (filter.instanceId !== undefined) where.push(SQL`instance_id = ${filter.instanceId}`);
  const rows = await sql.query<Omit<StoredEvent, "position"> & { position: string }>(
    // Qualified: a bare `position` here would sort by the text alias above ("10" before "9").
    SQL`SELECT ${EVENT_COLUMNS} FROM instance_events WHERE ${SQL.join(where, " AND ")} ORDER BY instance_events.position LIMIT ${limit}`,
  );
  if (!rows.length) return [];
  const ids = [...new Set(rows.map((r) => r.instanceId))];
  const instances = await sql.query<Instance>(`SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = ANY($1::text[])`, [ids]);
  const byId = new Map(instances.map((i) => [i.id, i]));
  // An instance row outlives its events (rows are never deleted while events point at them).
  return rows.map((r) => ({ ...r, position: BigInt(r.position), instance: byId.get(r.instanceId) as Instance }));
}
