import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import { type ExecChunk, type ExecResult, execRequest, execResult } from "../../contracts/host.ts";
import type { Principal } from "../auth/principal.ts";
import { one, type Sql } from "../kernel/db.ts";
import { parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import { enqueueCommand } from "../pools/hosted/commands.ts";
import { lockSandbox } from "./sandboxes.ts";

/**
 * Exec in a sandbox: a host command (`instance.exec`) for the node running its instance. The host streams the
 * output back in numbered chunks, kept in `exec_output` (a chunk sent twice is stored once); the command's final
 * report carries how it ended. Watchers read both from the tables, woken by the bus, so nothing is lost between
 * a message and a read.
 */

/** How long past its own timeout the host has to report an exec before the command is given up. */
const GRACE_MS = 30_000;

export async function requestExec(
  w: Write,
  who: Principal,
  sandboxId: string,
  raw: { command: string[]; env?: Record<string, string>; stdin?: string | null; timeoutSeconds?: number | null },
): Promise<{ commandId: string }> {
  const s = await lockSandbox(w, who, sandboxId);
  const inst = await one<{ state: string; nodeId: string | null }>(w.sql, `SELECT state, node_id AS "nodeId" FROM instances WHERE id = $1`, [s.instanceId]);
  if (!inst?.nodeId || inst.state !== "running")
    throw new AppError("PRECONDITION_FAILED", `sandbox ${sandboxId} is not running (its instance is ${inst?.state ?? "gone"})`, { state: inst?.state });
  const timeoutSeconds = raw.timeoutSeconds ?? 60;
  if (!Number.isInteger(timeoutSeconds) || timeoutSeconds < 1 || timeoutSeconds > 3600) throw invalid("timeoutSeconds: 1 to 3600", { path: "timeoutSeconds" });
  const args = parseInput(
    execRequest,
    { instanceId: s.instanceId, command: raw.command, env: raw.env ?? {}, stdin: raw.stdin ?? null, timeoutMs: timeoutSeconds * 1000 },
    "exec",
  );
  const cmd = await enqueueCommand(w, { nodeId: inst.nodeId, instanceId: s.instanceId, kind: "instance.exec", args, timeoutMs: args.timeoutMs + GRACE_MS });
  // The audit keeps what ran, not its input: stdin and env values may hold the tenant's secrets.
  w.audit({ targetId: sandboxId, tenantId: s.tenantId, details: { command: cmd.id, argv0: args.command[0], args: args.command.length - 1 } });
  return { commandId: cmd.id };
}

/** A host's output chunks for one of its node's exec commands (agents batch them, so one audit row covers many). */
export async function recordExecOutput(w: Write, nodeId: string, commandId: string, chunks: ExecChunk[]): Promise<boolean> {
  const cmd = await one<{ kind: string }>(w.sql, `SELECT kind FROM host_commands WHERE id = $1 AND node_id = $2`, [commandId, nodeId]);
  if (cmd?.kind !== "instance.exec") throw notFound("exec command", commandId);
  for (const c of chunks)
    await w.sql.query(`INSERT INTO exec_output (command_id, seq, stream, data, at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, [
      commandId,
      c.seq,
      c.stream,
      c.data,
      w.now,
    ]);
  w.audit({ targetId: commandId, details: { chunks: chunks.length } });
  w.execOutput(commandId);
  return true;
}

export interface ExecProgress {
  chunks: ExecChunk[];
  /** Set once the command is over and every chunk up to its end has been read. */
  end: { result: ExecResult | null; error: string | null } | null;
}

/** Chunks after `afterSeq`, in order, and the end once the command finished (or was given up). */
export async function readExec(sql: Sql, commandId: string, afterSeq: number, now: Date): Promise<ExecProgress> {
  const cmd = await one<{ state: string; result: unknown; error: string | null; deadline: Date }>(
    sql,
    `SELECT state, result, error, deadline FROM host_commands WHERE id = $1`,
    [commandId],
  );
  const chunks = await sql.query<ExecChunk>(`SELECT seq, stream, data FROM exec_output WHERE command_id = $1 AND seq > $2 ORDER BY seq LIMIT 500`, [
    commandId,
    afterSeq,
  ]);
  if (!cmd || chunks.length === 500) return { chunks, end: null };
  if (cmd.state === "succeeded") {
    const r = execResult.safeParse(cmd.result);
    return { chunks, end: r.success ? { result: r.data, error: null } : { result: null, error: "the host reported an exec result that does not parse" } };
  }
  if (cmd.state === "failed" || cmd.state === "expired" || cmd.state === "cancelled")
    return { chunks, end: { result: null, error: cmd.error ?? `the exec was ${cmd.state}` } };
  if (cmd.deadline <= now) return { chunks, end: { result: null, error: "the host did not finish the exec before its deadline" } };
  return { chunks, end: null };
}

/** How long an exec's output is kept once the command finished: watchers that reconnect within it read it all. */
export const EXEC_OUTPUT_KEEP_MS = 60 * 60_000;

/** Output of execs that finished before `before` goes (the sandboxes job calls this): the table does not grow. */
export async function pruneExecOutput(w: Write, before: Date): Promise<number> {
  const rows = await w.sql.query<{ n: number }>(
    `WITH d AS (DELETE FROM exec_output o USING host_commands c
                 WHERE c.id = o.command_id AND c.kind = 'instance.exec' AND c.finished_at IS NOT NULL AND c.finished_at < $1 RETURNING 1)
     SELECT count(*)::int AS n FROM d`,
    [before],
  );
  return rows[0]?.n ?? 0;
}
