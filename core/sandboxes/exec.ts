import { EXEC_MAX_MS, type RefusalCode } from "../../contracts/commands.ts";
import { AppError, type ErrorCode, invalid } from "../../contracts/errors.ts";
import { type ExecChunk, type ExecResult, execRequest, execResult } from "../../contracts/host.ts";
import type { Principal } from "../auth/principal.ts";
import { execRefusal, runningExecs } from "../commands/exec.ts";
import { one, type Sql } from "../kernel/db.ts";
import { parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import { requireCapability } from "../pools/registry.ts";
import { checkTenantOutput, EXEC_OUTPUT_CAPS, type ExecOutputCaps, tallyOf } from "./exec-output.ts";
import { lockSandbox } from "./sandboxes.ts";

export { EXEC_OUTPUT_CAPS, EXEC_OUTPUT_KEEP_MS, type ExecOutputCaps, recordExecOutput } from "./exec-output.ts";

/**
 * Exec in a sandbox, by its pool's driver (hosted: a host command, `instance.exec`, for the node running its
 * instance: core/commands/exec.ts). The host streams the
 * output back in numbered chunks, kept in `exec_output` (a chunk sent twice is stored once, and at most the caps
 * of exec-output.ts); the command's final report carries how it ended. Watchers read both from the tables, woken
 * by the bus, so nothing is lost between a message and a read.
 */

export async function requestExec(
  w: Write,
  who: Principal,
  sandboxId: string,
  raw: { command: string[]; env?: Record<string, string>; stdin?: string | null; timeoutSeconds?: number | null },
  caps: ExecOutputCaps = EXEC_OUTPUT_CAPS,
): Promise<{ commandId: string }> {
  const s = await lockSandbox(w, who, sandboxId);
  // Shared, after the sandbox as deleteSandbox takes them: a delete committed first is seen here (its desired
  // state), and one that comes later waits until this exec is queued, so it cancels it.
  const inst = await one<{ state: string; desiredState: string; nodeId: string | null; poolClass: string; poolName: string }>(
    w.sql,
    `SELECT i.state, i.desired_state AS "desiredState", i.node_id AS "nodeId", p.class AS "poolClass", p.name AS "poolName"
       FROM instances i JOIN pools p ON p.id = i.pool_id WHERE i.id = $1 FOR SHARE OF i`,
    [s.instanceId],
  );
  if (inst?.desiredState === "deleted") throw new AppError("PRECONDITION_FAILED", `sandbox ${sandboxId} is being deleted`, { state: inst.state });
  if (!inst?.nodeId || inst.state !== "running")
    throw new AppError("PRECONDITION_FAILED", `sandbox ${sandboxId} is not running (its instance is ${inst?.state ?? "gone"})`, { state: inst?.state });
  const timeoutSeconds = raw.timeoutSeconds ?? 60;
  if (!Number.isInteger(timeoutSeconds) || timeoutSeconds < 1 || timeoutSeconds * 1000 > EXEC_MAX_MS)
    throw invalid(`timeoutSeconds: 1 to ${EXEC_MAX_MS / 1000}`, { path: "timeoutSeconds" });
  const args = parseInput(
    execRequest,
    {
      instanceId: s.instanceId,
      command: raw.command,
      env: raw.env ?? {},
      stdin: raw.stdin ?? null,
      timeoutMs: timeoutSeconds * 1000,
      outputBytes: caps.execOutputBytes,
    },
    "exec",
  );
  const driver = requireCapability({ class: inst.poolClass, name: inst.poolName }, "exec", "exec in a sandbox");
  // Under the sandbox's lock: two requests cannot both take its last place.
  if ((await runningExecs(w.sql, s.instanceId)) >= caps.execsPerSandbox)
    throw new AppError("RATE_LIMITED", `sandbox ${sandboxId} runs ${caps.execsPerSandbox} execs already, the most it runs at once; retry when one ends`, {
      limit: "sandboxes.execsPerSandbox",
      retryAfterMs: 1000,
    });
  await checkTenantOutput(w, s.tenantId, caps);
  const commandId = await driver.exec(w, { id: s.instanceId, nodeId: inst.nodeId }, args);
  // The audit keeps what ran, not its input: stdin and env values may hold the tenant's secrets.
  w.audit({ targetId: sandboxId, tenantId: s.tenantId, details: { command: commandId, argv0: args.command[0], args: args.command.length - 1 } });
  return { commandId };
}

export interface ExecProgress {
  chunks: ExecChunk[];
  /**
   * Set once the command is over and every chunk up to its end has been read; `truncated`: output was dropped at
   * the cap; `refusal`: the API's error code for a failure the caller gets as an error instead of an end (by the
   * host's code, core/commands/exec.ts execRefusal).
   */
  end: { result: ExecResult | null; error: string | null; refusal: ErrorCode | null; truncated: boolean } | null;
}

/** Chunks after `afterSeq`, in order, and the end once the command finished (or was given up). */
export async function readExec(sql: Sql, commandId: string, afterSeq: number, now: Date): Promise<ExecProgress> {
  const cmd = await one<{ state: string; result: unknown; error: string | null; errorCode: RefusalCode | null; deadline: Date }>(
    sql,
    `SELECT state, result, error, error_code AS "errorCode", deadline FROM host_commands WHERE id = $1`,
    [commandId],
  );
  const chunks = await sql.query<ExecChunk>(`SELECT seq, stream, data FROM exec_output WHERE command_id = $1 AND seq > $2 ORDER BY seq LIMIT 500`, [
    commandId,
    afterSeq,
  ]);
  if (!cmd || chunks.length === 500) return { chunks, end: null };
  const { truncated } = tallyOf(cmd.result);
  if (cmd.state === "succeeded") {
    const r = execResult.safeParse(cmd.result);
    return {
      chunks,
      end: r.success
        ? { result: r.data, error: null, refusal: null, truncated }
        : { result: null, error: "the host reported an exec result that does not parse", refusal: null, truncated },
    };
  }
  if (cmd.state === "failed" || cmd.state === "expired" || cmd.state === "cancelled")
    return { chunks, end: { result: null, error: cmd.error ?? `the exec was ${cmd.state}`, refusal: execRefusal(cmd.errorCode), truncated } };
  if (cmd.deadline <= now) return { chunks, end: { result: null, error: "the host did not finish the exec before its deadline", refusal: null, truncated } };
  return { chunks, end: null };
}

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
