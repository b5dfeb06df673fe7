import { EXEC_GRACE_MS, EXEC_MAX_MS } from "../../contracts/commands.ts";
import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { ExecChunk } from "../../contracts/host.ts";
import { one } from "../kernel/db.ts";
import type { Write } from "../kernel/write.ts";

/**
 * What an exec's output may cost the database (docs/architecture.md, Sandboxes: Exec). Per exec, at most
 * `execOutputBytes` is stored, counting each chunk's UTF-8 bytes and 64 for its row (so output written a byte at
 * a time cannot make a million rows of one), its truncation note included; what comes later is dropped, whatever
 * the host keeps sending. Per tenant, the output kept at once is bounded by `tenantExecOutputBytes`: a new exec is
 * refused while the tenant's kept output, each unfinished exec counted at the full per-exec cap, leaves no room.
 *
 * The tally lives in the command's `result` under `output` ({ bytes, truncated }) while it runs; the host's final
 * result is merged over it (core/commands/commands.ts, commandReportStatement), so the exec's end still says it was truncated.
 */
export interface ExecOutputCaps {
  execOutputBytes: number;
  tenantExecOutputBytes: number;
  /** Execs one sandbox runs at once, as a guest's agent takes so many: a burst waits its turn (RATE_LIMITED). */
  execsPerSandbox: number;
}

export const EXEC_OUTPUT_CAPS: ExecOutputCaps = { execOutputBytes: 1024 * 1024, tenantExecOutputBytes: 64 * 1024 * 1024, execsPerSandbox: 16 };

/** How long an exec's output is kept once the command finished: watchers that reconnect within it read it all. */
export const EXEC_OUTPUT_KEEP_MS = 60 * 60_000;
/** The longest an exec runs (its timeoutSeconds at most), and how long past it its host has to report it: the exec kind's (contracts/commands.ts). */
export { EXEC_GRACE_MS, EXEC_MAX_MS };

/** What a stored chunk costs beyond its data: its row. */
const CHUNK_COST = 64;
/** Room kept for the note that says where the output was cut. */
const NOTE_ROOM = 256;
/** Chunks are numbered in an int4 column; the largest is kept free for the note after a chunk cut there. */
const MAX_SEQ = 2_147_483_646;

export interface OutputTally {
  bytes: number;
  truncated: boolean;
}

/** The tally a command's result holds (none yet: nothing stored). */
export function tallyOf(result: unknown): OutputTally {
  const o = (result as { output?: Partial<OutputTally> } | null)?.output;
  return { bytes: Number(o?.bytes ?? 0), truncated: o?.truncated === true };
}

/** The longest prefix of `s` of at most `max` UTF-8 bytes, never between the halves of a character. */
function utf8Prefix(s: string, max: number): string {
  let bytes = 0;
  let end = 0;
  for (const ch of s) {
    const n = Buffer.byteLength(ch);
    if (bytes + n > max) break;
    bytes += n;
    end += ch.length;
  }
  return s.slice(0, end);
}

/**
 * A host's output chunks for one of its node's exec commands (agents batch them, so one audit row covers many).
 * The command's row is locked first: batches of one exec are counted one after another, however a host sends them.
 */
export async function recordExecOutput(w: Write, nodeId: string, commandId: string, chunks: ExecChunk[], capBytes: number): Promise<boolean> {
  const cmd = await one<{ kind: string; result: unknown }>(w.sql, `SELECT kind, result FROM host_commands WHERE id = $1 AND node_id = $2 FOR NO KEY UPDATE`, [
    commandId,
    nodeId,
  ]);
  if (cmd?.kind !== "instance.exec") throw notFound("exec command", commandId);
  if (chunks.some((c) => c.seq > MAX_SEQ)) throw invalid(`chunks.seq: at most ${MAX_SEQ}`, { path: "chunks" });
  const tally = tallyOf(cmd.result);
  // A chunk sent again (a batch retried after its answer was lost) is stored, and counted, once.
  const seqs = [...new Set(chunks.map((c) => c.seq))];
  const stored = new Set(
    tally.truncated || !seqs.length
      ? []
      : (await w.sql.query<{ seq: number }>(`SELECT seq FROM exec_output WHERE command_id = $1 AND seq = ANY($2::int[])`, [commandId, seqs])).map((r) => r.seq),
  );
  const keep: ExecChunk[] = [];
  const room = capBytes - NOTE_ROOM;
  for (const c of [...chunks].sort((a, b) => a.seq - b.seq)) {
    if (tally.truncated) break;
    if (stored.has(c.seq)) continue;
    stored.add(c.seq);
    const cost = CHUNK_COST + Buffer.byteLength(c.data);
    if (tally.bytes + cost <= room) {
      keep.push(c);
      tally.bytes += cost;
      continue;
    }
    const head = utf8Prefix(c.data, room - tally.bytes - CHUNK_COST);
    if (head) keep.push({ ...c, data: head });
    const note = { seq: head ? c.seq + 1 : c.seq, stream: "stderr" as const, data: `\n[output truncated: an exec keeps at most ${capBytes} bytes]\n` };
    keep.push(note);
    tally.bytes += (head ? CHUNK_COST + Buffer.byteLength(head) : 0) + CHUNK_COST + Buffer.byteLength(note.data);
    tally.truncated = true;
  }
  if (!keep.length) {
    // Past the cap, or all sent before: nothing changes, and a host that keeps sending fills no audit log.
    w.unchanged();
    return true;
  }
  await w.sql.query(
    `INSERT INTO exec_output (command_id, seq, stream, data, at)
     SELECT $1, c.seq, c.stream, c.data, $5 FROM unnest($2::int[], $3::text[], $4::text[]) AS c(seq, stream, data) ON CONFLICT DO NOTHING`,
    [commandId, keep.map((c) => c.seq), keep.map((c) => c.stream), keep.map((c) => c.data), w.now],
  );
  await w.sql.query(`UPDATE host_commands SET result = COALESCE(result, '{}'::jsonb) || jsonb_build_object('output', $2::jsonb) WHERE id = $1`, [
    commandId,
    JSON.stringify(tally),
  ]);
  w.audit({ targetId: commandId, details: { chunks: keep.length, ...(tally.truncated ? { truncated: true } : {}) } });
  w.execOutput(commandId);
  return true;
}

/**
 * Refuse a new exec while the tenant's kept exec output leaves no room for one more at the full per-exec cap.
 * Execs are found through the tenant's sandboxes whose deadline is recent enough for output to be kept: an exec
 * runs at most an hour (and its grace) in a running sandbox, and its output is kept an hour after it ends.
 */
export async function checkTenantOutput(w: Write, tenantId: string, caps: ExecOutputCaps): Promise<void> {
  // One request of a tenant at a time takes the last room, so two cannot both take it.
  await w.sql.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [`exec-output:${tenantId}`]);
  const keptSince = new Date(w.now.getTime() - EXEC_OUTPUT_KEEP_MS);
  const [row] = await w.sql.query<{ used: string }>(
    `SELECT COALESCE(sum(CASE WHEN c.finished_at IS NULL THEN GREATEST($4::bigint, COALESCE((c.result->'output'->>'bytes')::bigint, 0))
                              ELSE COALESCE((c.result->'output'->>'bytes')::bigint, 0) END), 0)::text AS used
       FROM sandboxes s JOIN host_commands c ON c.instance_id = s.instance_id AND c.kind = 'instance.exec'
      WHERE s.tenant_id = $1 AND s.expires_at >= $2 AND (c.finished_at IS NULL OR c.finished_at >= $3)`,
    [tenantId, new Date(keptSince.getTime() - EXEC_MAX_MS - EXEC_GRACE_MS), keptSince, caps.execOutputBytes],
  );
  const used = Number(row?.used ?? 0);
  if (used + caps.execOutputBytes > caps.tenantExecOutputBytes)
    throw new AppError(
      "RATE_LIMITED",
      `the tenant's exec output kept (${used} bytes, running execs counted at ${caps.execOutputBytes}) leaves no room for another exec; output is kept an hour after its exec ends`,
      { limit: "sandboxes.tenantExecOutputBytes", usedBytes: used, limitBytes: caps.tenantExecOutputBytes },
    );
}
