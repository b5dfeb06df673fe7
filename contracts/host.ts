import { z } from "zod";

/**
 * The host protocol: what the server tells a host agent (NodeSpec) and what the agent reports back
 * (StatusReport). Both sides parse with these schemas; the agent imports this file and the SDK, nothing else.
 */

export const gpuDevice = z.object({ model: z.string(), pciAddress: z.string().nullable() });

export const capacity = z.object({
  vcpus: z.number().int().min(0),
  memoryMib: z.number().int().min(0),
  diskGib: z.number().int().min(0),
  gpus: z.array(gpuDevice).default([]),
});
export type Capacity = z.infer<typeof capacity>;

/** What the host should make true for one instance. */
export const instanceSpec = z.object({
  id: z.string(),
  /** running, stopped or paused: the power state to converge to. A deleted instance is simply absent. */
  power: z.enum(["running", "stopped", "paused"]),
  vcpus: z.number().int(),
  memoryMib: z.number().int(),
  diskGib: z.number().int(),
  gpus: z.array(gpuDevice),
  image: z.object({ url: z.string(), sha256: z.string(), format: z.enum(["raw", "qcow2", "iso"]) }),
  sshKeys: z.array(z.string()),
  /** Clear user data for the NoCloud seed. Never holds a join token or a platform credential. */
  userData: z.string().nullable(),
  hostname: z.string(),
  nic: z.object({ bridge: z.string(), mac: z.string(), address: z.string().nullable(), prefix: z.number().int().nullable(), gateway: z.string().nullable() }),
});
export type InstanceSpec = z.infer<typeof instanceSpec>;

export const nodeSpec = z.object({
  nodeId: z.string(),
  /** Increases whenever anything in the spec changes; reports echo the generation they converged to. */
  generation: z.number().int(),
  runtime: z.string(),
  instances: z.array(instanceSpec),
  /** Domains to remove: instances being deleted, and orphans (domains no instance owns) past their grace. */
  remove: z.array(z.string()),
});
export type NodeSpec = z.infer<typeof nodeSpec>;

/**
 * What the host observed of one domain. `failed`: the runtime could not create or start it; `retryable`
 * says whether another host might (a host problem) or not (a bad image), which decides recreate vs error.
 */
export const observedState = z.enum(["creating", "running", "stopped", "paused", "failed"]);
export type ObservedState = z.infer<typeof observedState>;

export const instanceStatus = z.object({
  id: z.string(),
  state: observedState,
  addresses: z.array(z.string()).default([]),
  error: z.string().nullable().default(null),
  retryable: z.boolean().default(false),
  /** The shape the domain has now, so a resize is known to be applied. */
  shape: z.object({ vcpus: z.number().int(), memoryMib: z.number().int(), diskGib: z.number().int() }).nullable().default(null),
});
export type InstanceStatus = z.infer<typeof instanceStatus>;

export const statusReport = z.object({
  generation: z.number().int(),
  /** Every domain named by the platform that the host has, whether or not the spec holds it. */
  instances: z.array(instanceStatus),
  capacity,
});
export type StatusReport = z.infer<typeof statusReport>;

/** A stable MAC per instance, in QEMU's locally administered 52:54:00 range. */
export function macFor(instanceId: string, hash: (s: string) => string): string {
  const h = hash(instanceId);
  return `52:54:00:${h.slice(0, 2)}:${h.slice(2, 4)}:${h.slice(4, 6)}`;
}
