import type { ExecRequest } from "../../contracts/commands.ts";
import type { Survey } from "../books/doctor.ts";
import type { ImageResolver, ResolvedImage } from "../catalog/images.ts";
import type { Shape } from "../catalog/shapes.ts";
import type { ChangeHook, InstanceSet } from "../instances/changes.ts";
import type { Instance } from "../instances/model.ts";
import type { DesiredState, InstanceState } from "../instances/state.ts";
import type { Sql } from "../kernel/db.ts";
import type { Sealer } from "../kernel/seal.ts";
import type { Fragment } from "../kernel/sql.ts";
import type { Write, WriteOptions } from "../kernel/write.ts";

/**
 * The pool-driver seam (docs/architecture.md, "Pool drivers"). Where an instance runs, what it holds there and
 * how it converges depend on its pool's class; everything that differs lives behind this interface, one driver
 * per class, found through the registry. Admission, the lifecycle operations and the reconciler ask the driver
 * and never compare class names. A new kind of pool is a new driver, registered with the built-ins (core/drivers.ts).
 */

/** A pool, as the domain reads it. `class` names its driver. */
export interface Pool {
  id: string;
  name: string;
  class: string;
  /** `bcd`: our host agent runs its hosts; `none`: someone else's cloud. */
  agent: string;
  /** Hosted pools: the runtime their hosts run. */
  runtime: string | null;
  providerAccountId: string | null;
  singleTenant: boolean;
  createdAt: Date;
}

export interface PoolInput {
  name: string;
  class: string;
  ipv4Range?: string | null;
  ipv4Gateway?: string | null;
  providerAccountId?: string | null;
  singleTenant?: boolean | null;
}

/** What a class can do beyond create, start, stop and delete. */
export type Capability =
  /** Operators run hosts in it: nodes, join tokens, capacity. */
  | "hosts"
  /** Freeze a running instance in memory, and thaw it (`power`). */
  | "pause"
  /** Change a stopped instance's flavor in place (`resize`). */
  | "resize"
  /** Save and restore an instance's memory and disk (`snapshot`, `restore`). */
  | "snapshot"
  /** Run a command in the instance's guest (`exec`). */
  | "exec";

/** The methods each capability brings: a driver that declares one has them (the registry checks as it registers). */
export const CAPABILITY_METHODS = {
  hosts: [],
  pause: ["power"],
  resize: [],
  snapshot: ["snapshot", "restore"],
  exec: ["exec"],
} as const satisfies Record<Capability, readonly (keyof PoolDriver)[]>;

/** A driver known to have `C` (registry.ts, requireCapability): its methods are there. */
export type DriverWith<C extends Capability> = PoolDriver & Required<Pick<PoolDriver, (typeof CAPABILITY_METHODS)[C][number]>>;

export type PowerTarget = "paused" | "running";

/**
 * Capability `pause`: the instance's host freezes (`paused`) or thaws (`running`) it at once, instead of at its
 * next converge pass; the change asking for it sets the same desired state, so a move lost on the way only
 * delays. Three ways in, by where that change stands in the write (none adds a statement of its own but `after`).
 */
export interface PowerActs {
  /** Before the change, which the write then makes as its last statement and which carries this; call the result with the changed row. */
  withChange(w: Write, inst: Pick<Instance, "id" | "nodeId">, to: PowerTarget): Promise<(changed: Instance) => void>;
  /** After the change that asked for it (`changed`: its row). */
  after(w: Write, changed: Instance, to: PowerTarget): Promise<void>;
  /**
   * As a WITH part of a change's statement over a row the write has not read (core/lifecycle/power-requests.ts):
   * `from` names the changed row's part; call `queued` with the changed row once the statement ran.
   */
  inStatement(w: Write, instanceId: string, to: PowerTarget, from: Fragment): { part: Fragment; queued(changed: Instance): void };
}

/** The class-specific columns of a new pool. */
export interface PoolSettings {
  agent: string;
  runtime: string | null;
  providerAccountId: string | null;
}

export interface AdmitRequest {
  pool: Pool;
  tenantId: string;
  instanceId: string;
  /** As the caller named it; hosted pools resolve it, providers take their own image names. */
  imageId: string;
  /** The image already resolved where admission could (`ImageResolver.inStatement`): null when not visible. */
  image?: ResolvedImage | null;
  shape: Shape;
  /** Hosted pools: only this node will do (a restore from a snapshot its host holds). */
  onlyNodeId?: string;
  /** What the instance is created to be: the steps an admission may take at once depend on it. */
  desiredState: DesiredState;
}

/** Where an admitted instance runs and what it holds there. */
export interface Placed {
  nodeId: string | null;
  allocationId: string | null;
  addresses: string[];
  image: ResolvedImage | null;
  runtime: string | null;
  /** Provider pools: the provider's machine type the flavor maps to. */
  offer?: string;
  /**
   * The steps the admission itself proves, taken in its transaction with an event each (hosted: placed at
   * admission, so scheduled and placed at once), and the spec generation its node reached in doing so: the
   * host hears of the instance when the create commits, not after a reconciler's round trip.
   */
  converged?: { steps: { to: InstanceState; reason: string }[]; specGeneration: number };
  /**
   * Hosted, the common case: the address and the node are not taken yet. Admission takes them in its last
   * statement, just before the quota charge, so the node's row is locked for that statement and its commit
   * instead of across the charge's wait and the round trips between (nodeId, addresses and the converged
   * generation are then known from that statement's `held` row).
   */
  deferred?: DeferredHold;
}

/**
 * Statement parts a driver hands admission. `ctes(gate)` (no leading WITH) end in `held`, always one row:
 * `node_id`, `generation` (the node's spec generation after the claim), `addresses`, `allocation_id` (null when
 * not taken), `picked` (the node chosen, even if not taken); a CTE `made` holds the new allocation row (id,
 * vcpus, memory_mib) for the meter span. Nothing is taken unless `gate` (an SQL condition of the statement's) holds.
 * When `held.node_id` is null, `refusal` says why, or throws a retryable error when it was only contention.
 */
export interface DeferredHold {
  ctes(gate: Fragment): Fragment;
  refusal(sql: Sql, held: { addresses: string[] | null; picked: string | null }): Promise<Error>;
}

export interface DriverDeps {
  images: ImageResolver;
  /** Runtime ids the deployment runs; new hosted pools record the first. */
  runtimes: readonly string[];
  /** Hosts tried before an instance no host can create is left in error. */
  maxRecreateAttempts: number;
  /**
   * Hosted pools place every create step by step (`place`, as GPU requests, restores and retries are), never in
   * admission's statement (`Placed.deferred`). Unset in deployments: tests set it to hold the two ways equal.
   */
  placeStepByStep?: boolean;
}

/**
 * What a driver that talks to something outside the database needs for `sync`: the write path, plain reads,
 * the sealer (user data goes to the provider), pacing and a log. A class adds what only it needs by declaration
 * merging, so the seam names no class: the provider class adds the worker's provider sessions
 * (core/pools/provider/driver.ts).
 */
export interface SyncIo {
  write<T>(opts: WriteOptions, fn: (w: Write) => Promise<T>): Promise<T>;
  read<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
  sealer: Sealer;
  poll: { minMs: number; maxMs: number };
  /** How long a run creating a provider machine holds its instance (renewed while it works). */
  createLeaseMs: number;
  log: { info(msg: string, fields?: Record<string, unknown>): void; warn(msg: string, fields?: Record<string, unknown>): void };
}

export interface PoolDriver {
  readonly poolClass: string;
  /** How messages name pools of this class ("hosted pools"). */
  readonly label: string;
  readonly capabilities: ReadonlySet<Capability>;
  /** createPool: check this class's settings; INVALID_INPUT or NOT_FOUND names the offending field. */
  prepare(sql: Sql, input: PoolInput, deps: Pick<DriverDeps, "runtimes">): Promise<PoolSettings>;
  /** After the pool row exists: what the class keeps beside it (a hosted pool's address range). */
  provision(w: Write, pool: Pool, input: PoolInput): Promise<void>;
  /** A flavor this class can sell, or INVALID_INPUT. */
  checkFlavor(shape: Shape): void;
  /** Place the instance and take what it holds (before quota is charged), or refuse it. */
  admit(w: Write, req: AdmitRequest, deps: DriverDeps): Promise<Placed>;
  /** Capability `pause`: freeze or thaw the instance where it runs, at once. */
  readonly power?: PowerActs;
  /**
   * Capability `snapshot`: save the instance's memory and disk as `snapshotId` where it runs, or put it back, with
   * the instance event that says it was asked for (the change it returns). `timeoutMs`: how long its host has.
   */
  snapshot?(w: Write, inst: Instance, snapshotId: string, timeoutMs: number): Promise<{ commandId: string; instance: Instance }>;
  restore?(w: Write, inst: Instance, snapshotId: string, timeoutMs: number): Promise<{ commandId: string; instance: Instance }>;
  /** Capability `exec`: run a command in the instance's guest; its output and end are read by the command's id. */
  exec?(w: Write, inst: Pick<Instance, "id" | "nodeId">, args: ExecRequest): Promise<string>;
  /** Resize (capability `resize`): give back the old shape's hold and take the new one, in place. */
  resize(w: Write, inst: Instance, pool: Pool, next: Shape): Promise<InstanceSet>;
  /** What the instance holds in this class (allocation, address), given back; the caller releases quota. */
  release(w: Write, inst: Instance): Promise<InstanceSet>;
  /** One guarded step toward the desired state, or null when there is nothing to do until something changes. */
  reconcile(w: Write, inst: Instance, pool: Pool, deps: DriverDeps): Promise<Instance | null>;
  /**
   * Drivers whose instances live behind an outside API (providers) converge here instead, in the worker and
   * outside any transaction: look at the machine, make the one call the desired state needs, and record what
   * happened through guarded writes. Returns how long to wait before looking again, or null to rest until woken.
   */
  sync?(io: SyncIo, instanceId: string): Promise<number | null>;
  /** What the class adds to every instance change's statement (hosted: the nodes' spec generations); registered with the driver. */
  readonly changeHook?: ChangeHook;
  /** The doctor's surveys of this class's pools and what they stand on (hosts, provider accounts), in report order. */
  readonly doctor?: readonly Survey[];
}
