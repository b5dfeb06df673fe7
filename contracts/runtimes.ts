/**
 * The runtimes a host agent can run, by id, and what each can do: what the server and the agent both go by. A
 * pool records its hosts' runtime by id; `VPS_RUNTIMES` lists the deployment's, and may name one this table does
 * not know (it then has no traits to go by). The agent's declarations (agent/runtimes/<id>/declaration.ts) take
 * their traits from here, so the server never imports the agent to know them.
 */

export interface RuntimeTraits {
  /** Pauses and resumes a running guest, its memory kept. */
  pause: boolean;
  /** Saves a guest's memory and disk, restores them, and makes a new domain from another's snapshot. */
  snapshots: boolean;
  /** Runs commands in a running guest (sandboxes' exec). */
  exec: boolean;
  /** Keeps each guest's serial console where an operator can read it. */
  console: boolean;
  /** Reads and writes files in a guest (no runtime has it yet). */
  files: boolean;
  /** Passes the host's GPUs through to guests. */
  gpus: boolean;
  /** Fetches each image and checks it: its sha256, and no qcow2 that names a backing or data file of the host. */
  checksImages: boolean;
  /**
   * Guests share the host's kernel: a tenant's code is one kernel bug away from the host and its neighbours, so a
   * pool on it should place one tenant per host (the doctor says so).
   */
  sharedKernel: boolean;
  /** Each guest's NIC is a host tap the agent can filter: sandboxes' egress is enforced there (nftables, the agent's default). */
  tapEgress: boolean;
}

export const runtimeTraits = {
  /** A hypervisor made of files, for simulated hosts and tests; its execs are host processes under bubblewrap. */
  fake: {
    pause: true,
    snapshots: true,
    exec: true,
    console: false,
    files: false,
    gpus: false,
    checksImages: false,
    sharedKernel: true,
    tapEgress: false,
  },
  /** Virtual machines through libvirt and QEMU (KVM where the host has it). */
  "libvirt-kvm": {
    pause: true,
    snapshots: true,
    exec: true,
    console: true,
    files: false,
    gpus: true,
    checksImages: true,
    sharedKernel: false,
    tapEgress: true,
  },
} as const satisfies Record<string, RuntimeTraits>;

export type RuntimeId = keyof typeof runtimeTraits;
export const runtimeIds = Object.keys(runtimeTraits) as RuntimeId[];

/** The runtime of a pool that names none, and what a deployment lists when `VPS_RUNTIMES` is not set. */
export const DEFAULT_RUNTIME: RuntimeId = "libvirt-kvm";

/** The known runtimes whose guests share the host's kernel. */
export const sharedKernelRuntimes: readonly RuntimeId[] = runtimeIds.filter((id) => runtimeTraits[id].sharedKernel);
