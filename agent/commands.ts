import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { type CommandReport, commandReport, type HostCommand, hostCommand } from "../contracts/host.ts";
import type { InstanceLocks } from "./locks.ts";
import { PRIVATE_DIR, PRIVATE_FILE, sweepTemporaries } from "./runtimes/files.ts";
import type { Runtime } from "./runtimes/runtime.ts";

export interface CommandRunnerOptions {
  /** The agent's state dir: journals live in `<stateDir>/commands/<id>.json`. */
  stateDir: string;
  runtime: Runtime;
  /** Deliver a report to the server; resolving means the server has it. */
  send(report: CommandReport): Promise<void>;
  locks: InstanceLocks;
  log?: (msg: string, fields?: Record<string, unknown>) => void;
  now?: () => number;
  /** Sending: each attempt bounded by `attemptMs`; between failures, a wait doubling from `firstMs` to `maxMs`. */
  retry?: { attemptMs?: number; firstMs?: number; maxMs?: number };
}

/** What the host remembers of a command, so a command delivered again (after any restart) runs once. */
export interface CommandJournal {
  command: HostCommand;
  state: CommandReport["state"];
  result: Record<string, unknown> | null;
  error: string | null;
  /** The server has the final report. */
  confirmed: boolean;
  startedAt: string;
  finishedAt: string | null;
}

const DAY_MS = 24 * 60 * 60 * 1000;
const finalReport = (j: CommandJournal): CommandReport => ({ id: j.command.id, state: j.state, result: j.result, error: j.error });
const messageOf = (e: unknown) => (e instanceof Error ? e.message : String(e)).slice(0, 4000);

/**
 * Runs host commands (contracts/host.ts): at most once per id, across agent restarts, through a journal file
 * per command. A command is journalled `running` before anything is done, so one the agent died in is run
 * again (the runtime's operations are idempotent by snapshot id); a finished one only has its final report
 * sent again. Reports are sent with retries that never hold up another command or the command's own work.
 */
export class CommandRunner {
  private readonly dir: string;
  private readonly now: () => number;
  private readonly log: NonNullable<CommandRunnerOptions["log"]>;
  private readonly retry: Required<NonNullable<CommandRunnerOptions["retry"]>>;
  private readonly inflight = new Map<string, Promise<void>>();
  /** Per command, the newest report not yet delivered and the loop delivering it. */
  private readonly outbox = new Map<string, { report: CommandReport; done: Promise<void> }>();
  private readonly closing = new AbortController();
  /** Cuts every backoff short (a reconnect: the server is likely reachable again). */
  private nudge = new AbortController();

  constructor(private readonly o: CommandRunnerOptions) {
    this.dir = join(o.stateDir, "commands");
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
    return this.once(parsed.data.id, () => this.handle(parsed.data));
  }

  /**
   * Run again the commands the agent died running, whatever their deadline (they were started before it).
   * Call at start, before the first converge pass: each has taken its instance's lock by the time this
   * settles, so the converger does not touch a domain a save left stopped. They finish in the background.
   */
  async recover(): Promise<void> {
    sweepTemporaries(this.dir);
    const held: Promise<void>[] = [];
    for (const j of await this.journals()) {
      if (j.state !== "running" || this.inflight.has(j.command.id)) continue;
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
    for (const j of await this.journals()) if (j.state !== "running" && !j.confirmed) this.deliver(finalReport(j));
  }

  /** Forget commands whose final report the server confirmed more than `maxAgeMs` ago. Returns how many. */
  async prune(maxAgeMs = DAY_MS): Promise<number> {
    let pruned = 0;
    for (const j of await this.journals()) {
      if (!j.confirmed || !j.finishedAt || this.now() - Date.parse(j.finishedAt) < maxAgeMs || this.inflight.has(j.command.id)) continue;
      await rm(this.path(j.command.id), { force: true });
      pruned++;
    }
    return pruned;
  }

  /** Resolves once every command taken so far has run. */
  async settled(): Promise<void> {
    while (this.inflight.size > 0) await Promise.allSettled([...this.inflight.values()]);
  }

  /** Let running commands finish, then stop sending: what is unconfirmed is sent again after the next start. */
  async close(): Promise<void> {
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
    const known = await this.read(cmd.id);
    if (known && known.state !== "running") return this.deliver(finalReport(known));
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
      await this.write(refused);
      return this.deliver(finalReport(refused));
    }
    const started: CommandJournal = { command: cmd, state: "running", result: null, error: null, confirmed: false, startedAt: at, finishedAt: null };
    await this.write(started);
    return this.run(started);
  }

  /** Run a journalled command under its instance's lock; `taken` is called once the lock is held. */
  private async run(j: CommandJournal, taken: () => void = () => {}): Promise<void> {
    const { command } = j;
    this.deliver({ id: command.id, state: "running", result: null, error: null });
    const lease = await this.o.locks.acquire(command.args.instanceId);
    taken();
    let outcome: Pick<CommandJournal, "state" | "result" | "error">;
    try {
      const before = (await this.o.runtime.list()).find((d) => d.id === command.args.instanceId);
      if (before) lease.pin(before);
      outcome = { state: "succeeded", result: await this.execute(command), error: null };
    } catch (e) {
      outcome = { state: "failed", result: null, error: messageOf(e) };
    } finally {
      lease.release();
    }
    const finished: CommandJournal = { ...j, ...outcome, finishedAt: new Date(this.now()).toISOString() };
    this.log(`command ${finished.state}`, { id: command.id, kind: command.kind, error: finished.error ?? undefined });
    await this.write(finished);
    this.deliver(finalReport(finished));
  }

  private async execute(cmd: HostCommand): Promise<Record<string, unknown>> {
    const { instanceId, snapshotId } = cmd.args;
    switch (cmd.kind) {
      case "instance.snapshot": {
        const { sizeBytes } = await this.o.runtime.snapshot(instanceId, snapshotId);
        return { sizeBytes };
      }
      case "instance.restore":
        await this.o.runtime.restore(instanceId, snapshotId);
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
        await this.attempt(report);
        if (report.state !== "running") await this.confirm(report.id);
        if (entry.report === report) break;
        failures = 0;
      } catch (e) {
        if (this.closing.signal.aborted) break;
        this.log("command report not delivered, will retry", { id: report.id, state: report.state, err: String(e) });
        const wait = Math.min(this.retry.maxMs, this.retry.firstMs * 2 ** failures++);
        await sleep(wait, undefined, { signal: AbortSignal.any([this.closing.signal, this.nudge.signal]) }).catch(() => {});
      }
    }
    this.outbox.delete(entry.report.id);
  }

  /** One send, bounded: a server that never answers must not hold the report forever. */
  private attempt(report: CommandReport): Promise<void> {
    if (this.closing.signal.aborted) return Promise.reject(new Error("closing"));
    const bound = AbortSignal.any([this.closing.signal, AbortSignal.timeout(this.retry.attemptMs)]);
    return new Promise<void>((resolve, reject) => {
      const stop = () => reject(new Error(this.closing.signal.aborted ? "closing" : `no answer within ${this.retry.attemptMs} ms`));
      bound.addEventListener("abort", stop, { once: true });
      this.o
        .send(report)
        .then(resolve, reject)
        .finally(() => bound.removeEventListener("abort", stop));
    });
  }

  private async confirm(id: string): Promise<void> {
    const j = await this.read(id);
    if (j && j.state !== "running" && !j.confirmed) await this.write({ ...j, confirmed: true });
  }

  private path(id: string): string {
    // Ids are validated by the schema (cmd_[a-z2-7]+), so they are safe file names.
    return join(this.dir, `${id}.json`);
  }

  private async read(id: string): Promise<CommandJournal | null> {
    try {
      return JSON.parse(await readFile(this.path(id), "utf8")) as CommandJournal;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw e;
    }
  }

  private async journals(): Promise<CommandJournal[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    const out: CommandJournal[] = [];
    for (const n of names) {
      if (!/^cmd_[a-z2-7]+\.json$/.test(n)) continue;
      const j = await this.read(n.slice(0, -5));
      if (j) out.push(j);
    }
    return out;
  }

  /** Aside and renamed: a journal is the old one or the new one, never half of either. */
  private async write(j: CommandJournal): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: PRIVATE_DIR });
    const file = this.path(j.command.id);
    await writeFile(`${file}.tmp`, `${JSON.stringify(j, null, 2)}\n`, { mode: PRIVATE_FILE });
    await rename(`${file}.tmp`, file);
  }
}
