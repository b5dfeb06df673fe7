import { AppError, invalid } from "../../contracts/errors.ts";
import { setChangeHooks } from "../instances/changes.ts";
import type { Capability, Pool, PoolDriver } from "./driver.ts";

/**
 * The pool drivers, by class: the one place a pool's class is looked at. The drivers themselves are registered
 * from outside this folder (core/drivers.ts lists the built-ins), since each driver's folder builds on the seam
 * here: a new kind of pool is a driver of its own, added to that list (docs/architecture.md, "Where to add a pool class").
 */
const drivers = new Map<string, PoolDriver>();

/**
 * Make these drivers the ones pools are served by, and hand the instance changes what each adds to a change's
 * statement (`PoolDriver.changeHook`). Idempotent: every process (and every test platform) calls it on opening.
 */
export function registerDrivers(list: readonly PoolDriver[]): void {
  drivers.clear();
  for (const d of list) drivers.set(d.poolClass, d);
  setChangeHooks(list.flatMap((d) => (d.changeHook ? [d.changeHook] : [])));
}

/** The registered drivers, in registration order. Before registration nothing can be served: that is a wiring mistake, not a request's. */
export function registeredDrivers(): PoolDriver[] {
  if (!drivers.size) throw new Error("no pool drivers are registered: the process must call registerBuiltInDrivers (core/drivers.ts) first");
  return [...drivers.values()];
}

/** The classes a pool may have, as stored (`vps-host`, `provider`). */
export const poolClasses = (): string[] => registeredDrivers().map((d) => d.poolClass);

/** The classes whose driver can do `capability`: for a statement that checks a pool it has not read. */
export const classesWith = (capability: Capability): string[] =>
  registeredDrivers()
    .filter((d) => d.capabilities.has(capability))
    .map((d) => d.poolClass);

export function driverFor(poolClass: string): PoolDriver {
  const d = drivers.get(poolClass);
  if (!d) throw invalid(`pool class ${poolClass} is not one of ${poolClasses().join(", ")}`, { path: "input.class" });
  return d;
}

/** The pool's driver, if its class can do `what`; UNSUPPORTED (or INVALID_INPUT, for hosts) otherwise. */
export function requireCapability(pool: Pool, capability: Capability, what: string): PoolDriver {
  const d = driverFor(pool.class);
  if (d.capabilities.has(capability)) return d;
  const able = registeredDrivers()
    .filter((x) => x.capabilities.has(capability))
    .map((x) => x.label);
  const message = `${what} is not possible in pool ${pool.name}: ${d.label} cannot; ${able.join(" and ") || "no pool"} can`;
  // Asking a provider pool for hosts is a malformed request, not a missing feature.
  throw capability === "hosts" ? invalid(message) : new AppError("UNSUPPORTED", message);
}
