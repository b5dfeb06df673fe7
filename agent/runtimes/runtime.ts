import type { RefusalCode } from "../../contracts/commands.ts";
import type { Capacity, ExecRequest, ExecResult, InstanceSpec } from "../../contracts/host.ts";

/**
 * One domain as a runtime sees it. Only domains the platform named (`inst_…`) are listed. `crashed`: the guest
 * or its hypervisor process crashed and nothing has acted on it since; `start` and `stop` both leave that state.
 * `addresses`: what the runtime learnt the guest uses (beyond the address the spec gave it), if anything.
 */
export interface DomainStatus {
  id: string;
  state: "running" | "stopped" | "paused" | "crashed";
  shape: { vcpus: number; memoryMib: number; diskGib: number };
  addresses: string[];
}

/**
 * A runtime refused: `retryable` when another host might succeed (this host lacks something), not when the
 * request itself is bad (an image whose digest does not match). Carries the runtime's own message, for people,
 * and `code`, for the server, which maps codes and never reads messages (contracts/commands.ts, refusalCodes).
 */
export class RuntimeError extends Error {
  constructor(
    message: string,
    readonly retryable: boolean,
    readonly code: RefusalCode = "internal",
  ) {
    super(message);
    this.name = "RuntimeError";
  }
}

/**
 * What the agent converges a host through. Every method is idempotent: calling it for a state the domain is
 * already in does nothing. `create` leaves the domain defined and stopped; power is the converger's business.
 */
export interface Runtime {
  readonly id: string;
  /** The pool runtimes it converges (default: its id). A spec for any other is refused whole. */
  readonly serves?: readonly string[];
  capacity(): Promise<Capacity>;
  list(): Promise<DomainStatus[]>;
  /**
   * Fetch and verify the image, make the overlay and the NoCloud seed, define the domain (stopped). With
   * `spec.fromSnapshot`, the domain is made from that snapshot of another domain on this host instead: its disk
   * and memory, with this spec's identity, left paused at the saved point (the converger then runs it).
   */
  create(spec: InstanceSpec): Promise<void>;
  start(id: string): Promise<void>;
  /** Graceful shutdown within a bound, then forced. */
  stop(id: string): Promise<void>;
  pause(id: string): Promise<void>;
  resume(id: string): Promise<void>;
  /** Change vCPUs, memory and disk of a stopped domain (disk only grows). */
  resize(id: string, shape: DomainStatus["shape"]): Promise<void>;
  /** Domain, overlay and seed gone. */
  remove(id: string): Promise<void>;
  /**
   * Save a running or paused domain's memory and disk as `snapshotId`, kept with the domain (`remove` deletes
   * it). The domain ends in the power state it had. A snapshot already complete is not taken again: its size
   * is returned. A stopped domain has no memory to save: a non-retryable RuntimeError (`not-running`).
   */
  snapshot(id: string, snapshotId: string): Promise<{ sizeBytes: number }>;
  /**
   * Put the domain back to `snapshotId`, disk and memory, in the power state it was saved in, whatever its
   * power state now (a running domain is stopped hard: it is being reverted). The snapshot stays usable.
   * An unknown snapshot is a non-retryable RuntimeError (`not-found`).
   */
  restore(id: string, snapshotId: string): Promise<void>;
  /**
   * Run a command in a running guest, with the spec's env plus the request's, stdin if given; each piece of
   * output goes to `onOutput` as it comes, in order. Killed past `timeoutMs` (timedOut). A guest the runtime
   * cannot reach (no guest agent) is a non-retryable RuntimeError that says so, coded `unsupported`; a guest
   * not running, `not-running`.
   */
  exec(id: string, req: Omit<ExecRequest, "instanceId">, onOutput: (stream: "stdout" | "stderr", data: string) => void): Promise<ExecResult>;
  close(): Promise<void>;
}
