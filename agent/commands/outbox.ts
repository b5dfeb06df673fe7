import { setTimeout as sleep } from "node:timers/promises";
import type { CommandReport } from "../../contracts/host.ts";
import { tracePoint } from "../../contracts/trace.ts";

export interface OutboxOptions {
  /** Deliver a report to the server; resolving means the server has it. */
  send(report: CommandReport): Promise<void>;
  /** The server has this final report (the journal remembers it). */
  confirm(id: string): Promise<void>;
  log: (msg: string, fields?: Record<string, unknown>) => void;
  /** Each attempt bounded by `attemptMs`; between failures, a wait doubling from `firstMs` to `maxMs`. */
  retry: { attemptMs: number; firstMs: number; maxMs: number };
}

/**
 * Command reports on their way to the server: one delivery loop per command, retried with a backoff that never
 * holds up another command or the command's own work. A final report replaces a `running` one not yet sent (the
 * server needs only the newest), and a `running` one never replaces a final one.
 */
export class Outbox {
  /** Per command, the newest report not yet delivered and the loop delivering it. */
  private readonly boxes = new Map<string, { report: CommandReport; done: Promise<void> }>();
  private readonly closing = new AbortController();
  /** Cuts every backoff short (a reconnect: the server is likely reachable again). */
  private nudged = new AbortController();

  constructor(private readonly o: OutboxOptions) {}

  deliver(report: CommandReport): void {
    const box = this.boxes.get(report.id);
    if (box) {
      if (box.report.state === "running") box.report = report;
      return;
    }
    const entry = { report, done: Promise.resolve() };
    this.boxes.set(report.id, entry);
    entry.done = this.pump(entry);
  }

  /** Resolves once the command's report on its way (if any) has reached the server or been given up. */
  delivered(id: string): Promise<void> | undefined {
    return this.boxes.get(id)?.done;
  }

  /** Resolves once the reports on their way when called have reached the server (or failed to), or after `maxMs`. */
  async sent(maxMs: number): Promise<void> {
    const pending = [...this.boxes.values()].map((b) => b.done);
    if (!pending.length) return;
    await Promise.race([Promise.allSettled(pending), sleep(maxMs, undefined, { ref: false })]);
  }

  get size(): number {
    return this.boxes.size;
  }

  /** Cut every backoff short. */
  nudge(): void {
    this.nudged.abort();
    this.nudged = new AbortController();
  }

  /** Stop sending; what is unconfirmed is sent again after the next start. */
  async close(): Promise<void> {
    this.closing.abort();
    await Promise.allSettled([...this.boxes.values()].map((b) => b.done));
  }

  /** One send, bounded: a server that never answers must not hold a report (or output) forever. */
  bounded(send: () => Promise<void>, stop: AbortSignal): Promise<void> {
    const { attemptMs } = this.o.retry;
    if (stop.aborted) return Promise.reject(new Error("closing"));
    const bound = AbortSignal.any([stop, AbortSignal.timeout(attemptMs)]);
    return new Promise<void>((resolve, reject) => {
      const end = () => reject(new Error(stop.aborted ? "closing" : `no answer within ${attemptMs} ms`));
      bound.addEventListener("abort", end, { once: true });
      send()
        .then(resolve, reject)
        .finally(() => bound.removeEventListener("abort", end));
    });
  }

  /** The wait after `failures` failed sends, cut short by `stop` or a reconnect. */
  async backoff(failures: number, stop: AbortSignal): Promise<void> {
    const wait = Math.min(this.o.retry.maxMs, this.o.retry.firstMs * 2 ** failures);
    await sleep(wait, undefined, { signal: AbortSignal.any([stop, this.nudged.signal]) }).catch(() => {});
  }

  private async pump(entry: { report: CommandReport }): Promise<void> {
    for (let failures = 0; !this.closing.signal.aborted; ) {
      const report = entry.report;
      try {
        tracePoint("agent.report", `${report.state} ${report.id}`);
        await this.bounded(() => this.o.send(report), this.closing.signal);
        if (report.state !== "running") await this.o.confirm(report.id);
        if (entry.report === report) break;
        failures = 0;
      } catch (e) {
        if (this.closing.signal.aborted) break;
        this.o.log("command report not delivered, will retry", { id: report.id, state: report.state, err: String(e) });
        await this.backoff(failures++, this.closing.signal);
      }
    }
    this.boxes.delete(entry.report.id);
  }
}
