import type { RefusalCode } from "../../contracts/commands.ts";
import type { CommandReport, HostCommand, HostCommandKind } from "../../contracts/host.ts";
import { INSTANCE_COLUMNS, type Instance } from "../instances/model.ts";
import type { Sql, Statement } from "../kernel/db.ts";
import { type Fragment, SQL } from "../kernel/sql.ts";
import type { Write } from "../kernel/write.ts";

/**
 * Host commands, on the server's side: a queue per node in `host_commands`, whatever the kind. A command is sent
 * to its node's agent until the agent reports it finished or its deadline passes; the agent's reports are
 * recorded (./reports.ts) and its outcome settled into the instance by its kind's module (./kinds.ts). Every step
 * is keyed by the command's id, so a report sent twice, or a command sent twice, changes nothing the second time.
 * Only hosted pools' nodes have agents to run them: their driver queues commands (core/pools/hosted/driver.ts).
 */

export type CommandState = "pending" | "running" | "succeeded" | "failed" | "expired" | "cancelled";
/** States after which the agent's word no longer counts. */
export const FINAL_STATES: readonly CommandState[] = ["succeeded", "failed", "expired", "cancelled"];

export interface HostCommandRow {
  id: string;
  nodeId: string;
  instanceId: string | null;
  kind: HostCommandKind;
  args: Record<string, unknown>;
  state: CommandState;
  deadline: Date;
  result: Record<string, unknown> | null;
  error: string | null;
  /** failed: why, in the host protocol's vocabulary; null where the host said none (an older agent) or it did not fail. */
  errorCode: RefusalCode | null;
  createdAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  settledAt: Date | null;
}

/**
 * How a kind's outcome settles into its instance (and the rows beside it), once its host's final report is
 * recorded (or its deadline passed: `expired`). Returns the instance when it changed it. `last`: the caller's
 * write ends with this, and a change goes as the write's last statement (writeChange's `last`).
 */
export type Settle = (w: Write, inst: Instance, c: HostCommandRow, how: { expired: boolean; last: boolean }) => Promise<Instance | null>;

/** The server's side of one command kind, in the table of ./kinds.ts. */
export interface ServerKind {
  settle: Settle;
  /** After its host's final word is recorded (an exec: its watchers read its end). */
  finished?(w: Write, c: HostCommandRow): void;
  /** Its instance is deleted: what of the rows beside it goes with the domain (a snapshot's files went with it). */
  gone?(w: Write, instanceId: string): Promise<void>;
}

const COLUMNS = `id, node_id AS "nodeId", instance_id AS "instanceId", kind, args, state, deadline, result, error, error_code AS "errorCode",
  created_at AS "createdAt", started_at AS "startedAt", finished_at AS "finishedAt", settled_at AS "settledAt"`;

/** A row as the host protocol carries it. */
const asHostCommand = (r: HostCommandRow): HostCommand => ({ id: r.id, kind: r.kind, deadline: r.deadline.toISOString(), args: r.args }) as HostCommand;

/** Queue a command for a node; its agent hears of it once the write commits. */
export async function enqueueCommand(
  w: Write,
  c: { nodeId: string; instanceId: string; kind: HostCommandKind; args: Record<string, unknown>; timeoutMs: number },
  opts: {
    deferred?: boolean;
    /**
     * The args as the statement the row rides in completes them (from the jsonb of `c.args`): for values known
     * only inside it. The caller sets the same on the returned row's args before the write commits; its agent
     * is sent those.
     */
    argsSql?: (args: Fragment) => Fragment;
  } = {},
): Promise<HostCommandRow> {
  const row = newCommand(w, c);
  const insert = commandInsert(row, opts.argsSql);
  // `deferred`: nothing later in the write reads the row (a pause or resume request), so it goes in with the
  // write's last statement (Write.defer) instead of a round trip of its own.
  if (opts.deferred) w.defer(insert);
  else await w.sql.query(insert);
  w.command(c.nodeId, asHostCommand(row));
  return row;
}

/**
 * A command for the node an instance's row names, for a caller that has not read that row: its own statement
 * carries `insert` as a WITH part, which writes the command only if the part `from` (a changed instance's row)
 * has a row, with that row's node_id; `argsSql` completes the args from it. Once the statement has run,
 * `queued` with the node and args it wrote: the agent is sent the command once the write commits.
 */
export function commandFromRow(
  w: Write,
  c: { instanceId: string; kind: HostCommandKind; args: Record<string, unknown>; timeoutMs: number },
  from: Fragment,
  argsSql: (args: Fragment) => Fragment,
) {
  const row = newCommand(w, { ...c, nodeId: "" });
  return {
    row,
    insert: commandInsert(row, argsSql, from),
    queued(nodeId: string, args: Record<string, unknown>): HostCommandRow {
      Object.assign(row, { nodeId, args });
      w.command(nodeId, asHostCommand(row));
      return row;
    },
  };
}

function newCommand(
  w: Write,
  c: { nodeId: string; instanceId: string; kind: HostCommandKind; args: Record<string, unknown>; timeoutMs: number },
): HostCommandRow {
  return {
    id: w.ids("cmd"),
    nodeId: c.nodeId,
    instanceId: c.instanceId,
    kind: c.kind,
    args: c.args,
    state: "pending",
    deadline: new Date(w.now.getTime() + c.timeoutMs),
    result: null,
    error: null,
    errorCode: null,
    createdAt: w.now,
    startedAt: null,
    finishedAt: null,
    settledAt: null,
  };
}

/** A command's INSERT; from `from`'s row (its node_id), and only if it has one, where given. */
function commandInsert(row: HostCommandRow, argsSql: (args: Fragment) => Fragment = (given) => given, from?: Fragment): Fragment {
  return SQL`INSERT INTO host_commands (id, node_id, instance_id, kind, args, deadline, created_at)
     SELECT ${row.id}::text, ${from ? SQL`${from}.node_id` : SQL`${row.nodeId}::text`}, ${row.instanceId}::text, ${row.kind}::text,
            ${argsSql(SQL`${JSON.stringify(row.args)}::jsonb`)}, ${row.deadline}::timestamptz, ${row.createdAt}::timestamptz${from ? SQL` FROM ${from}` : SQL.empty}`;
}

/** What a node's agent should be working on: commands not finished and not past their deadline, oldest first. */
export async function commandsForNode(sql: Sql, nodeId: string, now: Date): Promise<HostCommand[]> {
  const rows = await sql.query<HostCommandRow>(
    `SELECT ${COLUMNS} FROM host_commands WHERE node_id = $1 AND state IN ('pending', 'running') AND deadline > $2 ORDER BY created_at, id`,
    [nodeId, now],
  );
  return rows.map(asHostCommand);
}

/**
 * The statement that records a host's report on one of its commands (./reports.ts, recordCommandReport).
 * `settleAlone`: a final report also settles the command when it is the only unsettled one of an instance that
 * is not deleted, which the caller holds locked (./reports.ts applies its outcome in the same write).
 */
export function commandReportStatement(w: Write, nodeId: string, report: CommandReport, opts: { settleAlone?: boolean } = {}): Statement {
  // One statement when the report changes something (the update waits for, and re-checks, a row another
  // writer holds); a second look only for a report that changes nothing.
  if (report.state === "running")
    return {
      text: `UPDATE host_commands SET state = 'running', started_at = $3 WHERE id = $1 AND node_id = $2 AND state = 'pending' RETURNING ${COLUMNS}`,
      params: [report.id, nodeId, w.now],
    };
  // An exec's output tally (core/sandboxes/exec-output.ts) is the server's: kept under the host's result, which may not name it.
  return {
    text: `UPDATE host_commands h SET state = $3, error = $5, error_code = $8,
                  result = CASE WHEN h.kind <> 'instance.exec' THEN $4::jsonb
                                ELSE (COALESCE($4::jsonb, '{}'::jsonb) - 'output') || COALESCE(h.result, '{}'::jsonb) END,
                  started_at = COALESCE(started_at, $6), finished_at = $6,
                  settled_at = CASE WHEN $7::boolean
                                     AND NOT EXISTS (SELECT 1 FROM host_commands o WHERE o.instance_id = h.instance_id AND o.settled_at IS NULL AND o.id <> h.id)
                                     AND EXISTS (SELECT 1 FROM instances i WHERE i.id = h.instance_id AND i.state <> 'deleted')
                                THEN $6::timestamptz END
            WHERE id = $1 AND node_id = $2 AND state IN ('pending', 'running') RETURNING ${COLUMNS}`,
    params: [
      report.id,
      nodeId,
      report.state,
      report.result === null ? null : JSON.stringify(report.result),
      report.error,
      w.now,
      opts.settleAlone ?? false,
      report.state === "failed" ? (report.code ?? null) : null,
    ],
  };
}

/** A command as it stands, if it is this node's. */
export function commandRowStatement(id: string, nodeId: string): Statement {
  return { text: `SELECT ${COLUMNS} FROM host_commands WHERE id = $1 AND node_id = $2`, params: [id, nodeId] };
}

/** The instance a node's command is for, locked: a report's write takes it first, in the reconciler's lock order. */
export function commandInstanceLock(commandId: string, nodeId: string): Statement {
  return {
    text: `SELECT ${INSTANCE_COLUMNS} FROM instances WHERE id = (SELECT instance_id FROM host_commands WHERE id = $1 AND node_id = $2) FOR UPDATE`,
    params: [commandId, nodeId],
  };
}

/** The commands of an instance whose outcome the reconciler has yet to apply: finished, or past their deadline. */
export async function unsettledCommands(w: Write, instanceId: string): Promise<HostCommandRow[]> {
  const st = unsettledCommandsStatement(instanceId);
  return w.sql.query<HostCommandRow>(st.text, st.params);
}

/** unsettledCommands' statement, for a caller that sends it with others (Sql.batch). */
export function unsettledCommandsStatement(instanceId: string): Statement {
  return {
    text: `SELECT ${COLUMNS} FROM host_commands WHERE instance_id = $1 AND settled_at IS NULL ORDER BY created_at, id FOR UPDATE`,
    params: [instanceId],
  };
}

/** Mark a command's outcome applied (and, for one that never finished, what ended it). */
export async function settleCommand(w: Write, id: string, endedAs?: "expired" | "cancelled"): Promise<void> {
  await w.sql.query(
    `UPDATE host_commands SET settled_at = $2::timestamptz, state = COALESCE($3::text, state),
            finished_at = COALESCE(finished_at, CASE WHEN $3::text IS NULL THEN NULL ELSE $2::timestamptz END)
      WHERE id = $1`,
    [id, w.now, endedAs ?? null],
  );
}

/** Instances with commands to settle: finished ones (a lost wake-up) and ones past their deadline. For the sweep. */
export async function instancesWithUnsettledCommands(sql: Sql, now: Date, limit: number): Promise<string[]> {
  const rows = await sql.query<{ id: string }>(
    `SELECT DISTINCT instance_id AS id FROM host_commands
      WHERE settled_at IS NULL AND instance_id IS NOT NULL AND (state NOT IN ('pending', 'running') OR deadline <= $1) LIMIT $2`,
    [now, limit],
  );
  return rows.map((r) => r.id);
}
