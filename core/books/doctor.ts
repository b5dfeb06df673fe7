import type { Sql } from "../kernel/db.ts";
import { accountingDrift, type Drift } from "./accounting.ts";

/**
 * The doctor: what an operator should fix before tenants notice, read from the rows. Each finding has a stable
 * id (what it is about), a severity, its subject, what is wrong, and how to fix it. The report (core/pools/doctor.ts)
 * is each pool class's surveys (its driver's `doctor`), then the surveys here, which look at no pool class.
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

/** One kind of finding, checked on one row a survey read: its finding, or none. */
export type Check<Row> = (row: Row, deps: DoctorDeps) => Finding | undefined;

/** A survey: one read of the rows, each put through its checks. */
export type Survey = (sql: Sql, deps: DoctorDeps) => Promise<Finding[]>;

/**
 * The survey of `read`'s rows by `checks`. Findings come row by row, and a row's in the order of its checks:
 * a subject's findings stay together, and each table is read once however many kinds look at it.
 */
export function survey<Row>(read: (sql: Sql, deps: DoctorDeps) => Promise<Row[]>, checks: readonly Check<Row>[]): Survey {
  return async (sql, deps) => {
    const out: Finding[] = [];
    for (const row of await read(sql, deps))
      for (const check of checks) {
        const found = check(row, deps);
        if (found) out.push(found);
      }
    return out;
  };
}

/** A warm pool short of its target for this long, with nothing booting to fill it, cannot fill. */
const WARM_STUCK_MS = 60_000;

interface WarmPool {
  id: string;
  name: string;
  target: number;
  ready: number;
  warming: number;
  failed: number;
}

/** Templates whose warm pool is short with nothing booting to fill it, or holds failed instances, past their time. */
function stuckWarmPools(sql: Sql, deps: DoctorDeps): Promise<WarmPool[]> {
  return sql.query<WarmPool>(
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
}

/** `vps.sandboxes.warm`: the read found only pools that cannot fill. */
const warmPoolStuck: Check<WarmPool> = (t) => ({
  id: "vps.sandboxes.warm",
  severity: "warning",
  subject: t.id,
  message: `template ${t.name}'s warm pool cannot fill: target ${t.target}, ${t.ready} ready, ${t.warming} booting, ${t.failed} failed`,
  hint: "give its pool room (hosts, capacity, addresses), or lower the template's warm target",
});

/** `vps.accounting.<kind>`: each drift the accounting audit found. */
const booksDrift: Check<Drift> = (d) => ({
  id: `vps.accounting.${d.kind}`,
  severity: "error",
  subject: d.subject,
  message: d.detail,
  hint: "the books disagree with the instances: report this as a bug, with the finding",
});

/** The accounting audit of every pool. */
const allDrift = (sql: Sql) => accountingDrift(sql);

/** The surveys of no pool class: warm pools that cannot fill, then the books against the instances. */
export const commonChecks: readonly Survey[] = [survey(stuckWarmPools, [warmPoolStuck]), survey(allDrift, [booksDrift])];
