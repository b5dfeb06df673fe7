import { AppError, invalid, notFound } from "../../../contracts/errors.ts";
import { closeSpan, openSpan, spanOwner } from "../../books/spans.ts";
import type { Shape } from "../../catalog/shapes.ts";
import { queueExec } from "../../commands/exec.ts";
import { powerInStatement, powerKind, queuePowerAfterChange, queuePowerWithChange } from "../../commands/power.ts";
import { queueSnapshot } from "../../commands/snapshot.ts";
import { stepsWithoutHost } from "../../instances/decide.ts";
import type { Instance } from "../../instances/model.ts";
import { one } from "../../kernel/db.ts";
import { SQL } from "../../kernel/sql.ts";
import { ContendedWrite, type Write } from "../../kernel/write.ts";
import type { AdmitRequest, DeferredHold, PoolDriver, PoolInput } from "../driver.ts";
import { hostedChecks } from "./doctor.ts";
import { specGenerations } from "./generations.ts";
import { parseRange } from "./ipam.ts";
import { createAddresses, leaseAddress, leaseSql, noFreeAddress } from "./leases.ts";
import { type PlaceRequest, place, placeInStatement, releaseAllocation, unschedulable } from "./placement.ts";
import { reconcileHosted, releaseHosted } from "./reconcile.ts";

/**
 * Hosted pools (`vps-host`): VMs on the operator's own hosts, each running our agent. Admission places the
 * instance on one node (vCPU, memory, disk, whole GPUs) and leases it an address from the pool's range; the
 * host converges it and its reports drive the reconciler.
 */
export const hostedDriver: PoolDriver = {
  poolClass: "vps-host",
  label: "hosted pools",
  capabilities: new Set(["hosts", "pause", "resize", "snapshot", "exec"]),

  async prepare(_sql, input, deps) {
    if (!input.ipv4Range) throw invalid("a vps-host pool needs an ipv4Range", { path: "input.ipv4Range" });
    if (input.providerAccountId) throw invalid("a vps-host pool takes no providerAccountId", { path: "input.providerAccountId" });
    parseRange(input.ipv4Range, input.ipv4Gateway ?? undefined);
    return { agent: "bcd", runtime: deps.runtimes[0] ?? null, providerAccountId: null };
  },

  async provision(w, pool, input: PoolInput) {
    const range = parseRange(input.ipv4Range as string, input.ipv4Gateway ?? undefined);
    // Hosted pools may share bridges and hosts: two ranges that overlap would lease one address twice. Pools
    // are made rarely, so one lock for all of them turns check-then-insert into a safe pair.
    await w.sql.query(`SELECT pg_advisory_xact_lock(hashtextextended('ip_pools', 0))`);
    const other = await one<{ pool_id: string; cidr: string }>(
      w.sql,
      `SELECT pool_id, cidr FROM ip_pools WHERE cidr::inet && $1::inet ORDER BY pool_id LIMIT 1`,
      [range.cidr],
    );
    if (other) {
      throw new AppError("CONFLICT", `ipv4Range ${range.cidr} overlaps ${other.cidr} of pool ${other.pool_id}`, {
        path: "input.ipv4Range",
        poolId: other.pool_id,
      });
    }
    const id = w.ids("ipp");
    await w.sql.query(`INSERT INTO ip_pools (id, pool_id, cidr, network, prefix, gateway_offset) VALUES ($1, $2, $3, $4, $5, $6)`, [
      id,
      pool.id,
      range.cidr,
      range.network,
      range.prefix,
      range.gatewayOffset,
    ]);
    await createAddresses(w.sql, id, range);
  },

  checkFlavor() {},

  async admit(w, req, deps) {
    const image = req.image !== undefined ? req.image : await deps.images.resolve(w.sql, req.tenantId, req.imageId);
    if (!image) throw notFound("image", req.imageId);
    const placeReq: PlaceRequest = {
      poolId: req.pool.id,
      tenantId: req.tenantId,
      instanceId: req.instanceId,
      shape: req.shape,
      singleTenant: req.pool.singleTenant,
      ...(req.onlyNodeId ? { onlyNodeId: req.onlyNodeId } : {}),
      bumpSpec: true,
    };
    // Placed on a ready node: what the reconciler would do next needs no host, so the create does it.
    const steps = stepsWithoutHost({
      state: "pending",
      desired: req.desiredState,
      placed: true,
      node: { lost: false, gone: false },
      observed: null,
      attempts: 0,
      maxAttempts: deps.maxRecreateAttempts,
      retryRequested: false,
    });
    const runtime = deps.runtimes[0] ?? null;
    // The common case (no GPUs, any node; and not a retry, which takes the step-by-step way below): admission's
    // last statement takes the address and the node.
    if (!req.shape.gpus.length && !req.onlyNodeId && w.attempt === 1 && !deps.placeStepByStep) {
      return {
        nodeId: null,
        allocationId: null,
        addresses: [],
        image,
        runtime,
        converged: { steps, specGeneration: 0 },
        deferred: deferredHold(w, req, placeReq),
      };
    }
    // The address first: its rows are skipped when locked, never waited for, so it holds no one up; the node's
    // row, which creates queue on, is claimed as late as admission can.
    const address = await leaseAddress(w.sql, req.pool.id, req.instanceId, w.now);
    const placement = await place(w.sql, w.ids, placeReq);
    return {
      nodeId: placement.nodeId,
      allocationId: placement.allocationId,
      addresses: [address],
      image,
      runtime,
      converged: { steps, specGeneration: placement.specGeneration },
    };
  },

  /** In place, on the instance's own node: the old claim is given back and the new one taken in this transaction. */
  async resize(w, inst: Instance, pool, next: Shape) {
    if (!inst.nodeId || !inst.allocationId) throw new AppError("PRECONDITION_FAILED", `instance ${inst.id} holds no placement`);
    await closeSpan(w, inst.allocationId);
    await releaseAllocation(w.sql, inst.allocationId);
    const placed = await place(w.sql, w.ids, {
      poolId: inst.poolId,
      tenantId: inst.tenantId,
      instanceId: inst.id,
      shape: next,
      singleTenant: pool.singleTenant,
      onlyNodeId: inst.nodeId,
    });
    await openSpan(w, placed.allocationId, spanOwner(inst));
    return { allocation_id: placed.allocationId };
  },

  // What the instance's host does on request: host commands (core/commands/), queued for the node it runs on.
  power: {
    withChange: (w, inst, to) => queuePowerWithChange(w, onNode(inst), powerKind(to)),
    after: (w, changed, to) => queuePowerAfterChange(w, onNode(changed), powerKind(to)),
    inStatement: (w, instanceId, to, from) => powerInStatement(w, instanceId, powerKind(to), from),
  },
  snapshot: (w, inst, snapshotId, timeoutMs) => queueSnapshot(w, onNode(inst), "instance.snapshot", snapshotId, timeoutMs),
  restore: (w, inst, snapshotId, timeoutMs) => queueSnapshot(w, onNode(inst), "instance.restore", snapshotId, timeoutMs),
  exec: (w, inst, args) => queueExec(w, onNode(inst), args),

  release: (w: Write, inst: Instance) => releaseHosted(w, inst),

  reconcile: (w, inst, pool, deps) => reconcileHosted(w, inst, pool, deps.maxRecreateAttempts),

  changeHook: specGenerations,

  doctor: hostedChecks,
};

/** The instance with the node it runs on: a host command needs one (callers check it runs). */
function onNode<I extends { id: string; nodeId: string | null }>(inst: I): I & { nodeId: string } {
  if (!inst.nodeId) throw new AppError("PRECONDITION_FAILED", `instance ${inst.id} is on no host`);
  return inst as I & { nodeId: string };
}

/** The address, then the node (only once the address is held), as CTEs of admission's last statement. */
function deferredHold(w: Write, req: AdmitRequest, placeReq: PlaceRequest): DeferredHold {
  const placement = placeInStatement(placeReq, w.ids("alloc"), SQL`EXISTS (SELECT FROM lease)`);
  return {
    ctes: (gate) => SQL`lease AS (${leaseSql(req.pool.id, req.instanceId, w.now, gate)}),
       ${placement},
       held AS (SELECT claimed.id AS node_id, claimed.spec_generation AS generation, (SELECT array_agg(address) FROM lease) AS addresses,
                       made.id AS allocation_id, claimed.picked
                  FROM (SELECT 1) one LEFT JOIN claimed ON true LEFT JOIN made ON true)`,
    async refusal(sql, held) {
      if (!held.addresses?.length) return noFreeAddress(req.pool.id);
      if (!held.picked) return unschedulable(sql, placeReq);
      // A node was picked and locked but no longer fit once free, and no other was tried: the write's retry
      // places step by step, trying every node.
      return new ContendedWrite(`placement of ${req.instanceId} lost its node to a concurrent create`);
    },
  };
}
