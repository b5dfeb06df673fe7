import { commandKinds } from "../../contracts/commands.ts";
import { notFound } from "../../contracts/errors.ts";
import type { CommandReport } from "../../contracts/host.ts";
import { CHANGED_ROW, changeStatement, writeChange } from "../instances/changes.ts";
import type { Instance } from "../instances/model.ts";
import type { Sql } from "../kernel/db.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import type { Write } from "../kernel/write.ts";
import {
  commandFromRow,
  commandInstanceLock,
  commandReportStatement,
  commandRowStatement,
  enqueueCommand,
  type HostCommandRow,
  type Settle,
} from "./commands.ts";

/**
 * `instance.pause` and `instance.resume`: the power changes that must not wait for a converge pass. Queued beside
 * the change that asks for them (the spec says the same, so a lost command only delays), each naming the spec
 * generation that change gives the instance; settled into the instance when the host says it is done, in the
 * report's own message where the report names it (settlePowerReport). docs/architecture.md, "The host protocol".
 */

export type PowerKind = "instance.pause" | "instance.resume";
export type PowerTarget = "paused" | "running";

/** The command that moves an instance to `to`. */
export const powerKind = (to: PowerTarget): PowerKind => (to === "paused" ? "instance.pause" : "instance.resume");

/** What a pause or resume command that succeeded moves, with the reason a host report would give. */
export const POWER_MOVES: Record<PowerKind, { from: "running" | "paused"; to: "running" | "paused"; reason: string }> = {
  "instance.resume": { from: "paused", to: "running", reason: "host:resumed" },
  "instance.pause": { from: "running", to: "paused", reason: "host:paused" },
};

const timeoutMs = (kind: PowerKind, args: { instanceId: string }) => commandKinds[kind].timeoutMs(args, 0);

/**
 * Queue the command for a change the write is about to make as its last statement: the command's row rides in
 * that statement (Write.defer), which completes its args with the spec generation it gives the instance. Call
 * the result with the changed row before the write commits: its agent is sent the same args.
 */
export async function queuePowerWithChange(w: Write, inst: { id: string; nodeId: string }, kind: PowerKind): Promise<(changed: Instance) => void> {
  const args = { instanceId: inst.id };
  const cmd = await enqueueCommand(
    w,
    { nodeId: inst.nodeId, instanceId: inst.id, kind, args, timeoutMs: timeoutMs(kind, args) },
    { deferred: true, argsSql: (given) => SQL`${given} || jsonb_build_object('generation', (SELECT spec_generation FROM ${CHANGED_ROW}))` },
  );
  return (changed) => {
    cmd.args.generation = changed.specGeneration;
  };
}

/** Queue the command after the change that asked for it (`changed`, its row, names the generation). */
export async function queuePowerAfterChange(w: Write, changed: { id: string; nodeId: string; specGeneration: number }, kind: PowerKind): Promise<void> {
  const args = { instanceId: changed.id, generation: changed.specGeneration };
  await enqueueCommand(w, { nodeId: changed.nodeId, instanceId: changed.id, kind, args, timeoutMs: timeoutMs(kind, args) });
}

/**
 * The command as a WITH part (`queued`) of a change's statement over a row the write has not read: written only if
 * `from` (the changed row's part) has a row, for its node, with the generation it gives the instance. Once the
 * statement has run, call `queued` with the changed row: its agent is sent the command once the write commits.
 */
export function powerInStatement(w: Write, instanceId: string, kind: PowerKind, from: Fragment) {
  const args = { instanceId };
  const command = commandFromRow(
    w,
    { instanceId, kind, args, timeoutMs: timeoutMs(kind, args) },
    from,
    (given) => SQL`${given} || jsonb_build_object('generation', ${from}.spec_generation)`,
  );
  return {
    part: SQL`queued AS (${command.insert})`,
    queued: (changed: Instance) => void command.queued(changed.nodeId as string, { instanceId, generation: changed.specGeneration }),
  };
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
 * A pause or resume the host did: the instance is where it was asked to be (its next report says so too). One
 * that failed (or was given up) is left to the spec, which asks for the same and is converged and reported as usual.
 */
export const settlePower: Settle = async (w, inst, c, { last }) => {
  const power = POWER_MOVES[c.kind as PowerKind];
  if (c.state !== "succeeded" || inst.state !== power.from || inst.desiredState !== power.to) return null;
  // Where its owner wants it: no reconcile pass is owed for this change.
  w.settle(inst.id);
  return writeChange(w, inst, { state: power.to, ...powerObservation(w, inst, c, power.to) }, power.reason, { last });
};

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
 * reconciler, woken by it, settles the command as it settles any other (./reports.ts). The audit row goes in the same
 * statement, written only if this report changed the command (a repeated report changes nothing).
 */
export async function settlePowerReport(
  w: Write,
  nodeId: string,
  report: CommandReport & { power: NonNullable<CommandReport["power"]> },
): Promise<HostCommandRow> {
  const change = powerReportChange(w, nodeId, report);
  const commit = w.sql.commitBatch as NonNullable<Sql["commitBatch"]>;
  const [known, , updated, changed] = (await commit([
    commandRowStatement(report.id, nodeId),
    commandInstanceLock(report.id, nodeId),
    commandReportStatement(w, nodeId, report),
    change.statement,
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

/**
 * settlePowerReport's change, built ahead and guarded on what the general path would have checked after reading
 * (see there), with the command settled and the audit row in its statement.
 */
export function powerReportChange(w: Write, nodeId: string, report: CommandReport & { power: NonNullable<CommandReport["power"]> }) {
  const move = POWER_MOVES[report.power.kind];
  const commandId = SQL.param(report.id);
  // The command's row as this transaction's report statement left it: absent unless that statement changed it.
  const recordedHere = SQL`host_commands h WHERE h.id = ${commandId} AND h.node_id = ${nodeId} AND h.xmin = pg_current_xact_id()::xid`;
  // The generation the command names, which the host's answer confirms it has seen (powerObservation).
  const generation = SQL`(SELECT (c.args->>'generation')::int FROM host_commands c WHERE c.id = ${commandId} AND jsonb_typeof(c.args->'generation') = 'number')`;
  const observed = (value: Fragment, column: string) => SQL`CASE WHEN ${generation} >= observed_generation THEN ${value} ELSE ${SQL.ident(column)} END`;
  return changeStatement(w, { id: report.power.instanceId, state: move.from, desiredState: move.to, nodeId }, { state: move.to }, move.reason, {
    last: true,
    guard: ({ id }) =>
      SQL`state = ${move.from} AND desired_state = ${move.to} AND node_id = ${nodeId}
         AND EXISTS (SELECT FROM ${recordedHere} AND h.instance_id = ${id} AND h.kind = ${report.power.kind} AND h.state = 'succeeded')
         AND NOT EXISTS (SELECT FROM host_commands o WHERE o.instance_id = ${id} AND o.settled_at IS NULL AND o.id <> ${commandId})`,
    computed: {
      observed_state: () => observed(SQL`${move.to}::text`, "observed_state"),
      observed_error: () => observed(SQL`NULL`, "observed_error"),
      observed_generation: () => observed(generation, "observed_generation"),
      observed_at: ({ at }) => observed(SQL`${at}::timestamptz`, "observed_at"),
    },
    parts: ({ at }) => {
      const audit = w.auditInStatement(
        { targetId: report.id },
        SQL`jsonb_build_object('kind', h.kind, 'instanceId', h.instance_id, 'state', h.state, 'error', h.error)`,
        recordedHere,
      );
      // Settled with the change only: a command whose outcome this statement did not apply is the reconciler's.
      const settled = SQL`settled AS (UPDATE host_commands SET settled_at = ${at}::timestamptz WHERE id = ${commandId} AND EXISTS (SELECT FROM ${CHANGED_ROW}))`;
      return audit ? [settled, SQL`audited AS (${audit})`] : [settled];
    },
  });
}
