import type { DomainStatus } from "../runtime.ts";
import { run } from "./exec.ts";

/**
 * libvirt's domain states as the runtime reports them (virDomainState: 1 running, 2 blocked, 3 paused,
 * 4 shutting down, 5 shut off, 6 crashed, 7 pm-suspended). Two ways a guest crashes, and both must reach the
 * platform as crashes rather than as a guest that powered itself off: a guest that panics is kept `crashed`
 * (6) by its domain's on_crash=preserve; a QEMU process that dies leaves the domain `shut off` with the reason
 * `crashed`, which only virDomainGetState tells, and the Node binding lacks it (virsh asks instead).
 */
export const powerOf = (state: number): DomainStatus["state"] =>
  state === 3 || state === 7 ? "paused" : state === 5 ? "stopped" : state === 6 ? "crashed" : "running";

/**
 * Which shut-off domains crashed. The reason is asked once, when a domain is first seen off after being seen
 * active, so a report costs no process per stopped domain; the crash stands until the runtime starts, stops
 * or removes the domain (`clear`). After an agent restart a domain already off reads as stopped.
 */
export class CrashWatch {
  private readonly active = new Set<string>();
  private readonly crashed = new Set<string>();
  private readonly asking = new Map<string, Promise<void>>();

  /** The state to report for domain `id`, from libvirt's state now. */
  async seen(id: string, state: number, uri: string): Promise<DomainStatus["state"]> {
    const power = powerOf(state);
    if (power !== "stopped") {
      this.active.add(id);
      this.crashed.delete(id);
      return power;
    }
    // Reports run concurrently: one asks, the others wait for its answer rather than read "stopped".
    if (this.active.delete(id))
      this.asking.set(
        id,
        this.ask(id, uri).finally(() => this.asking.delete(id)),
      );
    await this.asking.get(id);
    return this.crashed.has(id) ? "crashed" : "stopped";
  }

  /** The runtime acts on `id`: whatever it does replaces a crash seen before, and it needs no question. */
  clear(id: string): void {
    this.crashed.delete(id);
    this.active.delete(id);
  }

  private async ask(id: string, uri: string): Promise<void> {
    try {
      if (/\(crashed\)/.test(await run("virsh", ["-c", uri, "domstate", "--reason", id]))) this.crashed.add(id);
    } catch {
      // Without virsh the reason is unknown: the domain reads as stopped, as it did before reasons were asked.
    }
  }
}
