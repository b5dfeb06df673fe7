import type { Sql } from "../kernel/db.ts";
import { accountingDrift } from "./accounting.ts";

/**
 * The doctor: what an operator should fix before tenants notice, read from the rows. Each finding has a stable
 * id (what it is about), a severity, its subject, what is wrong, and how to fix it.
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

/**
 * Runtimes whose guests share the host's kernel: a tenant's code is then one kernel bug away from the host and
 * its neighbours, so such a pool should place one tenant per host. `fake` runs commands as host processes.
 */
const SHARED_KERNEL = new Set(["fake"]);
/** A range this full is reported before it runs out. */
const IPAM_NEARLY_FULL = 0.9;
/** A warm pool short of its target for this long, with nothing booting to fill it, cannot fill. */
const WARM_STUCK_MS = 60_000;

export async function doctor(sql: Sql, deps: DoctorDeps): Promise<Finding[]> {
  const out: Finding[] = [];
  const add = (id: string, severity: Severity, subject: string, message: string, hint: string) => out.push({ id, severity, subject, message, hint });

  const pools = await sql.query<{ id: string; name: string; runtime: string | null; singleTenant: boolean; cidr: string | null; total: number; used: number }>(
    `SELECT p.id, p.name, p.runtime, COALESCE((p.policy->>'singleTenant')::boolean, false) AS "singleTenant", ip.cidr,
            (SELECT count(*)::int FROM ip_addresses a WHERE a.ip_pool_id = ip.id) AS total,
            (SELECT count(*)::int FROM ip_addresses a WHERE a.ip_pool_id = ip.id AND a.instance_id IS NOT NULL) AS used
       FROM pools p LEFT JOIN ip_pools ip ON ip.pool_id = p.id WHERE p.class = 'vps-host' ORDER BY p.name`,
  );
  for (const p of pools) {
    const runtime = p.runtime ?? deps.runtimes[0] ?? "libvirt-kvm";
    if (!deps.runtimes.includes(runtime))
      add(
        "vps.pools.runtime",
        "error",
        p.id,
        `pool ${p.name} runs ${runtime}, which this deployment does not list`,
        `add ${runtime} to VPS_RUNTIMES, or move the pool's hosts to a listed runtime`,
      );
    if (SHARED_KERNEL.has(runtime) && !p.singleTenant)
      add(
        "vps.pools.single-tenant",
        "warning",
        p.id,
        `pool ${p.name} runs ${runtime}, whose guests share the host's kernel, and hosts several tenants`,
        "make the pool single-tenant (policy singleTenant), so each host serves one tenant",
      );
    if (!p.cidr)
      add(
        "vps.pools.ipam",
        "error",
        p.id,
        `pool ${p.name} has no IPv4 range: nothing can be admitted to it`,
        "give the pool an IPv4 range (createPool's ipv4Range)",
      );
    else if (p.total > 0 && p.used / p.total >= IPAM_NEARLY_FULL)
      add(
        "vps.pools.ipam",
        "warning",
        p.id,
        `pool ${p.name}'s range ${p.cidr} is ${Math.round((100 * p.used) / p.total)}% leased (${p.used} of ${p.total})`,
        "add a pool with another range, or delete instances that are not needed",
      );
  }

  const nodes = await sql.query<{ id: string; name: string; capVcpus: number; lostAt: Date | null; lastReportAt: Date | null; createdAt: Date }>(
    `SELECT id, name, cap_vcpus AS "capVcpus", lost_at AS "lostAt", last_report_at AS "lastReportAt", created_at AS "createdAt"
       FROM nodes WHERE gone_at IS NULL ORDER BY name`,
  );
  const silentAfter = deps.lostGraceMs / 2;
  for (const n of nodes) {
    if (n.capVcpus <= 0)
      add(
        "vps.hosts.capacity",
        "warning",
        n.id,
        `host ${n.name} has joined but has no capacity on record: nothing is placed on it`,
        "start its agent so that it reports what the host offers",
      );
    if (n.lostAt)
      add(
        "vps.hosts.lost",
        "error",
        n.id,
        `host ${n.name} has been silent since ${(n.lastReportAt ?? n.lostAt).toISOString()}; its instances are lost`,
        "bring its agent back, or declare the host gone (declareNodeGone) to recreate its instances elsewhere",
      );
    else if (deps.now.getTime() - (n.lastReportAt ?? n.createdAt).getTime() > silentAfter)
      add(
        "vps.hosts.silent",
        "warning",
        n.id,
        `host ${n.name} has not reported for ${Math.round((deps.now.getTime() - (n.lastReportAt ?? n.createdAt).getTime()) / 1000)} s`,
        "check its agent and its network path to the server; it is declared lost after the grace",
      );
  }

  const accounts = await sql.query<{ id: string; name: string; provider: string; checkError: string | null; checkErrorKind: string | null }>(
    `SELECT id, name, provider, check_error AS "checkError", check_error_kind AS "checkErrorKind" FROM provider_accounts WHERE check_error IS NOT NULL ORDER BY name`,
  );
  for (const a of accounts) {
    const auth = a.checkErrorKind === "auth";
    add(
      auth ? "vps.providers.credentials" : "vps.providers.unreachable",
      auth ? "error" : "warning",
      a.id,
      `provider account ${a.name} (${a.provider}): ${a.checkError}`,
      auth
        ? "replace the account's credentials (deleteProviderAccount, then create it again with working ones)"
        : "check the provider's status and the account's configuration",
    );
  }

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
