import { commandKinds } from "../../contracts/commands.ts";
import { AppError } from "../../contracts/errors.ts";
import { writeChange } from "../instances/changes.ts";
import type { Instance } from "../instances/model.ts";
import { one } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import { enqueueCommand, type HostCommandRow, type Settle } from "./commands.ts";

/**
 * `instance.snapshot` and `instance.restore`: an instance's memory and disk saved on its host as a snapshot (a row
 * of `instance_snapshots`, made by core/lifecycle/snapshots.ts), or put back. Queued with the instance event that
 * says it was asked for; settled into the snapshot's row and the instance's timeline (`snapshot:ready`,
 * `snapshot:failed`, `restored`, `restore:failed`).
 */

export type SnapshotKind = "instance.snapshot" | "instance.restore";

/** One command at a time per instance: a snapshot and a restore racing on one host could not both be right. */
async function requireIdle(w: Write, instanceId: string, what: string): Promise<void> {
  const busy = await one<{ kind: string }>(
    w.sql,
    `SELECT kind FROM host_commands WHERE instance_id = $1 AND settled_at IS NULL AND kind IN ('instance.snapshot', 'instance.restore') LIMIT 1`,
    [instanceId],
  );
  if (busy) throw new AppError("PRECONDITION_FAILED", `${what}: an ${busy.kind} of ${instanceId} is still in progress`);
}

/**
 * The host command for the instance's node, and the instance event that says it was asked for; PRECONDITION_FAILED
 * while another snapshot or restore of it is unsettled. `configuredMs`: the deployment's `hosts.commandTimeoutMs`.
 */
export async function queueSnapshot(
  w: Write,
  inst: Instance & { nodeId: string },
  kind: SnapshotKind,
  snapshotId: string,
  configuredMs: number,
): Promise<{ commandId: string; instance: Instance }> {
  const what = kind === "instance.snapshot" ? "snapshot" : "restore";
  await requireIdle(w, inst.id, `a ${what}`);
  const args = { instanceId: inst.id, snapshotId };
  const cmd = await enqueueCommand(w, { nodeId: inst.nodeId, instanceId: inst.id, kind, args, timeoutMs: commandKinds[kind].timeoutMs(args, configuredMs) });
  const instance = await writeChange(w, inst, {}, `requested:${what}`);
  return { commandId: cmd.id, instance };
}

type Outcome = { ok: true; sizeBytes: number | null } | { ok: false; error: string };

function outcomeOf(c: HostCommandRow): Outcome {
  if (c.state !== "succeeded") return { ok: false, error: c.error ?? `${c.kind} ${c.state}` };
  if (c.kind !== "instance.snapshot") return { ok: true, sizeBytes: null };
  const r = commandKinds["instance.snapshot"].result.safeParse(c.result);
  return r.success ? { ok: true, sizeBytes: r.data.sizeBytes } : { ok: false, error: "the host reported a snapshot result that does not parse" };
}

/** A finished snapshot becomes ready or failed; a restore is recorded; one past its deadline failed, saying so. */
export const settleSnapshot: Settle = async (w, inst, c, { expired, last }) => {
  const outcome: Outcome = expired ? { ok: false, error: `the host did not finish ${c.kind} before its deadline` } : outcomeOf(c);
  if (c.kind === "instance.snapshot") {
    await w.sql.query(
      `UPDATE instance_snapshots SET state = $2::text, size_bytes = $3::bigint, error = $4::text,
              ready_at = CASE WHEN $2::text = 'ready' THEN $5::timestamptz ELSE NULL END
        WHERE id = $1 AND state = 'creating'`,
      [String(c.args.snapshotId), outcome.ok ? "ready" : "failed", outcome.ok ? outcome.sizeBytes : null, outcome.ok ? null : outcome.error, w.now],
    );
    return writeChange(w, inst, {}, outcome.ok ? "snapshot:ready" : "snapshot:failed", { last });
  }
  return writeChange(w, inst, {}, outcome.ok ? "restored" : "restore:failed", { last });
};

/** An instance deleted takes its snapshots with it: their files were removed with the domain. */
export async function snapshotsGone(w: Write, instanceId: string): Promise<void> {
  await w.sql.query(`UPDATE instance_snapshots SET state = 'deleted' WHERE instance_id = $1 AND state <> 'deleted'`, [instanceId]);
}
