import type { ProviderErrorKind } from "../core/pools/provider/contract.ts";

/**
 * What every provider emulator offers the quick start, the conformance suite, the churn test and the bench: a
 * real HTTP server speaking the provider's API from memory, with the handles a test needs to look inside it
 * and to make it misbehave. Each emulator's own header lists the endpoints and behaviours it models.
 */
export interface EmulatedMachine {
  externalId: string;
  name: string;
  /** The instance id its labels (tags, description) name, or null. */
  instanceId: string | null;
  /** The `managedBy` value its labels name, or null. */
  managedBy: string | null;
  /** The emulator's own word for its state (`running`, `off`, `stopped`, `initializing`, …). */
  status: string;
}

export interface ProviderEmulator {
  /** The provider plugin's id (`hetzner-cloud`, `proxmox-ve`). */
  provider: string;
  /** Where the emulator listens (its root); `config` holds the API base an account names. */
  url: string;
  /** An account config for this emulator, as `createProviderAccount` takes it. */
  config: Record<string, unknown>;
  /** Credential values the emulator accepts, by the plugin's credential names. */
  credentials: Record<string, string>;
  /** Image names machines can be created from. */
  images: string[];
  /** How long one action or task takes to finish (ms); the floor for create → running. */
  actionMs: number;
  /** Every machine that exists now. */
  machines(): EmulatedMachine[];
  /** Machines ever created, per instance id label (to prove none was created twice). */
  createdPerInstance(): Map<string, number>;
  /**
   * Fail the next `times` requests of an operation with the provider's own error for `kind` (its status, code
   * and body). `op` names the plugin's operation the request belongs to.
   */
  failNext(op: "create" | "get" | "start" | "stop" | "delete" | "list" | "any", kind: ProviderErrorKind, times?: number): void;
  /** Fail this fraction of all requests (0..1) with a transient error, at random. */
  failRandomly(fraction: number): void;
  /** A request budget: at most `limit` requests per `windowMs`; beyond it the provider's rate-limit answer. */
  rateLimit(limit: number, windowMs: number): void;
  /** Requests answered with the rate-limit error, and requests that arrived while the budget was spent. */
  rateLimited(): number;
  /** Remove a machine behind the platform's back. */
  destroyBehindBack(externalId: string): void;
  /** Power a machine off behind the platform's back. */
  powerOffBehindBack(externalId: string): void;
  /**
   * Make a machine labelled as `managedBy`'s for an instance id (an orphan when no live instance has it). With
   * `reuse`, it takes that machine id, replacing the machine that had it, as Proxmox VE does with a VMID freed
   * by a destroy: an id the platform recorded may come to name someone else's machine.
   */
  plant(instanceId: string, managedBy: string, reuse?: string): Promise<string>;
  /** Requests served so far. */
  requests(): number;
  close(): Promise<void>;
}

export interface EmulatorOptions {
  /** Default 0 (a free port on 127.0.0.1). */
  port?: number;
  /** How long actions and tasks take; default 200 ms. */
  actionMs?: number;
}
