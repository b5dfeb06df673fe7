import { AppError, invalid } from "../../contracts/errors.ts";
import { setChangeHooks } from "../instances/changes.ts";
import { CAPABILITY_METHODS, type Capability, type DriverWith, type Pool, type PoolDriver } from "./driver.ts";

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
  for (const d of list)
    for (const c of d.capabilities)
      for (const m of CAPABILITY_METHODS[c]) if (!d[m]) throw new Error(`pool driver ${d.poolClass} declares ${c} but has no ${m}`);
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

export function driverFor(poolClass: string): PoolDriver {
  const d = drivers.get(poolClass);
  if (!d) throw invalid(`pool class ${poolClass} is not one of ${poolClasses().join(", ")}`, { path: "input.class" });
  return d;
}

/** The drivers whose class can do `capability`, in registration order. */
export const driversWith = <C extends Capability>(capability: C): DriverWith<C>[] =>
  registeredDrivers().filter((d): d is DriverWith<C> => d.capabilities.has(capability));

/** The classes whose driver can do `capability`: for a statement that checks a pool it has not read. */
export const classesWith = (capability: Capability): string[] => driversWith(capability).map((d) => d.poolClass);

/** The pool's driver, if its class can do `what`; UNSUPPORTED (or INVALID_INPUT, for hosts) otherwise. */
export function requireCapability<C extends Capability>(pool: Pick<Pool, "class" | "name">, capability: C, what: string): DriverWith<C> {
  const d = driverFor(pool.class);
  if (d.capabilities.has(capability)) return d as DriverWith<C>;
  const able = driversWith(capability).map((x) => x.label);
  const message = `${what} is not possible in pool ${pool.name}: ${d.label} cannot; ${able.join(" and ") || "no pool"} can`;
  // Asking a provider pool for hosts is a malformed request, not a missing feature.
  throw capability === "hosts" ? invalid(message) : new AppError("UNSUPPORTED", message);
}
