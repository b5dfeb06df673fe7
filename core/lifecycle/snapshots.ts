import { AppError, notFound } from "../../contracts/errors.ts";
import { type CommandReport, type HostCommandKind, snapshotResult } from "../../contracts/host.ts";
import type { Principal } from "../auth/principal.ts";
import {
  commandReportStatement,
  enqueueCommand,
  FINAL_STATES,
  type HostCommandRow,
  recordCommandReport,
  settleCommand,
  unsettledCommands,
} from "../commands/commands.ts";
import { lockInstance, writeChange } from "../instances/changes.ts";
import type { Instance } from "../instances/model.ts";
import { batch, one, type Sql } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import { requirePool } from "../pools/pools.ts";
import { requireCapability } from "../pools/registry.ts";
import { commandInstanceLock, POWER_MOVES, settlePowerReport, settlesInOneMessage } from "./power-reports.ts";

/**
 * Snapshots and restores of an instance's memory and disk: requests record a host command for the instance's
 * node (nothing in the request calls the host); the reconciler settles what the host reported. Each request
 * and each outcome is an instance event, so watchers see them on the instance's timeline.
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

/** An instance that can take a snapshot or restore now: on a host of ours that is there, running or paused. */
async function lockForCommand(w: Write, who: Principal, id: string, what: string): Promise<Instance & { nodeId: string }> {
  const inst = await lockInstance(w, who, id);
  requireCapability(await requirePool(w.sql, inst.poolId), "snapshot", what);
  if (!["running", "paused"].includes(inst.state) || !["running", "paused"].includes(inst.desiredState) || !inst.nodeId)
    throw new AppError("PRECONDITION_FAILED", `${what} needs a running or paused instance; ${id} is ${inst.state} (desired ${inst.desiredState})`, {
      state: inst.state,
    });
  const node = await one<{ away: boolean }>(w.sql, `SELECT lost_at IS NOT NULL OR gone_at IS NOT NULL AS away FROM nodes WHERE id = $1`, [inst.nodeId]);
  if (node?.away) throw new AppError("PRECONDITION_FAILED", `${what}: the host of ${id} is not reporting`);
  return inst as Instance & { nodeId: string };
}

/** One command at a time per instance: a snapshot and a restore racing on one host could not both be right. */
async function requireIdle(w: Write, inst: Instance, what: string): Promise<void> {
  const busy = await one<{ kind: string }>(
    w.sql,
    `SELECT kind FROM host_commands WHERE instance_id = $1 AND settled_at IS NULL AND kind IN ('instance.snapshot', 'instance.restore') LIMIT 1`,
    [inst.id],
  );
  if (busy) throw new AppError("PRECONDITION_FAILED", `${what}: an ${busy.kind} of ${inst.id} is still in progress`);
}

export async function snapshotInstance(w: Write, who: Principal, id: string, deps: CommandDeps): Promise<Snapshot> {
  const inst = await lockForCommand(w, who, id, "a snapshot");
  await requireIdle(w, inst, "a snapshot");
  const snapshotId = w.ids("snap");
  const [snap] = await w.sql.query<Snapshot>(
    `INSERT INTO instance_snapshots (id, instance_id, tenant_id, node_id, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING ${COLUMNS}`,
    [snapshotId, inst.id, inst.tenantId, inst.nodeId, w.now],
  );
  const cmd = await request(w, inst, "instance.snapshot", snapshotId, deps);
  w.audit({ targetId: snapshotId, tenantId: inst.tenantId, details: { instanceId: inst.id, nodeId: inst.nodeId, command: cmd.id } });
  return snap as Snapshot;
}

export async function restoreInstance(w: Write, who: Principal, id: string, snapshotId: string, deps: CommandDeps): Promise<Instance> {
  const inst = await lockForCommand(w, who, id, "a restore");
  const snap = await one<Snapshot>(w.sql, `SELECT ${COLUMNS} FROM instance_snapshots WHERE id = $1 AND instance_id = $2`, [snapshotId, inst.id]);
  if (!snap) throw notFound("snapshot", `${snapshotId} of instance ${id}`);
  if (snap.state !== "ready") throw new AppError("PRECONDITION_FAILED", `snapshot ${snapshotId} is ${snap.state}, not ready`, { state: snap.state });
  // The snapshot's files are on the host that took it; an instance recreated elsewhere cannot go back to it.
  if (snap.nodeId !== inst.nodeId)
    throw new AppError("PRECONDITION_FAILED", `snapshot ${snapshotId} is on node ${snap.nodeId}; instance ${id} now runs on ${inst.nodeId}`);
  await requireIdle(w, inst, "a restore");
  const cmd = await request(w, inst, "instance.restore", snapshotId, deps);
  w.audit({ targetId: inst.id, tenantId: inst.tenantId, details: { snapshotId, command: cmd.id } });
  return cmd.instance;
}

/** The host command for the instance's node, and the instance event that says it was asked for. */
async function request(w: Write, inst: Instance & { nodeId: string }, kind: HostCommandKind, snapshotId: string, deps: CommandDeps) {
  const cmd = await enqueueCommand(w, { nodeId: inst.nodeId, instanceId: inst.id, kind, args: { instanceId: inst.id, snapshotId }, timeoutMs: deps.timeoutMs });
  const instance = await writeChange(w, inst, {}, `requested:${kind === "instance.snapshot" ? "snapshot" : "restore"}`);
  return { id: cmd.id, instance };
}

/**
 * Apply what the host did with the instance's commands, one per call (the reconciler loops): a finished
 * snapshot becomes ready or failed, a restore is recorded, a command past its deadline is given up. For an
 * instance that is gone, unfinished commands are cancelled and its snapshots go with it (their files were
 * removed with the domain). Returns the instance when it changed.
 */
export async function settleCommands(w: Write, inst: Instance, pending?: HostCommandRow[]): Promise<Instance | null> {
  // `pending`: the instance's unsettled commands as its pass read them once (the pass holds the instance, and
  // every writer that finishes a command locks it first); what is settled here leaves the list.
  const left = pending ?? (await unsettledCommands(w, inst.id));
  if (inst.state === "deleted") {
    for (const c of left.splice(0)) await settleCommand(w, c.id, FINAL_STATES.includes(c.state) ? undefined : "cancelled");
    await w.sql.query(`UPDATE instance_snapshots SET state = 'deleted' WHERE instance_id = $1 AND state <> 'deleted'`, [inst.id]);
    return null;
  }
  for (const c of [...left]) {
    const expired = !FINAL_STATES.includes(c.state) && c.deadline <= w.now;
    if (!FINAL_STATES.includes(c.state) && !expired) continue;
    left.splice(left.indexOf(c), 1);
    await settleCommand(w, c.id, expired ? "expired" : undefined);
    const changed = await applyOutcome(w, inst, c, expired);
    if (changed) return changed;
  }
  return null;
}

/**
 * The host's answer to a pause or resume is also its word on the domain: paused (or running) as of the spec
 * generation the command came with (args.generation), which the host's converger holds the instance at. Kept
 * as the instance's observation, the status report that follows and says the same is no news: no write, no
 * reconcile pass, nothing competing with the next request. A command without a generation (an older server
 * sent it), or one older than what the host reported since, leaves the observation to the reports.
 */
function powerObservation(w: Write, inst: Instance, c: HostCommandRow, to: "running" | "paused") {
  const generation = c.args.generation;
  if (typeof generation !== "number" || generation < inst.observedGeneration) return {};
  return { observed_state: to, observed_error: null, observed_generation: generation, observed_at: w.now };
}

/**
 * What one settled command does to its instance (null: nothing, and the next command is looked at). `last`: the
 * caller's write ends with it, and a change goes as the write's last statement (writeChange's `last`).
 */
async function applyOutcome(w: Write, inst: Instance, c: HostCommandRow, expired: boolean, last = false): Promise<Instance | null> {
  // An exec changes nothing of the instance: its watchers have its output and its end.
  if (c.kind === "instance.exec") return null;
  // A pause or resume the host did: the instance is where it was asked to be (its next report says so too).
  // One that failed is left to the spec, which asks for the same and is converged and reported as usual.
  const power = POWER_MOVES[c.kind];
  if (power) {
    if (c.state !== "succeeded" || inst.state !== power.from || inst.desiredState !== power.to) return null;
    // Where its owner wants it: no reconcile pass is owed for this change.
    w.settle(inst.id);
    return writeChange(w, inst, { state: power.to, ...powerObservation(w, inst, c, power.to) }, power.reason, { last });
  }
  const outcome: Outcome = expired ? { ok: false, error: `the host did not finish ${c.kind} before its deadline` } : outcomeOf(c);
  const snapshotId = String(c.args.snapshotId);
  if (c.kind === "instance.snapshot") {
    await w.sql.query(
      `UPDATE instance_snapshots SET state = $2::text, size_bytes = $3::bigint, error = $4::text,
              ready_at = CASE WHEN $2::text = 'ready' THEN $5::timestamptz ELSE NULL END
        WHERE id = $1 AND state = 'creating'`,
      [snapshotId, outcome.ok ? "ready" : "failed", outcome.ok ? outcome.sizeBytes : null, outcome.ok ? null : outcome.error, w.now],
    );
    return writeChange(w, inst, {}, outcome.ok ? "snapshot:ready" : "snapshot:failed", { last });
  }
  return writeChange(w, inst, {}, outcome.ok ? "restored" : "restore:failed", { last });
}

/**
 * A host's report on one of its commands. A final one is settled into its instance in the report's own
 * transaction (a warm claim waits on its resume; a snapshot is ready as soon as its host says so); the instance
 * is locked before the command, in the reconciler's order. When no other command of the instance waits to be
 * settled (the common case), the one statement that records the report also settles it, and its outcome is
 * applied at once: two round trips from report to commit (the lock with the report's statement, then the change
 * with the audit row and COMMIT), where the host's answer is what a caller waits on; one for a pause's or
 * resume's success whose report names it (power-reports.ts).
 * The reconciler still settles whatever this misses.
 */
export async function recordHostReport(w: Write, nodeId: string, report: CommandReport): Promise<HostCommandRow> {
  if (report.state === "running") return (await recordCommandReport(w, nodeId, report)).row;
  // A pause or resume done, which the report names: recorded and settled in one message (power-reports.ts).
  if (settlesInOneMessage(w, report)) return settlePowerReport(w, nodeId, report);
  // The lock and the report go in one round trip: the report's statement settles the command only if the
  // instance, locked by then, has no other command to settle and is not deleted.
  const [locked, updated] = (await batch(w.sql, [
    commandInstanceLock(report.id, nodeId),
    commandReportStatement(w, nodeId, report, { settleAlone: true }),
  ])) as [Instance[], HostCommandRow[]];
  const { row, changed } = await recordCommandReport(w, nodeId, report, updated);
  const [inst] = locked;
  if (!inst) return row;
  // Settled by its statement: the write ends with its outcome, a change going with the audit row and the commit.
  // Otherwise the instance has other commands to settle first, or is deleted (or the report was one heard before).
  if (changed && row.settledAt) await applyOutcome(w, inst, row, false, true);
  else await settleCommands(w, inst);
  return row;
}

type Outcome = { ok: true; sizeBytes: number | null } | { ok: false; error: string };

function outcomeOf(c: HostCommandRow): Outcome {
  if (c.state !== "succeeded") return { ok: false, error: c.error ?? `${c.kind} ${c.state}` };
  if (c.kind !== "instance.snapshot") return { ok: true, sizeBytes: null };
  const r = snapshotResult.safeParse(c.result);
  return r.success ? { ok: true, sizeBytes: r.data.sizeBytes } : { ok: false, error: "the host reported a snapshot result that does not parse" };
}

export async function listSnapshots(sql: Sql, instanceId: string): Promise<Snapshot[]> {
  return sql.query<Snapshot>(`SELECT ${COLUMNS} FROM instance_snapshots WHERE instance_id = $1 ORDER BY created_at, id`, [instanceId]);
}

export async function getSnapshot(sql: Sql, id: string): Promise<Snapshot | undefined> {
  return one<Snapshot>(sql, `SELECT ${COLUMNS} FROM instance_snapshots WHERE id = $1`, [id]);
}
