import { z } from "zod";
import { commandKinds, type HostCommandKind, hostCommandKinds, powerArgs, refusalCodes } from "./commands.ts";
import { egressCidr, egressProtos } from "./egress.ts";

export {
  type ExecChunk,
  type ExecRequest,
  type ExecResult,
  execChunk,
  execRequest,
  execResult,
  type HostCommandKind,
  hostCommandKinds,
  snapshotResult,
} from "./commands.ts";

/**
 * The host protocol: what the server tells a host agent (NodeSpec) and what the agent reports back
 * (StatusReport). Both sides parse with these schemas; the agent imports this file and the SDK, nothing else.
 */

export const gpuDevice = z.object({ model: z.string(), pciAddress: z.string().nullable() });

export const capacity = z.object({
  vcpus: z.number().int().min(0),
  memoryMib: z.number().int().min(0),
  diskGib: z.number().int().min(0),
  gpus: z
    .array(gpuDevice)
    .default([])
    // Two devices at one address would let two instances be given one GPU.
    .refine((gs) => new Set(gs.flatMap((g) => (g.pciAddress ? [g.pciAddress] : []))).size === gs.filter((g) => g.pciAddress).length, {
      message: "a PCI address appears more than once",
    }),
});
export type Capacity = z.infer<typeof capacity>;

/**
 * Where a sandbox's guest may send traffic: nothing (`none`; DHCP and ARP still pass), only the listed
 * destinations (`allowlist`), or anything (`all`). Hosts enforce it on the instance's tap (tapFor).
 */
export const egressRule = z.object({
  /** Checked by the parser the API and the host's ruleset share (egress.ts): a spec a host would refuse fails here. */
  cidr: egressCidr,
  /** null: every port. */
  port: z.number().int().min(1).max(65535).nullable(),
  proto: z.enum(egressProtos),
});
export type EgressRule = z.infer<typeof egressRule>;
export const networkPolicy = z.object({ egress: z.enum(["none", "allowlist", "all"]), allow: z.array(egressRule).default([]) });
export type NetworkPolicy = z.infer<typeof networkPolicy>;

/** The host interface (tap) of an instance's NIC: the same name for the runtime and the host's egress rules (≤ 15 characters). */
export const tapFor = (instanceId: string) => `bct${instanceId.slice(5, 17)}`;

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
  /** Environment a login in the guest sees (exported through the seed) and exec commands get. */
  env: z.record(z.string(), z.string()).default({}),
  /** Egress policy on the instance's tap; `all` for instances that are not sandboxes. */
  network: networkPolicy.default({ egress: "all", allow: [] }),
  /**
   * Make the domain from another instance's snapshot on this host (a sandbox restored from a snapshot): its
   * disk and memory as saved, running on from there, with this instance's identity (name, MAC, tap).
   */
  fromSnapshot: z.object({ instanceId: z.string(), snapshotId: z.string() }).nullable().default(null),
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
 * A node's spec as its stream sends it: whole at first (`since` null), then only what changed since the
 * generation the stream sent before — the instances whose spec changed or that joined the set, and the ids
 * that left it — so a change on a full host costs the host one instance's spec, not all of them. `remove` is
 * always whole (it is short).
 */
export const nodeSpecChange = z.object({
  nodeId: z.string(),
  generation: z.number().int(),
  /** The generation this change applies to: the one the stream sent last; null for a whole spec. */
  since: z.number().int().nullable(),
  runtime: z.string(),
  instances: z.array(instanceSpec),
  /** Instances no longer in the set (only in a change). */
  dropped: z.array(z.string()),
  remove: z.array(z.string()),
});
export type NodeSpecChange = z.infer<typeof nodeSpecChange>;

/**
 * A change as a host reads it: each instance's policy is taken as sent and checked for that instance alone
 * (agent/converge.ts), so one policy the host cannot enforce (a row stored before the API checked as strictly)
 * costs that instance, never the whole spec and so every other tenant's instances on the host.
 */
export const hostSpecChange = nodeSpecChange.extend({
  instances: z.array(instanceSpec.extend({ network: z.custom<NetworkPolicy>().default({ egress: "all", allow: [] }) })),
});

/**
 * The spec a change makes of the one it applies to. A change that does not follow `current` (its `since` is
 * not `current`'s generation) cannot be applied: the caller must start again from a whole spec.
 */
export function applySpecChange(current: NodeSpec | null, change: NodeSpecChange): NodeSpec {
  const { nodeId, generation, runtime, remove } = change;
  if (change.since === null) return { nodeId, generation, runtime, instances: change.instances, remove };
  if (!current || current.nodeId !== nodeId || current.generation !== change.since)
    throw new Error(`spec change ${change.since} → ${generation} does not follow generation ${current?.generation ?? "none"}`);
  const byId = new Map(current.instances.map((i) => [i.id, i]));
  for (const id of change.dropped) byId.delete(id);
  for (const i of change.instances) byId.set(i.id, i);
  const instances = [...byId.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return { nodeId, generation, runtime, instances, remove };
}

/**
 * What the host observed of one domain. `failed`: the runtime could not create or start it; `retryable`
 * says whether another host might (a host problem) or not (a bad image), which decides recreate vs error.
 * `crashed`: the guest or its hypervisor process crashed; the host leaves it so until the spec says what next.
 */
export const observedState = z.enum(["creating", "running", "stopped", "paused", "failed", "crashed"]);
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
  /**
   * The runtimes this host can converge. A host whose list lacks its pool's runtime converges nothing of its
   * spec and is shown refusing it. Absent (agents from before the field): the host is taken at its word.
   */
  runtimes: z.array(z.string()).optional(),
});
export type StatusReport = z.infer<typeof statusReport>;

/** A stable MAC per instance, in QEMU's locally administered 52:54:00 range. */
export function macFor(instanceId: string, hash: (s: string) => string): string {
  const h = hash(instanceId);
  return `52:54:00:${h.slice(0, 2)}:${h.slice(2, 4)}:${h.slice(4, 6)}`;
}

/**
 * Host commands: one-shot operations the desired state cannot express (a snapshot is an act, not a state), one
 * kind each in the table of contracts/commands.ts. Each has an id the host keys its work (and its journal) by, so
 * a command delivered twice (after an agent or a server restart) runs once; a deadline after which the host must
 * not start it; and its kind's arguments. Commands arrive on the same websocket as the spec; the host answers
 * with CommandReports (`running` when it takes a journalled command, then `succeeded` or `failed`), and the
 * server settles the outcome.
 */
const commandBase = {
  id: z.string().regex(/^cmd_[a-z2-7]+$/),
  /** ISO 8601: past it the host refuses to start the command (the server has given up on it by then). */
  deadline: z.iso.datetime({ offset: true }),
};
type CommandSchema<K extends HostCommandKind> = z.ZodObject<{
  id: typeof commandBase.id;
  deadline: typeof commandBase.deadline;
  kind: z.ZodLiteral<K>;
  args: (typeof commandKinds)[K]["args"];
}>;
type AnyCommandSchema = { [K in HostCommandKind]: CommandSchema<K> }[HostCommandKind];
const commandOf = <K extends HostCommandKind>(kind: K): CommandSchema<K> => z.object({ ...commandBase, kind: z.literal(kind), args: commandKinds[kind].args });
export const hostCommand = z.discriminatedUnion("kind", hostCommandKinds.map(commandOf) as [AnyCommandSchema, ...AnyCommandSchema[]]);
export type HostCommand = z.infer<typeof hostCommand>;
/** The commands of kind `K` (a union of kinds: of any of them). */
export type HostCommandOf<K extends HostCommandKind> = { [P in HostCommandKind]: Extract<HostCommand, { kind: P }> }[K];

export const commandReport = z.object({
  id: commandBase.id,
  state: z.enum(["running", "succeeded", "failed"]),
  /** succeeded: the kind's result (its `result` in the table); null otherwise. */
  result: z.record(z.string(), z.unknown()).nullable().default(null),
  /** failed: the runtime's message, for people. */
  error: z.string().max(4000).nullable().default(null),
  /**
   * failed: why, as the server maps it (refusalCodes). A code this server does not know reads as `internal`;
   * absent from an older agent's reports.
   */
  code: z.enum(refusalCodes).catch("internal").optional(),
  /**
   * A pause's or resume's final report may say which it was and of which instance, as the host was told: the
   * server can then settle it into the instance in the message that records it (it holds the command's row to
   * the same, and settles it the usual way where they differ).
   */
  power: z.object({ kind: z.enum(["instance.pause", "instance.resume"]), instanceId: powerArgs.shape.instanceId }).optional(),
  /**
   * A report on a command of the `bulk` lane (a tenant's exec): it takes its turn with API work on the server rather
   * than going ahead of it, as the host's own state does (a host that says so of another command only delays itself).
   */
  bulk: z.boolean().optional(),
});
export type CommandReport = z.infer<typeof commandReport>;
