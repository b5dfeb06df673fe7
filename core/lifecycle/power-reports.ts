import { notFound } from "../../contracts/errors.ts";
import type { CommandReport, HostCommandKind } from "../../contracts/host.ts";
import { commandReportStatement, commandRowStatement, type HostCommandRow } from "../commands/commands.ts";
import { CHANGED_ROW, changeStatement } from "../instances/changes.ts";
import { INSTANCE_COLUMNS } from "../instances/model.ts";
import type { Sql, Statement } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";

/** What a pause or resume command that succeeded moves, with the reason a host report would give. */
export const POWER_MOVES: Partial<Record<HostCommandKind, { from: "running" | "paused"; to: "running" | "paused"; reason: string }>> = {
  "instance.resume": { from: "paused", to: "running", reason: "host:resumed" },
  "instance.pause": { from: "running", to: "paused", reason: "host:paused" },
};

/** The instance a node's command is for, locked: a report's write takes it first, in the reconciler's lock order. */
export function commandInstanceLock(commandId: string, nodeId: string): Statement {
  return {
    text: `SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = (SELECT instance_id FROM host_commands WHERE id = $1 AND node_id = $2) FOR UPDATE`,
    params: [commandId, nodeId],
  };
}

/** A pause's or resume's final report that says which it was (CommandReport's `power`), and a database that can take it in one message. */
export function settlesInOneMessage(w: Write, report: CommandReport): report is CommandReport & { power: NonNullable<CommandReport["power"]> } {
  return report.state === "succeeded" && report.power !== undefined && w.sql.commitBatch !== undefined;
}

/**
 * A pause or resume the host reports done, recorded and settled into its instance in one message with the
 * COMMIT: what the caller of pauseInstance or startInstance (or a warm claim) waits on is the commit of this
 * write, and the two round trips of the general path (lock and record; change and commit) become one. The
 * report says which command it was, so the change is built ahead and guarded on what the general path would
 * have checked after reading: the command recorded by this transaction (the general path's statement),
 * succeeded, of that kind and instance, the only one of its instance not yet settled, and the instance still
 * where the command moves it from, with its owner wanting it where the command moves it to. The command is
 * marked settled with the change only: where a guard fails the report is still recorded, unsettled, and the
 * reconciler, woken by it, settles the command as it settles any other (snapshots.ts). The audit row goes in the same
 * statement, written only if this report changed the command (a repeated report changes nothing).
 */
export async function settlePowerReport(
  w: Write,
  nodeId: string,
  report: CommandReport & { power: NonNullable<CommandReport["power"]> },
): Promise<HostCommandRow> {
  const move = POWER_MOVES[report.power.kind] as NonNullable<(typeof POWER_MOVES)[HostCommandKind]>;
  // The command's row as this transaction's report statement left it: absent unless that statement changed it.
  const recordedHere = (add: (v: unknown) => string) =>
    `host_commands h WHERE h.id = ${add(report.id)} AND h.node_id = ${add(nodeId)} AND h.xmin = pg_current_xact_id()::xid`;
  // The generation the command names, which the host's answer confirms it has seen (snapshots.ts powerObservation).
  const generation = (add: (v: unknown) => string) =>
    `(SELECT (c.args->>'generation')::int FROM host_commands c WHERE c.id = ${add(report.id)} AND jsonb_typeof(c.args->'generation') = 'number')`;
  const observed = (add: (v: unknown) => string, value: string, column: string) =>
    `CASE WHEN ${generation(add)} >= observed_generation THEN ${value} ELSE ${column} END`;
  const change = changeStatement(w, { id: report.power.instanceId, state: move.from, desiredState: move.to, nodeId }, { state: move.to }, move.reason, {
    last: true,
    guard: (add) =>
      `state = ${add(move.from)} AND desired_state = ${add(move.to)} AND node_id = ${add(nodeId)}
         AND EXISTS (SELECT FROM ${recordedHere(add)} AND h.instance_id = $1 AND h.kind = ${add(report.power.kind)} AND h.state = 'succeeded')
         AND NOT EXISTS (SELECT FROM host_commands o WHERE o.instance_id = $1 AND o.settled_at IS NULL AND o.id <> ${add(report.id)})`,
    computed: {
      observed_state: (add) => observed(add, `${add(move.to)}::text`, "observed_state"),
      observed_error: (add) => observed(add, "NULL", "observed_error"),
      observed_generation: (add) => observed(add, generation(add), "observed_generation"),
      observed_at: (add) => observed(add, "$2::timestamptz", "observed_at"),
    },
    parts: (add) => {
      const audit = w.auditInStatement(
        { targetId: report.id },
        add,
        `jsonb_build_object('kind', h.kind, 'instanceId', h.instance_id, 'state', h.state, 'error', h.error)`,
        recordedHere(add),
      );
      // Settled with the change only: a command whose outcome this statement did not apply is the reconciler's.
      const settled = `settled AS (UPDATE host_commands SET settled_at = $2::timestamptz WHERE id = ${add(report.id)} AND EXISTS (SELECT FROM ${CHANGED_ROW}))`;
      return audit ? [settled, `audited AS (${audit})`] : [settled];
    },
  });
  const commit = w.sql.commitBatch as NonNullable<Sql["commitBatch"]>;
  const [known, , updated, changed] = (await commit([
    commandRowStatement(report.id, nodeId),
    commandInstanceLock(report.id, nodeId),
    commandReportStatement(w, nodeId, report),
    { text: change.text, params: change.params },
  ])) as [HostCommandRow[], unknown[], HostCommandRow[], Parameters<typeof change.applied>[0]];
  const [cmd] = updated;
  if (!cmd) {
    // Committed with nothing written: a report heard before, or a command that is not this node's.
    const [row] = known;
    if (!row) throw notFound("host command", report.id);
    w.unchanged();
    return row;
  }
  if (cmd.instanceId) w.wake(cmd.instanceId);
  // Where its owner wants it: no reconcile pass is owed for this change.
  const inst = change.applied(changed);
  if (!inst) return cmd;
  w.settle(inst.id);
  return { ...cmd, settledAt: w.now };
}
