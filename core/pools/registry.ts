import { AppError, invalid } from "../../contracts/errors.ts";
import type { Capability, Pool, PoolDriver } from "./driver.ts";
import { hostedDriver } from "./hosted/driver.ts";
import { providerDriver } from "./provider/driver.ts";

/**
 * The pool drivers, by class: the one place a pool's class is looked at. A new kind of pool is one more entry
 * here and a driver of its own (docs/architecture.md, "Where to add a pool class").
 */
const drivers: ReadonlyMap<string, PoolDriver> = new Map([hostedDriver, providerDriver].map((d) => [d.poolClass, d]));

/** The classes a pool may have, as stored (`vps-host`, `provider`). */
export const poolClasses: readonly string[] = [...drivers.keys()];

/** The classes whose driver can do `capability`: for a statement that checks a pool it has not read. */
export const classesWith = (capability: Capability): string[] => [...drivers.values()].filter((d) => d.capabilities.has(capability)).map((d) => d.poolClass);

export function driverFor(poolClass: string): PoolDriver {
  const d = drivers.get(poolClass);
  if (!d) throw invalid(`pool class ${poolClass} is not one of ${poolClasses.join(", ")}`, { path: "input.class" });
  return d;
}

/** The pool's driver, if its class can do `what`; UNSUPPORTED (or INVALID_INPUT, for hosts) otherwise. */
export function requireCapability(pool: Pool, capability: Capability, what: string): PoolDriver {
  const d = driverFor(pool.class);
  if (d.capabilities.has(capability)) return d;
  const able = [...drivers.values()].filter((x) => x.capabilities.has(capability)).map((x) => x.label);
  const message = `${what} is not possible in pool ${pool.name}: ${d.label} cannot; ${able.join(" and ") || "no pool"} can`;
  // Asking a provider pool for hosts is a malformed request, not a missing feature.
  throw capability === "hosts" ? invalid(message) : new AppError("UNSUPPORTED", message);
}
