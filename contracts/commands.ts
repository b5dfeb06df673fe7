import { z } from "zod";

/**
 * The host commands' table (docs/architecture.md, "The host protocol"): one entry per kind with what the server
 * and the agent must agree on — its arguments, what its success carries, its lane on the server, whether the
 * host journals and acknowledges it, and its deadline. The server's side of each kind is in core/commands/ (its
 * table: kinds.ts), the agent's in agent/commands/ (handlers.ts); each covers exactly these kinds.
 */

const instanceId = z.string().regex(/^inst_[a-z2-7]{52}$/);

/**
 * Why a host refused or failed a command, in a fixed vocabulary the server maps (its message is for people):
 * `unsupported`: this host cannot do it at all (no guest agent, no bubblewrap, a trait its runtime lacks);
 * `not-running`: the domain is not in a power state the operation needs; `not-found`: no such domain or snapshot
 * on this host; `invalid`: the request itself is malformed; `expired`: received past its deadline, not started;
 * `internal`: anything else (the hypervisor failed, the agent restarted under it).
 */
export const refusalCodes = ["unsupported", "not-running", "not-found", "invalid", "expired", "internal"] as const;
export type RefusalCode = (typeof refusalCodes)[number];

/** The longest an exec runs, and how long past its timeout its host has to report it. */
export const EXEC_MAX_MS = 3_600_000;
export const EXEC_GRACE_MS = 30_000;
/** How long a pause or resume may wait to be taken: past it the spec, which asks for the same power state, does the job. */
export const POWER_COMMAND_MS = 60_000;

/**
 * A pause's or resume's instance, and the node spec generation that says the same (the write that queued the
 * command made it). The command arrives ahead of that spec: until the host has it, a converge pass on an older
 * spec would undo the command, so it leaves the instance alone. Absent from an older server's commands.
 */
export const powerArgs = z.object({ instanceId, generation: z.number().int().nonnegative().optional() });

export const snapshotRef = z.object({ instanceId, snapshotId: z.string().regex(/^snap_[a-z2-7]+$/) });

export const execRequest = z.object({
  instanceId,
  /** argv: the program and its arguments (looked up in PATH when it has no slash). */
  command: z.array(z.string().max(65_536)).min(1).max(1024),
  /** Added to the guest's environment (the template's env, then the request's). */
  env: z.record(z.string(), z.string()).default({}),
  stdin: z.string().max(1_048_576).nullable().default(null),
  timeoutMs: z.number().int().min(1).max(EXEC_MAX_MS),
  /** The most output (UTF-8 bytes) the server keeps of it: the host need send no more. Absent from an older server's commands. */
  outputBytes: z.number().int().min(1).optional(),
});
export type ExecRequest = z.infer<typeof execRequest>;

/** A piece of a running command's output, in order per command (`seq` from 0). UTF-8 text. */
export const execChunk = z.object({ seq: z.number().int().min(0), stream: z.enum(["stdout", "stderr"]), data: z.string().max(1_048_576) });
export type ExecChunk = z.infer<typeof execChunk>;

/** How an exec ended: its exit code, or the signal that killed it (a timeout kills it). */
export const execResult = z.object({ exitCode: z.number().int().nullable(), signal: z.string().nullable(), timedOut: z.boolean() });
export type ExecResult = z.infer<typeof execResult>;

export const snapshotResult = z.object({ sizeBytes: z.number().int().min(0) });
const nothing = z.object({});

export interface CommandKind<A extends z.ZodType = z.ZodType, R extends z.ZodType = z.ZodType> {
  args: A;
  /** What a `succeeded` report's result holds. */
  result: R;
  /**
   * `host`: the server takes its reports ahead of API work, as the host's own state; `bulk`: a tenant's work on a
   * host's credential, taken in its turn with API work (the reports say so: CommandReport's `bulk`).
   */
  lane: "host" | "bulk";
  /**
   * Journalled by id on the host and acknowledged (`running`) before it runs, so it runs at most once across
   * restarts. A kind that is not must be harmless to run twice and quick: it goes straight to the runtime.
   */
  journalled: boolean;
  /** Its deadline, from when it is queued: `configuredMs` is the deployment's `hosts.commandTimeoutMs`. */
  timeoutMs(args: z.output<A>, configuredMs: number): number;
}

const kind = <A extends z.ZodType, R extends z.ZodType>(k: CommandKind<A, R>) => k;

export const commandKinds = {
  /** Save the instance's memory and disk as `snapshotId`, kept on this host; the instance keeps its power state. */
  "instance.snapshot": kind({ args: snapshotRef, result: snapshotResult, lane: "host", journalled: true, timeoutMs: (_a, configured) => configured }),
  /** Put the instance back to `snapshotId` (its memory and disk as saved); it runs on from there. */
  "instance.restore": kind({ args: snapshotRef, result: nothing, lane: "host", journalled: true, timeoutMs: (_a, configured) => configured }),
  /**
   * Run a command in the guest. Output goes back as ExecChunks while it runs; the final report's result is an
   * execResult. Past `timeoutMs` the command is killed. Journalled so it never runs twice: one found running
   * after a restart is reported failed (its output is lost).
   */
  "instance.exec": kind({ args: execRequest, result: execResult, lane: "bulk", journalled: true, timeoutMs: (a) => a.timeoutMs + EXEC_GRACE_MS }),
  /**
   * Resume a paused instance now (a warm sandbox just claimed, or a resume asked for): straight to the host,
   * ahead of the spec that also says so, so it does not wait for a converge pass and a report.
   */
  "instance.resume": kind({ args: powerArgs, result: nothing, lane: "host", journalled: false, timeoutMs: () => POWER_COMMAND_MS }),
  /** Pause a running instance now, the same way. */
  "instance.pause": kind({ args: powerArgs, result: nothing, lane: "host", journalled: false, timeoutMs: () => POWER_COMMAND_MS }),
};

export type HostCommandKind = keyof typeof commandKinds;
export const hostCommandKinds = Object.keys(commandKinds) as HostCommandKind[];
export type CommandArgs<K extends HostCommandKind> = z.output<(typeof commandKinds)[K]["args"]>;
export type CommandResult<K extends HostCommandKind> = z.output<(typeof commandKinds)[K]["result"]>;
