import type { Sql } from "../kernel/db.ts";
import { accountingDrift } from "./accounting.ts";

/**
 * The doctor: what an operator should fix before tenants notice, read from the rows. Each finding has a stable
 * id (what it is about), a severity, its subject, what is wrong, and how to fix it. The report (core/pools/doctor.ts)
 * is each pool class's checks (its driver's `doctor`), then the checks here, which look at no pool class.
 */
export type Severity = "info" | "warning" | "error";

export interface Finding {
  id: string;
  severity: Severity;
  subject: string;
  message: string;
  hint: string;
}

export interface DoctorDeps {
  /** The runtimes the deployment lists (`VPS_RUNTIMES`). */
  runtimes: readonly string[];
  /** A node silent this long is lost; half of it is reported as silent first. */
  lostGraceMs: number;
  now: Date;
}

/** Findings, and the `add` a check fills them with. */
export function findings() {
  const out: Finding[] = [];
  const add = (id: string, severity: Severity, subject: string, message: string, hint: string) => void out.push({ id, severity, subject, message, hint });
  return { out, add };
}

/** A warm pool short of its target for this long, with nothing booting to fill it, cannot fill. */
const WARM_STUCK_MS = 60_000;

/** The checks of no pool class: warm pools that cannot fill, and the books against the instances. */
export async function commonChecks(sql: Sql, deps: DoctorDeps): Promise<Finding[]> {
  const { out, add } = findings();
  const stuck = await sql.query<{ id: string; name: string; target: number; ready: number; warming: number; failed: number }>(
    `SELECT t.id, t.name, t.warm_target AS target,
            count(*) FILTER (WHERE i.state = 'paused')::int AS ready,
            count(*) FILTER (WHERE i.state NOT IN ('paused', 'error', 'lost', 'deleting'))::int AS warming,
            count(*) FILTER (WHERE i.state IN ('error', 'lost'))::int AS failed
       FROM sandbox_templates t
       LEFT JOIN instances i ON i.warm_template_id = t.id AND i.warm_template_version = t.version AND i.claimed_at IS NULL AND i.state <> 'deleted'
      WHERE t.warm_target > 0 AND t.updated_at < $1
        AND NOT EXISTS (SELECT 1 FROM instances c WHERE c.warm_template_id = t.id AND c.claimed_at >= $1)
      GROUP BY t.id HAVING count(*) FILTER (WHERE i.state = 'paused') + count(*) FILTER (WHERE i.state NOT IN ('paused', 'error', 'lost', 'deleting')) < t.warm_target
         OR count(*) FILTER (WHERE i.state IN ('error', 'lost')) > 0
      ORDER BY t.name`,
    [new Date(deps.now.getTime() - WARM_STUCK_MS)],
  );
  for (const t of stuck)
    add(
      "vps.sandboxes.warm",
      "warning",
      t.id,
      `template ${t.name}'s warm pool cannot fill: target ${t.target}, ${t.ready} ready, ${t.warming} booting, ${t.failed} failed`,
      "give its pool room (hosts, capacity, addresses), or lower the template's warm target",
    );

  for (const d of await accountingDrift(sql))
    add(`vps.accounting.${d.kind}`, "error", d.subject, d.detail, "the books disagree with the instances: report this as a bug, with the finding");
  return out;
}
