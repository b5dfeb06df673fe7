import { commandKinds, type ExecRequest, type RefusalCode } from "../../contracts/commands.ts";
import type { ErrorCode } from "../../contracts/errors.ts";
import { one, type Sql } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";
import { enqueueCommand, type HostCommandRow } from "./commands.ts";

/**
 * `instance.exec`: a command run in a sandbox's guest (core/sandboxes/exec.ts asks for it and reads its output).
 * It settles nothing into the instance: its watchers have its output and its end, which they read from the rows.
 */

/** Queue the exec for the instance's node; its deadline is its timeout and the grace its host has to report. Returns the command's id. */
export async function queueExec(w: Write, inst: { id: string; nodeId: string }, args: ExecRequest): Promise<string> {
  const timeoutMs = commandKinds["instance.exec"].timeoutMs(args, 0);
  return (await enqueueCommand(w, { nodeId: inst.nodeId, instanceId: inst.id, kind: "instance.exec", args, timeoutMs })).id;
}

/** The instance's execs not yet over: the sandbox's cap on execs at once counts them. */
export async function runningExecs(sql: Sql, instanceId: string): Promise<number> {
  const running = await one<{ n: number }>(
    sql,
    `SELECT count(*)::int AS n FROM host_commands WHERE instance_id = $1 AND kind = 'instance.exec' AND finished_at IS NULL AND settled_at IS NULL`,
    [instanceId],
  );
  return running?.n ?? 0;
}

/** Its watchers read its end from the command's row: they look once the report's write commits. */
export const execFinished = (w: Write, c: HostCommandRow) => w.execOutput(c.id);

/**
 * How an exec's failure reaches its caller, by the host's code: a guest the host cannot run commands in is
 * UNSUPPORTED (the request can never succeed there); any other failure is the exec's end, its message for people.
 */
export function execRefusal(code: RefusalCode | null): ErrorCode | null {
  return code === "unsupported" ? "UNSUPPORTED" : null;
}
