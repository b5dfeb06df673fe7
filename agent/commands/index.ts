import { setMaxListeners } from "node:events";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { commandKinds } from "../../contracts/commands.ts";
import { type CommandReport, commandReport, type ExecChunk, type HostCommand, hostCommand } from "../../contracts/host.ts";
import { tracePoint } from "../../contracts/trace.ts";
import type { InstanceLocks } from "../locks.ts";
import { sweepTemporaries } from "../runtimes/files.ts";
import type { Runtime } from "../runtimes/runtime.ts";
import { type CommandHandler, failed, type Outcome, type RunContext } from "./handler.ts";
import { handlerOf } from "./handlers.ts";
import { type CommandJournal, CommandJournals } from "./journal.ts";
import { Outbox } from "./outbox.ts";

export { EXEC_INTERRUPTED } from "./exec.ts";
export type { CommandJournal };

export interface CommandRunnerOptions {
  /** The agent's state dir: journals live in `<stateDir>/commands/<id>.json`. */
  stateDir: string;
  runtime: Runtime;
  /** Deliver a report to the server; resolving means the server has it. */
  send(report: CommandReport): Promise<void>;
  /** Deliver an exec's output, chunks in `seq` order; resolving means the server has them. Retried like `send`. */
  sendOutput(commandId: string, chunks: ExecChunk[]): Promise<void>;
  locks: InstanceLocks;
  /** A pause or resume arrived ahead of the spec generation that says the same (../converge.ts, `powerAhead`). */
  onPower?: (instanceId: string, generation: number) => void;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
  now?: () => number;
  /** Sending: each attempt bounded by `attemptMs`; between failures, a wait doubling from `firstMs` to `maxMs`. */
  retry?: { attemptMs?: number; firstMs?: number; maxMs?: number };
}

const DAY_MS = 24 * 60 * 60 * 1000;
type AnyHandler = CommandHandler<HostCommand["kind"]>;
const handlerFor = (cmd: HostCommand) => handlerOf(cmd.kind) as AnyHandler;
/** A report on a `bulk` command says so: the server takes it in its turn with API work (contracts/commands.ts, `lane`). */
const laneOf = (cmd: HostCommand) => (commandKinds[cmd.kind].lane === "bulk" ? { bulk: true } : {});
const finalReport = (j: CommandJournal): CommandReport => ({
  id: j.command.id,
  state: j.state,
  result: j.result,
  error: j.error,
  ...(j.code ? { code: j.code } : {}),
  ...laneOf(j.command),
});

/**
 * Runs host commands (contracts/commands.ts), each kind by its handler (./handlers.ts). What the contracts' table
 * journals runs at most once per id, across agent restarts, through a journal file per command: journalled
 * `running` before anything is done and acknowledged, so one the agent died in is run again (or, for a kind that
 * must not run twice, reported failed); a finished one only has its final report sent again. What it does not
 * journal goes straight to its handler. Reports go through the outbox (./outbox.ts); an exec's output the same way,
 * all of it before its final report.
 */
export class CommandRunner {
  private readonly journal: CommandJournals;
  private readonly now: () => number;
  private readonly log: NonNullable<CommandRunnerOptions["log"]>;
  private readonly outbox: Outbox;
  private readonly inflight = new Map<string, Promise<void>>();
  /** Commands of the kinds converge passes wait for (pauses and resumes), running now, with their reports. */
  private readonly ahead = new Set<Promise<void>>();
  /** Aborted when the agent leaves; every exec in flight listens on it (each removes its listener at its end). */
  private readonly leaving = unlimited(new AbortController());
  private readonly ctx: RunContext;

  constructor(o: CommandRunnerOptions) {
    this.journal = new CommandJournals(join(o.stateDir, "commands"));
    this.now = o.now ?? Date.now;
    this.log = o.log ?? (() => {});
    this.outbox = new Outbox({
      send: o.send,
      confirm: (id) => this.confirm(id),
      log: this.log,
      retry: { attemptMs: 10_000, firstMs: 250, maxMs: 30_000, ...o.retry },
    });
    const leaving = this.leaving.signal;
    this.ctx = {
      runtime: o.runtime,
      locks: o.locks,
      log: this.log,
      now: this.now,
      onPower: o.onPower,
      leaving,
      sendOutput: (id, chunks) => this.outbox.bounded(() => o.sendOutput(id, chunks), leaving),
      backoff: (failures) => this.outbox.backoff(failures, leaving),
    };
  }

  /** Take a command from the server. Settles when it has run (or been refused); its reports may still be on their way. */
  receive(raw: unknown): Promise<void> {
    const parsed = hostCommand.safeParse(raw);
    if (!parsed.success) {
      const id = commandReport.shape.id.safeParse((raw as { id?: unknown } | null)?.id);
      this.log("command refused: malformed", { id: id.data, err: parsed.error.message });
      // Deterministic: the same malformed command delivered again gets the same answer, so nothing is journalled.
      if (id.success) this.outbox.deliver({ id: id.data, ...failed(`malformed command: ${parsed.error.message}`, "invalid") });
      return Promise.resolve();
    }
    tracePoint("agent.command", `${parsed.data.kind} ${parsed.data.id}`);
    return this.once(parsed.data.id, () => this.handle(parsed.data));
  }

  /**
   * Run again the journalled commands the agent died running, whatever their deadline (they were started before
   * it), and report failed those of kinds that must not run twice. Call at start, before the first converge
   * pass: each command run again has taken its instance's lock by the time this settles, so the converger does
   * not touch a domain a save left stopped. They finish in the background.
   */
  async recover(): Promise<void> {
    sweepTemporaries(this.journal.dir);
    const held: Promise<void>[] = [];
    for (const j of await this.journal.all()) {
      if (j.state !== "running" || this.inflight.has(j.command.id)) continue;
      const { interrupted } = handlerFor(j.command);
      if (interrupted !== undefined) {
        held.push(this.once(j.command.id, () => this.finish(j, failed(interrupted))));
        continue;
      }
      this.log("command resumed after a restart", { id: j.command.id, kind: j.command.kind });
      let taken = () => {};
      held.push(new Promise<void>((r) => (taken = r)));
      void this.once(j.command.id, () => this.run(j, taken));
    }
    await Promise.all(held);
  }

  /** Send again every final report the server has not confirmed (call on reconnect). */
  async resendUnconfirmed(): Promise<void> {
    this.outbox.nudge();
    for (const j of await this.journal.all()) if (j.state !== "running" && !j.confirmed) this.outbox.deliver(finalReport(j));
  }

  /** Forget commands whose final report the server confirmed more than `maxAgeMs` ago. Returns how many. */
  async prune(maxAgeMs = DAY_MS): Promise<number> {
    let pruned = 0;
    for (const j of await this.journal.all()) {
      if (!j.confirmed || !j.finishedAt || this.now() - Date.parse(j.finishedAt) < maxAgeMs || this.inflight.has(j.command.id)) continue;
      await this.journal.remove(j.command.id);
      pruned++;
    }
    return pruned;
  }

  /**
   * Resolves once the command reports on their way when called have reached the server (or failed to), or
   * after `maxMs`. The agent's status reports wait on it: a command's outcome is what someone is waiting for (a
   * warm claim, a pause), and a status report sent beside it would only compete with it on the server.
   */
  reportsSent(maxMs: number): Promise<void> {
    return this.outbox.sent(maxMs);
  }

  /**
   * Resolves once the pauses and resumes under way when called have run and their reports have reached the
   * server, or after `maxMs`. The converger waits on it before a pass: a resume (what a warm claim waits on)
   * then has the hypervisor to itself, and its report the host's CPU, instead of competing with the pass's
   * look at every domain, which the spec change that comes with it sets off.
   */
  async powerDone(maxMs: number): Promise<void> {
    if (!this.ahead.size) return;
    await Promise.race([Promise.allSettled([...this.ahead]), sleep(maxMs, undefined, { ref: false })]);
  }

  /** Whether a command is running, or has a report not yet delivered. */
  busy(): boolean {
    return this.inflight.size > 0 || this.outbox.size > 0;
  }

  /** Resolves once every command taken so far has run. */
  async settled(): Promise<void> {
    while (this.inflight.size > 0) await Promise.allSettled([...this.inflight.values()]);
  }

  /**
   * Let running snapshots and restores finish, leave execs (the next start reports them failed), then stop
   * sending: what is unconfirmed is sent again after the next start.
   */
  async close(): Promise<void> {
    this.leaving.abort();
    await this.settled();
    await this.outbox.close();
  }

  private once(id: string, work: () => Promise<void>): Promise<void> {
    let p = this.inflight.get(id);
    if (!p) {
      p = work()
        .catch((e) => this.log("command could not be handled", { id, err: String(e) }))
        .finally(() => this.inflight.delete(id));
      this.inflight.set(id, p);
    }
    return p;
  }

  private async handle(cmd: HostCommand): Promise<void> {
    const handler = handlerFor(cmd);
    if (!commandKinds[cmd.kind].journalled) return this.atOnce(cmd, handler);
    const known = await this.journal.read(cmd.id);
    if (known && known.state !== "running") return this.outbox.deliver(finalReport(known));
    // Running in the journal but not in this process: an earlier one died in it.
    if (known && handler.interrupted !== undefined) return this.finish(known, failed(handler.interrupted));
    if (known) return this.run(known);
    const at = new Date(this.now()).toISOString();
    if (this.now() > Date.parse(cmd.deadline)) {
      const refused: CommandJournal = {
        command: cmd,
        ...failed(`not started: received at ${at}, after its deadline ${cmd.deadline}`, "expired"),
        confirmed: false,
        startedAt: at,
        finishedAt: at,
      };
      await this.journal.write(refused);
      return this.outbox.deliver(finalReport(refused));
    }
    const started: CommandJournal = { command: cmd, state: "running", result: null, error: null, confirmed: false, startedAt: at, finishedAt: null };
    await this.journal.write(started);
    return this.run(started);
  }

  /** A kind the contracts' table does not journal: straight to its handler, then its final report. */
  private atOnce(cmd: HostCommand, handler: AnyHandler): Promise<void> {
    const run = (async () => {
      const outcome = (await handler.run(cmd, this.ctx, null)) as Outcome;
      this.log(`command ${outcome.state}`, { id: cmd.id, kind: cmd.kind, error: outcome.error ?? undefined });
      this.outbox.deliver({ id: cmd.id, ...outcome, ...handler.report?.(cmd) });
    })();
    if (handler.passesWait) {
      const reported = run.then(() => this.outbox.delivered(cmd.id));
      this.ahead.add(reported);
      void reported.finally(() => this.ahead.delete(reported));
    }
    return run;
  }

  /** Acknowledge a journalled command and run it by its handler; `taken` is called once it holds its instance. */
  private async run(j: CommandJournal, taken: () => void = () => {}): Promise<void> {
    const { command } = j;
    this.outbox.deliver({ id: command.id, state: "running", result: null, error: null, ...laneOf(command) });
    const pin = (pinned: CommandJournal["pinned"]) => this.journal.write({ ...j, pinned });
    const outcome = await handlerFor(command).run(command, this.ctx, { journal: j, taken, pin });
    // Null: the agent is leaving, and the command stays journalled running (the next start reports it).
    if (outcome) await this.finish(j, outcome);
  }

  /** Journal the outcome, then queue its report. */
  private async finish(j: CommandJournal, outcome: Outcome): Promise<void> {
    const finished: CommandJournal = { ...j, ...outcome, finishedAt: new Date(this.now()).toISOString() };
    this.log(`command ${finished.state}`, { id: j.command.id, kind: j.command.kind, error: finished.error ?? undefined });
    await this.journal.write(finished);
    this.outbox.deliver(finalReport(finished));
  }

  private async confirm(id: string): Promise<void> {
    const j = await this.journal.read(id);
    if (j && j.state !== "running" && !j.confirmed) await this.journal.write({ ...j, confirmed: true });
  }
}

/** An abort controller whose signal takes any number of listeners: one per exec in flight is not a leak. */
function unlimited(c: AbortController): AbortController {
  setMaxListeners(0, c.signal);
  return c;
}
