import { commonChecks, type DoctorDeps, type Finding } from "../books/doctor.ts";
import type { Sql } from "../kernel/db.ts";
import { registeredDrivers } from "./registry.ts";

/**
 * The doctor's report (core/books/doctor.ts): each pool class's surveys, from its driver, in the order the drivers
 * are registered, then the surveys of no class, one after another in the caller's transaction. Assembled here,
 * where the drivers are found, so that no check of a class is written outside that class's folder.
 */
export async function doctor(sql: Sql, deps: DoctorDeps): Promise<Finding[]> {
  const out: Finding[] = [];
  for (const survey of [...registeredDrivers().flatMap((d) => d.doctor ?? []), ...commonChecks]) out.push(...(await survey(sql, deps)));
  return out;
}
