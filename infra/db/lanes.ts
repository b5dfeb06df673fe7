/**
 * The order in which work gets the database (docs/architecture.md, Limits). Host work — reports, heartbeats,
 * spec and command reads, joins, the reconciler and the sweep — never queues behind API work: a host that waits
 * too long is declared lost, and its instances with it. API work (tenants' and operators' requests) shares a
 * bounded number of slots, taken in turn by caller, so one caller's flood delays another caller by at most
 * one of its statements per slot, however many it has queued.
 */
export type Lane = { kind: "host" } | { kind: "api"; caller: string };

export const hostLane: Lane = { kind: "host" };

export class Gate {
  private busy = 0;
  private readonly hosts: (() => void)[] = [];
  /** Waiting API work by caller; a Map iterates in insertion order, so re-inserting a caller sends it to the back. */
  private readonly callers = new Map<string, (() => void)[]>();

  /** `slots`: how many may run at once; `gateHosts`: whether host work takes slots too (one connection: PGlite). */
  constructor(
    private readonly slots: number,
    private readonly gateHosts: boolean,
  ) {}

  async run<T>(lane: Lane, fn: () => Promise<T>): Promise<T> {
    if (lane.kind === "host" && !this.gateHosts) return fn();
    await this.acquire(lane);
    try {
      return await fn();
    } finally {
      this.release();
    }
  }

  /** API work waiting for a slot (for tests and metrics). */
  waiting(): number {
    let n = 0;
    for (const q of this.callers.values()) n += q.length;
    return n;
  }

  private acquire(lane: Lane): Promise<void> | undefined {
    if (this.busy < this.slots) {
      this.busy++;
      return;
    }
    return new Promise<void>((resolve) => {
      if (lane.kind === "host") this.hosts.push(resolve);
      else {
        const q = this.callers.get(lane.caller);
        if (q) q.push(resolve);
        else this.callers.set(lane.caller, [resolve]);
      }
    });
  }

  /**
   * The slot passes on: to host work first, else to the caller whose turn it is. It passes after the event
   * loop has read what arrived meanwhile: PGlite answers without real I/O, so a queue of statements handed on
   * promise by promise would run to its end before a host's report, or another caller's request, is even read.
   */
  private release(): void {
    if (!this.hosts.length && !this.callers.size) {
      this.busy--;
      return;
    }
    setImmediate(() => this.handOver());
  }

  private handOver(): void {
    const host = this.hosts.shift();
    if (host) {
      host();
      return;
    }
    const next = this.callers.entries().next();
    if (next.done) {
      this.busy--;
      return;
    }
    const [caller, q] = next.value;
    const wake = q.shift() as () => void;
    this.callers.delete(caller);
    if (q.length) this.callers.set(caller, q);
    wake();
  }
}
