import type { DomainStatus } from "../runtime.ts";
import type { Dom, Hypervisor } from "./binding.ts";

/** What the runtime's operations beyond the basic ones (snapshots: ./snapshot-ops.ts, clones: ./clone-create.ts) need of it. */
export interface DomainContext {
  hv: Hypervisor;
  /** The runtime that owns its domains (./domain-xml.ts's metadata). */
  owner: string;
  stateDir: string;
  instanceDir(id: string): string;
  overlayPath(id: string): string;
  /** This runtime's domain of that name, or null. */
  lookup(id: string): Promise<Dom | null>;
  /** This runtime's domain of that name; a RuntimeError when there is none. */
  must(id: string): Promise<Dom>;
  power(d: Dom): Promise<DomainStatus["state"]>;
  /** A libvirt call, its failure as a RuntimeError. */
  libvirt<T>(call: () => Promise<T>): Promise<T>;
  /** The disk of `id` changed under the runtime's cache of disk sizes. */
  forgetDisk(id: string): void;
}
