import type { AddressPolicy } from "../../contracts/addresses.ts";
import { RuntimeError } from "./runtime.ts";

/**
 * Where a host may download from on a tenant's word. An image source is a URL a tenant chose, fetched from
 * inside the operator's network: without a guard it reaches the host's loopback services, the cloud's metadata
 * endpoint and the private network behind the host. Every address a name resolves to is checked (after every
 * redirect, ./guarded-fetch.ts), and the operator may allow ranges that are refused by default (a mirror on
 * the host's own network). The classification is contracts/addresses.ts, which the worker's guard on provider
 * endpoints shares. docs/architecture.md, "Image sources".
 */

export { type Category, categoryOf, Destinations, parseCidr, parseIp } from "../../contracts/addresses.ts";

/** What the operator allows beyond public https: CIDRs (or single addresses) and plain http. Default: neither. */
export type SourcePolicy = AddressPolicy;

/**
 * A refusal a tenant may read: `message` is a short reason from a fixed vocabulary, never an address, a path
 * or anything the source answered. `detail` is for the host's log; the agent logs errors as strings, so
 * `toString` carries it there while the report carries only the message.
 */
export class ClassifiedError extends RuntimeError {
  constructor(
    reason: string,
    retryable: boolean,
    readonly detail?: string,
  ) {
    super(reason, retryable);
  }
  override toString(): string {
    return this.detail ? `${super.toString()} (${this.detail})` : super.toString();
  }
}
