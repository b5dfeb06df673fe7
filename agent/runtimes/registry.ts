import { chmodSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Capacity } from "../../contracts/host.ts";
import { createFakeRuntime, fakeOps } from "./fake/index.ts";
import { PASS_THROUGH_DIR } from "./files.ts";
import { createLibvirtRuntime, type LibvirtOptions } from "./libvirt-kvm/index.ts";
import type { Runtime } from "./runtime.ts";

/** What an agent knows when it makes its runtime; each runtime takes what concerns it. */
export interface RuntimeOptions {
  stateDir: string;
  /** fake: what the simulated host offers, and how slow it is. */
  capacity?: Capacity;
  delayMs?: number;
  /** libvirt-kvm: how to reach libvirt and boot domains. */
  libvirt?: Omit<LibvirtOptions, "stateDir">;
}
type Make = (o: RuntimeOptions) => Promise<Runtime> | Runtime;

export const fakeRuntime: Make = (o) =>
  createFakeRuntime({
    dir: join(o.stateDir, "fake-host"),
    capacity: o.capacity,
    delays: o.delayMs ? Object.fromEntries(fakeOps.map((op) => [op, o.delayMs])) : undefined,
  });

const libvirtRuntime: Make = (o) => {
  // The agent's state dir holds the runtime's: QEMU's user must get through it (its own files stay private).
  mkdirSync(o.stateDir, { recursive: true });
  chmodSync(o.stateDir, PASS_THROUGH_DIR);
  return createLibvirtRuntime({ ...o.libvirt, stateDir: join(o.stateDir, "libvirt") });
};

/** The runtimes an agent can drive, by id (what `bc agent --runtime` and pools' `runtime` name). */
export const runtimes: Record<string, Make> = { fake: fakeRuntime, "libvirt-kvm": libvirtRuntime };
