import type { DomainStatus } from "./runtimes/runtime.ts";

/** A hold on one instance; `release` is idempotent. */
export interface Lease {
  /** What reports show of the instance while this hold lasts (a command's view from before it began). */
  pin(status: DomainStatus): void;
  release(): void;
}

interface Hold {
  by: "command" | "converger";
  pinned: DomainStatus | undefined;
  released: Promise<void>;
}

/**
 * One lock per instance, shared by host commands and the converger, so only one of them acts on an instance
 * at a time. A command waits for its instance; the converger never waits: it skips a held instance and goes
 * on with the others, so a long snapshot stalls nothing else, and the command's release asks for another
 * pass. A quiet command (a pause, a resume, an exec's wait) leaves nothing for a pass to do once it ends, and
 * its release says so. While a command holds an instance, reports show it as it was when the command began: a
 * snapshot stops the domain for a moment, and the server must not take that for the guest powering off.
 */
export class InstanceLocks {
  private readonly holds = new Map<string, Hold>();
  private readonly listeners = new Set<(id: string, quiet: boolean) => void>();
  private commandReleases = 0;

  /**
   * Take `id` for a command, after whoever holds it now. A free instance is taken before this returns its
   * promise, so a caller that has not awaited yet already holds it.
   */
  async acquire(id: string, opts: { quiet?: boolean } = {}): Promise<Lease> {
    for (let hold = this.holds.get(id); hold; hold = this.holds.get(id)) await hold.released;
    return this.take(id, "command", opts.quiet ?? false);
  }

  /** Take `id` for the converger if nobody holds it; null otherwise. */
  tryAcquire(id: string): Lease | null {
    return this.holds.has(id) ? null : this.take(id, "converger", false);
  }

  /** The pinned view of each instance a command holds. */
  pinned(): Map<string, DomainStatus> {
    const out = new Map<string, DomainStatus>();
    for (const [id, h] of this.holds) if (h.pinned) out.set(id, h.pinned);
    return out;
  }

  /**
   * How many command holds have ended so far: a pass that listed the domains before this changed knows a
   * command may have changed one since.
   */
  get releases(): number {
    return this.commandReleases;
  }

  /** Called with the instance each time a command releases one, and whether it was quiet. Returns the unsubscribe. */
  onCommandRelease(fn: (id: string, quiet: boolean) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  private take(id: string, by: Hold["by"], quiet: boolean): Lease {
    let done = () => {};
    const hold: Hold = { by, pinned: undefined, released: new Promise<void>((r) => (done = r)) };
    this.holds.set(id, hold);
    let released = false;
    return {
      pin: (status) => {
        if (!released) hold.pinned = structuredClone(status);
      },
      release: () => {
        if (released) return;
        released = true;
        this.holds.delete(id);
        done();
        if (by !== "command") return;
        this.commandReleases++;
        for (const fn of this.listeners) fn(id, quiet);
      },
    };
  }
}
