import { setMaxListeners } from "node:events";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { type CommandReport, commandReport, type ExecChunk, type HostCommand, hostCommand } from "../contracts/host.ts";
import { tracePoint } from "../contracts/trace.ts";
import { type CommandJournal, CommandJournals } from "./command-journal.ts";
import { ExecOutput } from "./exec-output.ts";
import type { InstanceLocks } from "./locks.ts";
import { sweepTemporaries } from "./runtimes/files.ts";
import type { Runtime } from "./runtimes/runtime.ts";

export interface CommandRunnerOptions {
  /** The agent's state dir: journals live in `<stateDir>/commands/<id>.json`. */
  stateDir: string;
  runtime: Runtime;
  /** Deliver a report to the server; resolving means the server has it. */
  send(report: CommandReport): Promise<void>;
  /** Deliver an exec's output, chunks in `seq` order; resolving means the server has them. Retried like `send`. */
  sendOutput(commandId: string, chunks: ExecChunk[]): Promise<void>;
  locks: InstanceLocks;
  /** A pause or resume arrived ahead of the spec generation that says the same (./converge.ts, `powerAhead`). */
  onPower?: (instanceId: string, generation: number) => void;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
  now?: () => number;
  /** Sending: each attempt bounded by `attemptMs`; between failures, a wait doubling from `firstMs` to `maxMs`. */
  retry?: { attemptMs?: number; firstMs?: number; maxMs?: number };
}

export type { CommandJournal };

const DAY_MS = 24 * 60 * 60 * 1000;
type ExecCommand = Extract<HostCommand, { kind: "instance.exec" }>;
type PowerCommand = Extract<HostCommand, { kind: "instance.resume" | "instance.pause" }>;
type Outcome = Pick<CommandJournal, "state" | "result" | "error">;
/** Why an exec found running in a journal at start is not run again: its output so far is lost. */
export const EXEC_INTERRUPTED = "the agent restarted while the command ran";
/** Thrown into an exec the runner stops waiting for because it is closing. */
const LEAVING = new Error("the agent is closing");
/** An exec's reports say so: the server takes a tenant's exec in its turn with API work (contracts/host.ts, `bulk`). */
const bulkOf = (kind: string) => (kind === "instance.exec" ? { bulk: true } : {});
const finalReport = (j: CommandJournal): CommandReport => ({ id: j.command.id, state: j.state, result: j.result, error: j.error, ...bulkOf(j.command.kind) });
const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e)).slice(0, 4000);

/**
 * Runs host commands (contracts/host.ts): at most once per id, across agent restarts, through a journal file
 * per command (a resume, harmless to repeat, goes without: see `resume`). A command is journalled `running`
 * before anything is done, so a snapshot or restore the agent died in is run again (the runtime's operations
 * are idempotent by snapshot id); an exec is not (running a command twice is not harmless, and its output is
 * lost): it is reported failed. A finished one only has its final report sent again. Reports are sent with retries that never hold up another command or the command's
 * own work; an exec's output goes the same way, all of it before its final report.
 *
 * Snapshot and restore hold their instance's lock while they run. An exec does not: it can last an hour, and
 * holding the lock would stop convergence of its instance for that long (a stop or delete of the sandbox
 * would wait for the command) and run one instance's execs one after another. It only waits for the commands
 * ahead of it on the instance (a snapshot keeps the domain off for a moment) before it starts.
 */
export class CommandRunner {
  private readonly journal: CommandJournals;
  private readonly now: () => number;
  private readonly log: NonNullable<CommandRunnerOptions["log"]>;
  private readonly retry: Required<NonNullable<CommandRunnerOptions["retry"]>>;
  private readonly inflight = new Map<string, Promise<void>>();
  /** The pauses and resumes running now. */
  private readonly power = new Set<Promise<void>>();
  /** Per command, the newest report not yet delivered and the loop delivering it. */
  private readonly outbox = new Map<string, { report: CommandReport; done: Promise<void> }>();
  private readonly closing = new AbortController();
  /** Aborted first on close: execs are left as they are (journalled running, so the next start reports them). */
  /** Aborted when the agent leaves; every exec in flight listens on it (each removes its listener at its end). */
  private readonly leaving = unlimited(new AbortController());
  /** Cuts every backoff short (a reconnect: the server is likely reachable again). */
  private nudge = new AbortController();

  constructor(private readonly o: CommandRunnerOptions) {
    this.journal = new CommandJournals(join(o.stateDir, "commands"));
    this.now = o.now ?? Date.now;
    this.log = o.log ?? (() => {});
    this.retry = { attemptMs: 10_000, firstMs: 250, maxMs: 30_000, ...o.retry };
  }

  /** Take a command from the server. Settles when it has run (or been refused); its reports may still be on their way. */
  receive(raw: unknown): Promise<void> {
    const parsed = hostCommand.safeParse(raw);
    if (!parsed.success) {
      const id = commandReport.shape.id.safeParse((raw as { id?: unknown } | null)?.id);
      this.log("command refused: malformed", { id: id.data, err: parsed.error.message });
      // Deterministic: the same malformed command delivered again gets the same answer, so nothing is journalled.
      if (id.success) this.deliver({ id: id.data, state: "failed", result: null, error: `malformed command: ${messageOf(parsed.error)}` });
      return Promise.resolve();
    }
    tracePoint("agent.command", `${parsed.data.kind} ${parsed.data.id}`);
    return this.once(parsed.data.id, () => this.handle(parsed.data));
  }

  /**
   * Run again the snapshots and restores the agent died running, whatever their deadline (they were started
   * before it), and report the execs it died running failed. Call at start, before the first converge pass:
   * each command run again has taken its instance's lock by the time this settles, so the converger does not
   * touch a domain a save left stopped. They finish in the background.
   */
  async recover(): Promise<void> {
    sweepTemporaries(this.journal.dir);
    const held: Promise<void>[] = [];
    for (const j of await this.journal.all()) {
      if (j.state !== "running" || this.inflight.has(j.command.id)) continue;
      if (j.command.kind === "instance.exec") {
        held.push(this.once(j.command.id, () => this.finish(j, { state: "failed", result: null, error: EXEC_INTERRUPTED })));
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
    this.nudge.abort();
    this.nudge = new AbortController();
    for (const j of await this.journal.all()) if (j.state !== "running" && !j.confirmed) this.deliver(finalReport(j));
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
  async reportsSent(maxMs: number): Promise<void> {
    const pending = [...this.outbox.values()].map((b) => b.done);
    if (!pending.length) return;
    await Promise.race([Promise.allSettled(pending), sleep(maxMs, undefined, { ref: false })]);
  }

  /**
   * Resolves once the pauses and resumes under way when called have run and their reports have reached the
   * server, or after `maxMs`. The converger waits on it before a pass: a resume (what a warm claim waits on)
   * then has the hypervisor to itself, and its report the host's CPU, instead of competing with the pass's
   * look at every domain, which the spec change that comes with it sets off.
   */
  async powerDone(maxMs: number): Promise<void> {
    if (!this.power.size) return;
    await Promise.race([Promise.allSettled([...this.power]), sleep(maxMs, undefined, { ref: false })]);
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
    this.closing.abort();
    await Promise.allSettled([...this.outbox.values()].map((b) => b.done));
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
    if (cmd.kind === "instance.resume" || cmd.kind === "instance.pause") {
      const run = this.runPower(cmd);
      const reported = run.then(() => this.outbox.get(cmd.id)?.done);
      this.power.add(reported);
      void reported.finally(() => this.power.delete(reported));
      return run;
    }
    const known = await this.journal.read(cmd.id);
    if (known && known.state !== "running") return this.deliver(finalReport(known));
    // Running in the journal but not in this process: an earlier one died in it.
    if (known?.command.kind === "instance.exec") return this.finish(known, { state: "failed", result: null, error: EXEC_INTERRUPTED });
    if (known) return this.run(known);
    const at = new Date(this.now()).toISOString();
    if (this.now() > Date.parse(cmd.deadline)) {
      const refused: CommandJournal = {
        command: cmd,
        state: "failed",
        result: null,
        error: `not started: received at ${at}, after its deadline ${cmd.deadline}`,
        confirmed: false,
        startedAt: at,
        finishedAt: at,
      };
      await this.journal.write(refused);
      return this.deliver(finalReport(refused));
    }
    const started: CommandJournal = { command: cmd, state: "running", result: null, error: null, confirmed: false, startedAt: at, finishedAt: null };
    await this.journal.write(started);
    return this.run(started);
  }

  /**
   * A resume (which a warm claim waits on) or a pause takes the shortest path: no journal and no
   * acknowledgement, since running it twice is harmless (the runtime's pause and resume are idempotent, and the
   * server sends an unfinished one again after a restart) and it is over before either would arrive. Its
   * instance is taken at once, before anything is awaited, so the spec change that comes with it finds it held
   * and the converger leaves it to this command instead of listing the host's domains ahead of it.
   */
  private async runPower(cmd: PowerCommand): Promise<void> {
    // Quiet: the command's own report settles the instance's state, and the spec that says the same follows.
    const lease = await this.o.locks.acquire(cmd.args.instanceId, { quiet: true });
    if (cmd.args.generation !== undefined) this.o.onPower?.(cmd.args.instanceId, cmd.args.generation);
    let outcome: Outcome;
    try {
      if (this.now() > Date.parse(cmd.deadline)) throw new Error(`not started: received after its deadline ${cmd.deadline}`);
      if (cmd.kind === "instance.pause") await this.o.runtime.pause(cmd.args.instanceId);
      else await this.o.runtime.resume(cmd.args.instanceId);
      outcome = { state: "succeeded", result: {}, error: null };
    } catch (e) {
      outcome = { state: "failed", result: null, error: messageOf(e) };
    } finally {
      lease.release();
    }
    this.log(`command ${outcome.state}`, { id: cmd.id, kind: cmd.kind, error: outcome.error ?? undefined });
    this.deliver({ id: cmd.id, ...outcome, power: { kind: cmd.kind, instanceId: cmd.args.instanceId } });
  }

  /** Run a journalled command under its instance's lock; `taken` is called once the lock is held. */
  private async run(j: CommandJournal, taken: () => void = () => {}): Promise<void> {
    const { command } = j;
    if (command.kind === "instance.exec") return this.runExec(j, command);
    this.deliver({ id: command.id, state: "running", result: null, error: null });
    const lease = await this.o.locks.acquire(command.args.instanceId);
    // Reports show a snapshotted or restored domain as it was when the command began: on a run after a crash,
    // as the journal remembers it (the domain itself may be halfway, a save leaves it off), pinned before
    // anything else can look.
    if (j.pinned) lease.pin(j.pinned);
    taken();
    let outcome: Outcome;
    try {
      if (!j.pinned && command.kind !== "instance.resume" && command.kind !== "instance.pause") {
        const before = (await this.o.runtime.list()).find((d) => d.id === command.args.instanceId);
        if (before) {
          lease.pin(before);
          await this.journal.write({ ...j, pinned: before });
        }
      }
      outcome = { state: "succeeded", result: await this.execute(command), error: null };
    } catch (e) {
      outcome = { state: "failed", result: null, error: messageOf(e) };
    } finally {
      lease.release();
    }
    await this.finish(j, outcome);
  }

  /** Run an exec (not under its instance's lock: see the class comment) and deliver its output, then its result. */
  private async runExec(j: CommandJournal, cmd: ExecCommand): Promise<void> {
    const { instanceId, outputBytes, ...req } = cmd.args;
    this.deliver({ id: cmd.id, state: "running", result: null, error: null, ...bulkOf(cmd.kind) });
    // Taken and given back at once: only the wait for a snapshot or restore already holding it matters.
    (await this.o.locks.acquire(instanceId, { quiet: true })).release();
    if (this.leaving.signal.aborted) return;
    const output = new ExecOutput({
      attempt: (chunks) => this.bounded(() => this.o.sendOutput(cmd.id, chunks), this.leaving.signal),
      backoff: (failures) => this.backoff(failures, this.leaving.signal),
      stop: this.leaving.signal,
      onRetry: (e) => this.log("exec output not delivered, will retry", { id: cmd.id, err: String(e) }),
      maxBytes: outputBytes,
    });
    let outcome: Outcome;
    try {
      const result = await this.unlessLeaving(this.o.runtime.exec(instanceId, req, (stream, data) => output.push(stream, data)));
      outcome = { state: "succeeded", result, error: null };
    } catch (e) {
      if (e === LEAVING) return;
      // The output before the refusal still goes first: it may say why.
      outcome = { state: "failed", result: null, error: messageOf(e) };
    }
    try {
      await output.end();
    } catch {
      return; // closing: left running in the journal
    }
    await this.finish(j, outcome);
  }

  /** Journal the outcome, then queue its report. */
  private async finish(j: CommandJournal, outcome: Outcome): Promise<void> {
    const finished: CommandJournal = { ...j, ...outcome, finishedAt: new Date(this.now()).toISOString() };
    this.log(`command ${finished.state}`, { id: j.command.id, kind: j.command.kind, error: finished.error ?? undefined });
    await this.journal.write(finished);
    this.deliver(finalReport(finished));
  }

  /** `work`'s outcome, or LEAVING as soon as the runner closes (the work goes on, unobserved). */
  private unlessLeaving<T>(work: Promise<T>): Promise<T> {
    const signal = this.leaving.signal;
    return new Promise<T>((resolve, reject) => {
      const leave = () => reject(LEAVING);
      if (signal.aborted) leave();
      signal.addEventListener("abort", leave, { once: true });
      work.then(resolve, reject).finally(() => signal.removeEventListener("abort", leave));
    });
  }

  private async execute(cmd: Exclude<HostCommand, ExecCommand>): Promise<Record<string, unknown>> {
    switch (cmd.kind) {
      case "instance.snapshot": {
        const { sizeBytes } = await this.o.runtime.snapshot(cmd.args.instanceId, cmd.args.snapshotId);
        return { sizeBytes };
      }
      case "instance.restore":
        await this.o.runtime.restore(cmd.args.instanceId, cmd.args.snapshotId);
        return {};
      case "instance.resume":
        await this.o.runtime.resume(cmd.args.instanceId);
        return {};
      case "instance.pause":
        await this.o.runtime.pause(cmd.args.instanceId);
        return {};
    }
  }

  /**
   * Queue a report. One delivery loop per command: a final report replaces a `running` one not yet sent (the
   * server needs only the newest), and a `running` one never replaces a final one.
   */
  private deliver(report: CommandReport): void {
    const box = this.outbox.get(report.id);
    if (box) {
      if (box.report.state === "running") box.report = report;
      return;
    }
    const entry = { report, done: Promise.resolve() };
    this.outbox.set(report.id, entry);
    entry.done = this.pump(entry);
  }

  private async pump(entry: { report: CommandReport }): Promise<void> {
    for (let failures = 0; !this.closing.signal.aborted; ) {
      const report = entry.report;
      try {
        tracePoint("agent.report", `${report.state} ${report.id}`);
        await this.bounded(() => this.o.send(report), this.closing.signal);
        if (report.state !== "running") await this.confirm(report.id);
        if (entry.report === report) break;
        failures = 0;
      } catch (e) {
        if (this.closing.signal.aborted) break;
        this.log("command report not delivered, will retry", { id: report.id, state: report.state, err: String(e) });
        await this.backoff(failures++, this.closing.signal);
      }
    }
    this.outbox.delete(entry.report.id);
  }

  /** One send, bounded: a server that never answers must not hold a report (or output) forever. */
  private bounded(send: () => Promise<void>, stop: AbortSignal): Promise<void> {
    if (stop.aborted) return Promise.reject(new Error("closing"));
    const bound = AbortSignal.any([stop, AbortSignal.timeout(this.retry.attemptMs)]);
    return new Promise<void>((resolve, reject) => {
      const end = () => reject(new Error(stop.aborted ? "closing" : `no answer within ${this.retry.attemptMs} ms`));
      bound.addEventListener("abort", end, { once: true });
      send()
        .then(resolve, reject)
        .finally(() => bound.removeEventListener("abort", end));
    });
  }

  /** The wait after `failures` failed sends, cut short by `stop` or a reconnect. */
  private async backoff(failures: number, stop: AbortSignal): Promise<void> {
    const wait = Math.min(this.retry.maxMs, this.retry.firstMs * 2 ** failures);
    await sleep(wait, undefined, { signal: AbortSignal.any([stop, this.nudge.signal]) }).catch(() => {});
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
