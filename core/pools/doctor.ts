import { commonChecks, type DoctorDeps, type Finding } from "../books/doctor.ts";
import type { Sql } from "../kernel/db.ts";
import { registeredDrivers } from "./registry.ts";

/**
 * The doctor's report (core/books/doctor.ts): each pool class's checks, from its driver, in the order the drivers
 * are registered, then the checks of no class. Assembled here, where the drivers are found, so that no check of a
 * class is written outside that class's folder.
 */
export async function doctor(sql: Sql, deps: DoctorDeps): Promise<Finding[]> {
  const out: Finding[] = [];
  for (const driver of registeredDrivers()) if (driver.doctor) out.push(...(await driver.doctor(sql, deps)));
  out.push(...(await commonChecks(sql, deps)));
  return out;
}
