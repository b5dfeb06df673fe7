import { type InstanceSpec, type InstanceStatus, type NetworkPolicy, type NodeSpec, type StatusReport, tapFor } from "../contracts/host.ts";
import { InstanceLocks } from "./locks.ts";
import { policyRefusal, tapRefusal } from "./network/ruleset.ts";
import { type DomainStatus, type Runtime, RuntimeError } from "./runtimes/runtime.ts";

/** Enforces sandboxes' egress policies on the host, by tap (agent/network/egress.ts). */
export interface EgressRules {
  apply(policies: ReadonlyMap<string, NetworkPolicy>): Promise<void>;
}

interface Failure {
  error: string;
  retryable: boolean;
  generation: number;
}

/**
 * Makes a host match its NodeSpec through a Runtime, and says what it sees. Keeps what the runtime refused so
 * the report carries it and the same refusal is not retried until the spec asks again. Acts on an instance
 * only while holding its lock (./locks.ts): one a host command holds is skipped, and reported as pinned. A
 * spec for a runtime this host does not serve is refused whole; reports name the runtimes it serves, so the
 * server shows the refusal. Whatever one instance's spec holds costs that instance alone: a policy the egress
 * ruleset cannot hold is that instance's refusal, and the rest of the host's rules and pass go on without it.
 */
export class Converger {
  private readonly failures = new Map<string, Failure>();
  /** Per instance, the spec generation of a pause or resume that came ahead of its spec (`powerAhead`). */
  private readonly ahead = new Map<string, number>();
  /** Instances a pass skipped because a command held them: the command's release owes them a pass. */
  private readonly heldBack = new Set<string>();

  constructor(
    private readonly runtime: Runtime,
    private readonly onError: (id: string, e: unknown) => void = () => {},
    private readonly locks: InstanceLocks = new InstanceLocks(),
    /** Loaded with every pass, so a tap is classified before its guest boots; a tap with no policy is dropped meanwhile. */
    private readonly egress?: EgressRules,
  ) {}

  /**
   * A pause or resume for `id` came as a command ahead of spec `generation`, which says the same. A pass on an
   * older spec (one a command's release or another instance's change set off before that spec arrived) would
   * undo it, flipping the guest back and forth, so passes leave the instance alone until the spec catches up.
   */
  powerAhead(id: string, generation: number): void {
    this.ahead.set(id, Math.max(generation, this.ahead.get(id) ?? 0));
  }

  /** Whether a pass skipped `id` while a command held it (and forget it): its release must ask for a pass. */
  takeHeldBack(id: string): boolean {
    return this.heldBack.delete(id);
  }

  /** The pool runtimes this host converges. */
  get serves(): readonly string[] {
    return this.runtime.serves ?? [this.runtime.id];
  }

  /**
   * One pass over the spec. Returns the instances it skipped because a command held them, and why the spec
   * was refused whole, if it was.
   */
  async converge(spec: NodeSpec): Promise<{ skipped: string[]; refused?: string }> {
    // Another runtime's pool would get its instances on a hypervisor it does not promise, and lose domains
    // this one does not own to its removals: nothing of such a spec is touched.
    if (!this.serves.includes(spec.runtime)) return { skipped: [], refused: `this host runs ${this.serves.join(", ")}, not ${spec.runtime}` };
    // A policy the ruleset cannot hold would fail the one ruleset of every instance here: it is left out, its tap
    // stays unclassified (the backstop drops it), and its instance is refused below. The rules load beside the
    // pass (an nft run takes tens of milliseconds, a restore waits on the pass): a tap that comes up before its
    // rules are in is dropped until they are.
    const refusals = new Map<string, string>();
    const policies = new Map<string, NetworkPolicy>();
    for (const inst of spec.instances) {
      const tap = tapFor(inst.id);
      const why = tapRefusal(tap) ?? policyRefusal(inst.network);
      if (why) refusals.set(inst.id, `egress policy refused: ${why}`);
      else policies.set(tap, inst.network);
    }
    const egress = this.egress?.apply(policies);
    egress?.catch(() => {});
    const skipped: string[] = [];
    let seen = this.locks.releases;
    let have = new Map((await this.runtime.list()).map((d) => [d.id, d]));
    // A command that ended since the list may have changed its domain: look again before acting on it.
    const current = async () => {
      if (seen !== this.locks.releases) {
        seen = this.locks.releases;
        have = new Map((await this.runtime.list()).map((d) => [d.id, d]));
      }
      return have;
    };
    const wanted = new Set(spec.instances.map((i) => i.id));
    for (const id of this.failures.keys()) if (!wanted.has(id)) this.failures.delete(id);
    for (const [id, generation] of this.ahead) if (generation <= spec.generation) this.ahead.delete(id);
    for (const inst of spec.instances) {
      if (this.ahead.has(inst.id)) continue;
      const failed = this.failures.get(inst.id);
      // A refusal stands until the spec changes and asks for the instance to run again, or to stop a domain
      // the host has (stopping it is what the owner wants now, and the host can do it).
      if (failed && (failed.generation === spec.generation || (inst.power === "stopped" && !(await current()).has(inst.id)))) continue;
      const lease = this.locks.tryAcquire(inst.id);
      if (!lease) {
        skipped.push(inst.id);
        this.heldBack.add(inst.id);
        continue;
      }
      try {
        const d = (await current()).get(inst.id);
        const refused = refusals.get(inst.id);
        if (refused) {
          // Not made nor run while its traffic cannot be policed; stopping one the host has is safe and asked for.
          if (d && inst.power === "stopped") await this.one(inst, d);
          throw new RuntimeError(refused, false);
        }
        await this.one(inst, d);
        this.failures.delete(inst.id);
      } catch (e) {
        this.onError(inst.id, e);
        const refused = e instanceof RuntimeError;
        this.failures.set(inst.id, { error: e instanceof Error ? e.message : String(e), retryable: refused ? e.retryable : true, generation: spec.generation });
      } finally {
        lease.release();
      }
    }
    for (const id of spec.remove) {
      if (wanted.has(id)) continue;
      const lease = this.locks.tryAcquire(id);
      if (!lease) {
        skipped.push(id);
        this.heldBack.add(id);
        continue;
      }
      try {
        if ((await current()).has(id)) await this.runtime.remove(id);
      } catch (e) {
        this.onError(id, e);
      } finally {
        lease.release();
      }
    }
    // The host's own egress failure (no nft, a kernel refusing the ruleset) is no one instance's: it fails the pass.
    await egress;
    return { skipped };
  }

  private async one(inst: InstanceSpec, d: DomainStatus | undefined): Promise<void> {
    const rt = this.runtime;
    if (!d) {
      await rt.create(inst);
      // A domain made from a snapshot waits paused at its saved point; any other is defined and stopped.
      const state = inst.fromSnapshot ? "paused" : "stopped";
      d = { id: inst.id, state, shape: { vcpus: inst.vcpus, memoryMib: inst.memoryMib, diskGib: inst.diskGib }, addresses: [] };
    }
    const shape = { vcpus: inst.vcpus, memoryMib: inst.memoryMib, diskGib: inst.diskGib };
    const reshaped = d.shape.vcpus !== shape.vcpus || d.shape.memoryMib !== shape.memoryMib || d.shape.diskGib !== shape.diskGib;
    if (inst.power === "stopped") {
      if (d.state !== "stopped") await rt.stop(inst.id);
      if (reshaped) await rt.resize(inst.id, shape);
      return;
    }
    // What follows a crash is the server's call (it records the crash, then asks for the instance stopped,
    // and started again if its owner wants it running): booting it here would hide the crash.
    if (d.state === "crashed") return;
    if (d.state === "stopped") {
      if (reshaped) await rt.resize(inst.id, shape);
      await rt.start(inst.id);
      if (inst.power === "paused") await rt.pause(inst.id);
    } else if (d.state === "paused" && inst.power === "running") await rt.resume(inst.id);
    else if (d.state === "running" && inst.power === "paused") await rt.pause(inst.id);
  }

  /**
   * What the host has: every platform-named domain, and the refusals for instances it could not make. An
   * instance a command holds is shown as it was when the command began.
   */
  async report(generation: number): Promise<StatusReport> {
    const [domains, capacity] = await Promise.all([this.pinnedList(), this.runtime.capacity()]);
    const instances: InstanceStatus[] = domains.map((d) => {
      const f = this.failures.get(d.id);
      const error = f?.error ?? (d.state === "crashed" ? `${this.runtime.id}: the guest crashed` : null);
      return { id: d.id, state: f ? "failed" : d.state, addresses: d.addresses, error, retryable: f?.retryable ?? false, shape: d.shape };
    });
    for (const [id, f] of this.failures) {
      if (!domains.some((d) => d.id === id)) instances.push({ id, state: "failed", addresses: [], error: f.error, retryable: f.retryable, shape: null });
    }
    return { generation, instances, capacity, runtimes: [...this.serves] };
  }

  /**
   * The runtime's list with held instances as pinned. A command can begin or end while the runtime lists, so
   * the pins from before and after the list both count, and a list that saw a command end is taken again.
   */
  private async pinnedList(): Promise<DomainStatus[]> {
    for (;;) {
      const releases = this.locks.releases;
      const before = this.locks.pinned();
      const listed = await this.runtime.list();
      if (releases !== this.locks.releases) continue;
      const pinned = new Map([...before, ...this.locks.pinned()]);
      const domains = listed.map((d) => pinned.get(d.id) ?? d);
      for (const [id, d] of pinned) if (!domains.some((x) => x.id === id)) domains.push(d);
      return domains;
    }
  }
}
