import { notFound } from "../../contracts/errors.ts";
import type { CommandReport } from "../../contracts/host.ts";
import type { Instance } from "../instances/model.ts";
import { batch, one } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import {
  commandInstanceLock,
  commandReportStatement,
  commandRowStatement,
  FINAL_STATES,
  type HostCommandRow,
  settleCommand,
  unsettledCommands,
} from "./commands.ts";
import { goneHooks, serverKinds } from "./kinds.ts";
import { settlePowerReport, settlesInOneMessage } from "./power.ts";

/**
 * A host's word on its commands, and what settles their outcomes into instances: in the report's own write, or
 * in a reconcile pass (core/lifecycle/reconciler.ts) for what that missed and for commands past their deadline.
 * Each outcome is its kind's to apply (./kinds.ts).
 */

/**
 * An agent's report on one of its node's commands. `running` acknowledges it; `succeeded` or `failed` finishes
 * it and wakes the reconciler to settle it (or its statement settled it: commandReportStatement's
 * `settleAlone`). The first final word counts: a late or repeated report changes nothing (nor does one after
 * the deadline expired the command); `changed` says which it was. `updated`: what commandReportStatement
 * returned, when the caller sent it itself (with other statements, in one round trip).
 */
export async function recordCommandReport(
  w: Write,
  nodeId: string,
  report: CommandReport,
  updated?: HostCommandRow[],
): Promise<{ row: HostCommandRow; changed: boolean }> {
  const finished = report.state !== "running";
  let rows = updated;
  if (!rows) {
    const st = commandReportStatement(w, nodeId, report);
    rows = await w.sql.query<HostCommandRow>(st.text, st.params);
  }
  const [cmd] = rows;
  if (!cmd) {
    const st = commandRowStatement(report.id, nodeId);
    const known = await one<HostCommandRow>(w.sql, st.text, st.params);
    if (!known) throw notFound("host command", report.id);
    w.unchanged();
    return { row: known, changed: false };
  }
  if (finished && cmd.instanceId) w.wake(cmd.instanceId);
  if (finished) serverKinds[cmd.kind].finished?.(w, cmd);
  w.audit({ targetId: cmd.id, details: { kind: cmd.kind, instanceId: cmd.instanceId, state: report.state, error: report.error } });
  return { row: cmd, changed: true };
}

/**
 * A host's report on one of its commands. A final one is settled into its instance in the report's own
 * transaction (a warm claim waits on its resume; a snapshot is ready as soon as its host says so); the instance
 * is locked before the command, in the reconciler's order. When no other command of the instance waits to be
 * settled (the common case), the one statement that records the report also settles it, and its outcome is
 * applied at once: two round trips from report to commit (the lock with the report's statement, then the change
 * with the audit row and COMMIT), where the host's answer is what a caller waits on; one for a pause's or
 * resume's success whose report names it (./power.ts). The reconciler still settles whatever this misses.
 */
export async function recordHostReport(w: Write, nodeId: string, report: CommandReport): Promise<HostCommandRow> {
  if (report.state === "running") return (await recordCommandReport(w, nodeId, report)).row;
  // A pause or resume done, which the report names: recorded and settled in one message (./power.ts).
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
  if (changed && row.settledAt) await serverKinds[row.kind].settle(w, inst, row, { expired: false, last: true });
  else await settleCommands(w, inst);
  return row;
}

/**
 * Apply what the host did with the instance's commands, one per call (the reconciler loops): each finished one
 * (or one past its deadline, given up) settled by its kind. For an instance that is gone, unfinished commands
 * are cancelled and what its kinds keep beside it goes with it. Returns the instance when it changed.
 */
export async function settleCommands(w: Write, inst: Instance, pending?: HostCommandRow[]): Promise<Instance | null> {
  // `pending`: the instance's unsettled commands as its pass read them once (the pass holds the instance, and
  // every writer that finishes a command locks it first); what is settled here leaves the list.
  const left = pending ?? (await unsettledCommands(w, inst.id));
  if (inst.state === "deleted") {
    for (const c of left.splice(0)) await settleCommand(w, c.id, FINAL_STATES.includes(c.state) ? undefined : "cancelled");
    for (const gone of goneHooks) await gone(w, inst.id);
    return null;
  }
  for (const c of [...left]) {
    const expired = !FINAL_STATES.includes(c.state) && c.deadline <= w.now;
    if (!FINAL_STATES.includes(c.state) && !expired) continue;
    left.splice(left.indexOf(c), 1);
    await settleCommand(w, c.id, expired ? "expired" : undefined);
    const changed = await serverKinds[c.kind].settle(w, inst, c, { expired, last: false });
    if (changed) return changed;
  }
  return null;
}
