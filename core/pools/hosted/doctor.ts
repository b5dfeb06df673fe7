import { DEFAULT_RUNTIME, sharedKernelRuntimes } from "../../../contracts/runtimes.ts";
import { type Check, type DoctorDeps, type Survey, survey } from "../../books/doctor.ts";
import type { Sql } from "../../kernel/db.ts";

/**
 * Runtimes whose guests share the host's kernel: a tenant's code is then one kernel bug away from the host and
 * its neighbours, so such a pool should place one tenant per host. `fake` runs commands as host processes.
 */
const SHARED_KERNEL = new Set<string>(sharedKernelRuntimes);
/** A range this full is reported before it runs out. */
const IPAM_NEARLY_FULL = 0.9;

interface HostedPool {
  id: string;
  name: string;
  runtime: string | null;
  singleTenant: boolean;
  cidr: string | null;
  total: number;
  used: number;
}

/** Every hosted pool with its range and how many of the range's addresses are leased. */
function hostedPools(sql: Sql): Promise<HostedPool[]> {
  return sql.query<HostedPool>(
    `SELECT p.id, p.name, p.runtime, COALESCE((p.policy->>'singleTenant')::boolean, false) AS "singleTenant", ip.cidr,
            (SELECT count(*)::int FROM ip_addresses a WHERE a.ip_pool_id = ip.id) AS total,
            (SELECT count(*)::int FROM ip_addresses a WHERE a.ip_pool_id = ip.id AND a.instance_id IS NOT NULL) AS used
       FROM pools p LEFT JOIN ip_pools ip ON ip.pool_id = p.id WHERE p.class = 'vps-host' ORDER BY p.name`,
  );
}

/** The runtime a pool's hosts run: its own, else the deployment's first. */
const runtimeOf = (p: HostedPool, deps: DoctorDeps) => p.runtime ?? deps.runtimes[0] ?? DEFAULT_RUNTIME;

/** `vps.pools.runtime`: a pool whose runtime the deployment does not list. */
const runtimeListed: Check<HostedPool> = (p, deps) => {
  const runtime = runtimeOf(p, deps);
  if (!deps.runtimes.includes(runtime))
    return {
      id: "vps.pools.runtime",
      severity: "error",
      subject: p.id,
      message: `pool ${p.name} runs ${runtime}, which this deployment does not list`,
      hint: `add ${runtime} to VPS_RUNTIMES, or move the pool's hosts to a listed runtime`,
    };
  return undefined;
};

/** `vps.pools.single-tenant`: a pool on a kernel-sharing runtime that hosts several tenants. */
const singleTenant: Check<HostedPool> = (p, deps) => {
  const runtime = runtimeOf(p, deps);
  if (SHARED_KERNEL.has(runtime) && !p.singleTenant)
    return {
      id: "vps.pools.single-tenant",
      severity: "warning",
      subject: p.id,
      message: `pool ${p.name} runs ${runtime}, whose guests share the host's kernel, and hosts several tenants`,
      hint: "make the pool single-tenant (policy singleTenant), so each host serves one tenant",
    };
  return undefined;
};

/** `vps.pools.ipam`: a pool without a range (nothing can be admitted), or with one nearly all leased. */
const ipamRange: Check<HostedPool> = (p) => {
  if (!p.cidr)
    return {
      id: "vps.pools.ipam",
      severity: "error",
      subject: p.id,
      message: `pool ${p.name} has no IPv4 range: nothing can be admitted to it`,
      hint: "give the pool an IPv4 range (createPool's ipv4Range)",
    };
  if (p.total > 0 && p.used / p.total >= IPAM_NEARLY_FULL)
    return {
      id: "vps.pools.ipam",
      severity: "warning",
      subject: p.id,
      message: `pool ${p.name}'s range ${p.cidr} is ${Math.round((100 * p.used) / p.total)}% leased (${p.used} of ${p.total})`,
      hint: "add a pool with another range, or delete instances that are not needed",
    };
  return undefined;
};

interface Host {
  id: string;
  name: string;
  capVcpus: number;
  lostAt: Date | null;
  lastReportAt: Date | null;
  createdAt: Date;
}

/** Every node not declared gone. */
function hosts(sql: Sql): Promise<Host[]> {
  return sql.query<Host>(
    `SELECT id, name, cap_vcpus AS "capVcpus", lost_at AS "lostAt", last_report_at AS "lastReportAt", created_at AS "createdAt"
       FROM nodes WHERE gone_at IS NULL ORDER BY name`,
  );
}

/** `vps.hosts.capacity`: a host that joined but never said what it offers. */
const hostCapacity: Check<Host> = (n) => {
  if (n.capVcpus <= 0)
    return {
      id: "vps.hosts.capacity",
      severity: "warning",
      subject: n.id,
      message: `host ${n.name} has joined but has no capacity on record: nothing is placed on it`,
      hint: "start its agent so that it reports what the host offers",
    };
  return undefined;
};

/** `vps.hosts.lost`: a host past the lost grace, whose instances are lost. */
const hostLost: Check<Host> = (n) => {
  if (n.lostAt)
    return {
      id: "vps.hosts.lost",
      severity: "error",
      subject: n.id,
      message: `host ${n.name} has been silent since ${(n.lastReportAt ?? n.lostAt).toISOString()}; its instances are lost`,
      hint: "bring its agent back, or declare the host gone (declareNodeGone) to recreate its instances elsewhere",
    };
  return undefined;
};

/** `vps.hosts.silent`: a host silent for half the lost grace, and not lost yet (lost says more). */
const hostSilent: Check<Host> = (n, deps) => {
  const silentMs = deps.now.getTime() - (n.lastReportAt ?? n.createdAt).getTime();
  if (!n.lostAt && silentMs > deps.lostGraceMs / 2)
    return {
      id: "vps.hosts.silent",
      severity: "warning",
      subject: n.id,
      message: `host ${n.name} has not reported for ${Math.round(silentMs / 1000)} s`,
      hint: "check its agent and its network path to the server; it is declared lost after the grace",
    };
  return undefined;
};

/** The doctor's surveys of hosted pools (the hosted driver's `doctor`): their runtime, tenancy and range, then their hosts. */
export const hostedChecks: readonly Survey[] = [
  survey(hostedPools, [runtimeListed, singleTenant, ipamRange]),
  survey(hosts, [hostCapacity, hostLost, hostSilent]),
];
