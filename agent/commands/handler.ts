import type { HostCommandKind, RefusalCode } from "../../contracts/commands.ts";
import type { CommandReport, ExecChunk, HostCommandOf } from "../../contracts/host.ts";
import type { InstanceLocks } from "../locks.ts";
import { type DomainStatus, type Runtime, RuntimeError } from "../runtimes/runtime.ts";
import type { CommandJournal } from "./journal.ts";

/**
 * What a handler of host commands is (one per family: ./power.ts, ./snapshot.ts, ./exec.ts; listed by kind in
 * ./handlers.ts). The runner (./index.ts) does what is common — journal, acknowledgement, deadline, delivery —
 * as the contracts' table (contracts/commands.ts) says for the kind, and asks the handler only to run it.
 */

/** How a command ended, as its journal and final report say it. */
export type Outcome = Pick<CommandJournal, "state" | "result" | "error" | "code">;

export const succeeded = (result: Record<string, unknown>): Outcome => ({ state: "succeeded", result, error: null });
/** A refusal or failure: the runtime's message for people, its code for the server (anything else is `internal`). */
export const failed = (e: unknown, code?: RefusalCode): Outcome => ({
  state: "failed",
  result: null,
  error: (e instanceof Error ? e.message : String(e)).slice(0, 4000),
  code: code ?? (e instanceof RuntimeError ? e.code : "internal"),
});

/** What every handler may use of the agent. */
export interface RunContext {
  runtime: Runtime;
  locks: InstanceLocks;
  log: (msg: string, fields?: Record<string, unknown>) => void;
  now: () => number;
  /** A pause or resume arrived ahead of the spec generation that says the same (../converge.ts, `powerAhead`). */
  onPower?: (instanceId: string, generation: number) => void;
  /** Aborted when the agent leaves: long work (an exec) stops waiting and stays journalled running. */
  leaving: AbortSignal;
  /** One delivery of an exec's output, bounded in time and given up when the agent leaves. */
  sendOutput(commandId: string, chunks: ExecChunk[]): Promise<void>;
  /** The wait after `failures` failed deliveries, cut short when the agent leaves or reconnects. */
  backoff(failures: number): Promise<void>;
}

/** A journalled command's run: its journal, and what the runner wants to hear as it goes. */
export interface Job {
  journal: CommandJournal;
  /** Call once the command holds its instance (a command run again at start: the first pass waits for it). */
  taken(): void;
  /** Keep the domain as it was before the command began, in the journal (reports show it so while it runs, also after a crash). */
  pin(status: DomainStatus): Promise<void>;
}

/** `in`: a handler of several kinds (a family) is a handler of each of them. */
export interface CommandHandler<in K extends HostCommandKind> {
  /**
   * Run the command. Resolves with its outcome (never rejects for the runtime's refusal: that is a `failed`
   * outcome), or with null when the agent is leaving and the command is left journalled running. `job`: its
   * journal's, for a kind the contracts' table journals (null otherwise).
   */
  run(cmd: HostCommandOf<K>, ctx: RunContext, job: Job | null): Promise<Outcome | null>;
  /**
   * A journalled kind that must not run twice: found running in its journal at start (the agent died in it),
   * it is reported failed with this message instead of run again.
   */
  readonly interrupted?: string;
  /** What its final report adds (a pause's or resume's `power`, which lets the server settle it in one message). */
  report?(cmd: HostCommandOf<K>): Partial<CommandReport>;
  /** Converge passes wait (up to a second) for commands of this kind and their reports: they have the hypervisor to themselves. */
  readonly passesWait?: boolean;
}
