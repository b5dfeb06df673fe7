import { DEFAULT_RUNTIME, sharedKernelRuntimes } from "../../../contracts/runtimes.ts";
import { type DoctorDeps, type Finding, findings } from "../../books/doctor.ts";
import type { Sql } from "../../kernel/db.ts";

/**
 * Runtimes whose guests share the host's kernel: a tenant's code is then one kernel bug away from the host and
 * its neighbours, so such a pool should place one tenant per host. `fake` runs commands as host processes.
 */
const SHARED_KERNEL = new Set<string>(sharedKernelRuntimes);
/** A range this full is reported before it runs out. */
const IPAM_NEARLY_FULL = 0.9;

/** The doctor's checks of hosted pools (the hosted driver's `doctor`): their runtime, tenancy and range, then their hosts. */
export async function hostedChecks(sql: Sql, deps: DoctorDeps): Promise<Finding[]> {
  const { out, add } = findings();
  const pools = await sql.query<{ id: string; name: string; runtime: string | null; singleTenant: boolean; cidr: string | null; total: number; used: number }>(
    `SELECT p.id, p.name, p.runtime, COALESCE((p.policy->>'singleTenant')::boolean, false) AS "singleTenant", ip.cidr,
            (SELECT count(*)::int FROM ip_addresses a WHERE a.ip_pool_id = ip.id) AS total,
            (SELECT count(*)::int FROM ip_addresses a WHERE a.ip_pool_id = ip.id AND a.instance_id IS NOT NULL) AS used
       FROM pools p LEFT JOIN ip_pools ip ON ip.pool_id = p.id WHERE p.class = 'vps-host' ORDER BY p.name`,
  );
  for (const p of pools) {
    const runtime = p.runtime ?? deps.runtimes[0] ?? DEFAULT_RUNTIME;
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
  return out;
}
