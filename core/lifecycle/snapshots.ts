import { AppError, notFound } from "../../contracts/errors.ts";
import type { Principal } from "../auth/principal.ts";
import { lockInstance } from "../instances/changes.ts";
import type { Instance } from "../instances/model.ts";
import { one, type Sql } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import type { DriverWith } from "../pools/driver.ts";
import { requirePool } from "../pools/pools.ts";
import { requireCapability } from "../pools/registry.ts";

/**
 * Snapshots and restores of an instance's memory and disk: a request records the snapshot's row and asks the
 * pool's driver, which has the instance's host do it (a host command, core/commands/snapshot.ts, which also
 * settles the host's answer into the row). Each request and each outcome is an instance event, so watchers see
 * them on the instance's timeline.
 */

export type SnapshotState = "creating" | "ready" | "failed" | "deleted";

export interface Snapshot {
  id: string;
  instanceId: string;
  tenantId: string;
  nodeId: string;
  state: SnapshotState;
  sizeBytes: number | null;
  error: string | null;
  createdAt: Date;
  readyAt: Date | null;
}

const COLUMNS = `id, instance_id AS "instanceId", tenant_id AS "tenantId", node_id AS "nodeId", state, size_bytes::float8 AS "sizeBytes", error,
  created_at AS "createdAt", ready_at AS "readyAt"`;

export interface CommandDeps {
  /** How long a host has to finish a snapshot or restore before it is given up. */
  timeoutMs: number;
}

/** An instance that can take a snapshot or restore now: on a host of ours that is there, running or paused; with its pool's driver. */
async function lockForCommand(
  w: Write,
  who: Principal,
  id: string,
  what: string,
): Promise<{ inst: Instance & { nodeId: string }; driver: DriverWith<"snapshot"> }> {
  const inst = await lockInstance(w, who, id);
  const driver = requireCapability(await requirePool(w.sql, inst.poolId), "snapshot", what);
  if (!["running", "paused"].includes(inst.state) || !["running", "paused"].includes(inst.desiredState) || !inst.nodeId)
    throw new AppError("PRECONDITION_FAILED", `${what} needs a running or paused instance; ${id} is ${inst.state} (desired ${inst.desiredState})`, {
      state: inst.state,
    });
  const node = await one<{ away: boolean }>(w.sql, `SELECT lost_at IS NOT NULL OR gone_at IS NOT NULL AS away FROM nodes WHERE id = $1`, [inst.nodeId]);
  if (node?.away) throw new AppError("PRECONDITION_FAILED", `${what}: the host of ${id} is not reporting`);
  return { inst: inst as Instance & { nodeId: string }, driver };
}

export async function snapshotInstance(w: Write, who: Principal, id: string, deps: CommandDeps): Promise<Snapshot> {
  const { inst, driver } = await lockForCommand(w, who, id, "a snapshot");
  const snapshotId = w.ids("snap");
  const cmd = await driver.snapshot(w, inst, snapshotId, deps.timeoutMs);
  const [snap] = await w.sql.query<Snapshot>(
    `INSERT INTO instance_snapshots (id, instance_id, tenant_id, node_id, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING ${COLUMNS}`,
    [snapshotId, inst.id, inst.tenantId, inst.nodeId, w.now],
  );
  w.audit({ targetId: snapshotId, tenantId: inst.tenantId, details: { instanceId: inst.id, nodeId: inst.nodeId, command: cmd.commandId } });
  return snap as Snapshot;
}

export async function restoreInstance(w: Write, who: Principal, id: string, snapshotId: string, deps: CommandDeps): Promise<Instance> {
  const { inst, driver } = await lockForCommand(w, who, id, "a restore");
  const snap = await one<Snapshot>(w.sql, `SELECT ${COLUMNS} FROM instance_snapshots WHERE id = $1 AND instance_id = $2`, [snapshotId, inst.id]);
  if (!snap) throw notFound("snapshot", `${snapshotId} of instance ${id}`);
  if (snap.state !== "ready") throw new AppError("PRECONDITION_FAILED", `snapshot ${snapshotId} is ${snap.state}, not ready`, { state: snap.state });
  // The snapshot's files are on the host that took it; an instance recreated elsewhere cannot go back to it.
  if (snap.nodeId !== inst.nodeId)
    throw new AppError("PRECONDITION_FAILED", `snapshot ${snapshotId} is on node ${snap.nodeId}; instance ${id} now runs on ${inst.nodeId}`);
  const cmd = await driver.restore(w, inst, snapshotId, deps.timeoutMs);
  w.audit({ targetId: inst.id, tenantId: inst.tenantId, details: { snapshotId, command: cmd.commandId } });
  return cmd.instance;
}

export async function listSnapshots(sql: Sql, instanceId: string): Promise<Snapshot[]> {
  return sql.query<Snapshot>(`SELECT ${COLUMNS} FROM instance_snapshots WHERE instance_id = $1 ORDER BY created_at, id`, [instanceId]);
}

export async function getSnapshot(sql: Sql, id: string): Promise<Snapshot | undefined> {
  return one<Snapshot>(sql, `SELECT ${COLUMNS} FROM instance_snapshots WHERE id = $1`, [id]);
}
