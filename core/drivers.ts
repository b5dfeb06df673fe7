import type { PoolDriver } from "./pools/driver.ts";
import { hostedDriver } from "./pools/hosted/driver.ts";
import { providerDriver } from "./pools/provider/driver.ts";
import { registerDrivers } from "./pools/registry.ts";

/**
 * The pool drivers this platform is built with, by class, and their registration: the one module that names
 * them (the registry in core/pools/ may not import the drivers, which build on it). Every process registers
 * them as it opens its platform (infra/platform.ts `openPlatform`), before anything reads a pool's class or
 * changes an instance: a change's statement carries what each class adds to it (PoolDriver.changeHook).
 * **Where to add a pool class**: its driver in core/pools/<class>/driver.ts, listed here.
 */
export const BUILT_IN_DRIVERS: readonly PoolDriver[] = [hostedDriver, providerDriver];

/** Register the built-in drivers (core/pools/registry.ts). Idempotent. */
export function registerBuiltInDrivers(): void {
  registerDrivers(BUILT_IN_DRIVERS);
}
