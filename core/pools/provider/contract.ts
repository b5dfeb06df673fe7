import type { z } from "zod";

/**
 * The provider contract: what a provider plugin (providers/<id>/) declares and does. Provider accounts name a
 * plugin by id and hold a config its schema accepts plus credentials by reference; the worker connects a
 * session per account and drives machines through it. Nothing here may carry a secret value outward: errors,
 * machines and offers are shown to operators, tenants and logs.
 */

/** A machine type the provider sells. Memory in MiB, disk in GiB, as our shapes count them. */
export interface ProviderOffer {
  name: string;
  vcpus: number;
  memoryMib: number;
  diskGib: number;
}

/**
 * What a machine is doing, in our words: `creating` until the provider has built it; `starting`/`stopping`
 * while a power change is under way; `deleting` once its removal began; `unknown` for anything else the
 * provider says (migrating, rebuilding): wait and look again.
 */
export type MachineStatus = "creating" | "starting" | "running" | "stopping" | "stopped" | "deleting" | "unknown";

export interface Machine {
  /** The provider's id for it (a Hetzner server id, a Proxmox VMID), as a string. */
  externalId: string;
  /** The instance id it is labelled with; null when the label is missing. */
  instanceId: string | null;
  status: MachineStatus;
  /** Public addresses, IPv4 first; empty while the provider has none. */
  addresses: string[];
}

export interface CreateMachine {
  /** Put on the machine as a label, so a retry after a crash finds and adopts it instead of making another. */
  instanceId: string;
  /** A hostname (RFC 1123, ≤ 63 characters), unique per instance. */
  name: string;
  /** One of `offers()`'s names. */
  offer: string;
  /** The provider's image name. */
  image: string;
  sshKeys: string[];
  userData: string | null;
  /** false: create it powered off (the owner asked for a stopped instance). */
  start: boolean;
}

/** Why a provider call failed. Only `transient` is retried by the reconciler; the others wait for a person. */
export type ProviderErrorKind = "capacity" | "quota" | "auth" | "invalid" | "transient";

/**
 * A classified failure of a provider call. `message` is shown to the instance's owner and logged: it names what
 * failed and the provider's error code, never a credential, a request header or a URL with a query string.
 */
export class ProviderError extends Error {
  readonly kind: ProviderErrorKind;
  /** The provider's own code (`resource_unavailable`, an HTTP status), for logs and conditions. */
  readonly code: string | undefined;
  /** When the provider said when to come back (rate limits). */
  readonly retryAfterMs: number | undefined;
  constructor(kind: ProviderErrorKind, message: string, opts: { code?: string; retryAfterMs?: number } = {}) {
    super(message);
    this.name = "ProviderError";
    this.kind = kind;
    this.code = opts.code;
    this.retryAfterMs = opts.retryAfterMs;
  }
}

export const isProviderError = (e: unknown): e is ProviderError => e instanceof ProviderError;

/**
 * One account's connection to its provider. Every method is safe to repeat: create adopts the machine already
 * labelled with the instance id, delete of a machine that is gone succeeds, start of a running machine and stop
 * of a stopped one do nothing. Failures are ProviderErrors.
 */
export interface ProviderSession {
  offers(): Promise<ProviderOffer[]>;
  /** Begin making the machine (it may still be `creating` when this returns). */
  create(req: CreateMachine): Promise<Machine>;
  /** The machine, or null when the provider has no machine of that id. */
  get(externalId: string): Promise<Machine | null>;
  /** The machine labelled with this instance id (the oldest, if a crash left two), or null. */
  find(instanceId: string): Promise<Machine | null>;
  start(externalId: string): Promise<void>;
  stop(externalId: string): Promise<void>;
  delete(externalId: string): Promise<void>;
  /** Every machine this deployment labelled as its own (the `managedBy` label), for the orphan sweep. */
  list(): Promise<Machine[]>;
  /**
   * How long to hold off before the next call, from what the provider last said of its rate limit (0 when
   * there is budget). The reconciler polls no sooner than this.
   */
  pace(): number;
}

export interface ProviderContext {
  /** The value of one of the account's credentials, by the name the plugin declared; resolved when needed. */
  credential(name: string): Promise<string>;
  /** Label value that marks machines as this deployment's (several control planes may share an account). */
  managedBy: string;
  /** Override for tests and proxies; defaults to the global fetch. */
  fetch?: typeof fetch;
}

export interface ProviderDefinition<C extends Record<string, unknown> = Record<string, unknown>> {
  id: string;
  displayName: string;
  /** The non-secret part of an account (endpoint, location, node); validated when the account is created. */
  accountConfig: z.ZodType<C>;
  /** The names of the secrets an account must give, each as a reference (`env:NAME`, `file:/path`) or a value to seal. */
  credentials: readonly string[];
  connect(config: C, ctx: ProviderContext): ProviderSession;
}

/** Declares a provider plugin; generic so `connect` sees the config its schema parses to. */
export const defineProvider = <C extends Record<string, unknown>>(def: ProviderDefinition<C>): ProviderDefinition => def as unknown as ProviderDefinition;

/** The worker's connections to providers, one session per account (infra/providers.ts). */
export interface ProviderSessions {
  /** The account's session; credentials are resolved by the secret broker when a call needs them. */
  session(accountId: string): Promise<ProviderSession>;
  /** The label value that marks this deployment's machines. */
  readonly managedBy: string;
}
