import { AppError, invalid, notFound } from "../../contracts/errors.ts";
import type { Principal } from "../auth/principal.ts";
import { flavorByName } from "../catalog/flavors.ts";
import { chargeOf, gpuCount, type Shape, shape as shapeSchema } from "../catalog/shapes.ts";
import { lockInstance, writeChange } from "../instances/changes.ts";
import type { Instance } from "../instances/model.ts";
import type { DesiredState } from "../instances/state.ts";
import { parseInput } from "../kernel/validation.ts";
import type { Write } from "../kernel/write.ts";
import { lockInstanceAndPool, requirePool } from "../pools/pools.ts";
import { driverFor, requireCapability } from "../pools/registry.ts";
import { chargeQuota, releaseQuota } from "../tenancy/quota.ts";
import { powerInOneMessage, requestPower } from "./power-requests.ts";

/**
 * What owners ask of an existing instance. Requests only record intent (desiredState) and wake the reconciler;
 * the few that change holdings at once (resize) do it in the request's transaction, so a refusal leaves
 * everything as it was.
 */

/** A sandbox's instance (or a warm one) lives and dies with its sandbox: the sandboxes API drives it. */
function notSandboxed(inst: Instance): Instance {
  if (inst.sandboxId || inst.warmTemplateId)
    throw new AppError(
      "PRECONDITION_FAILED",
      inst.sandboxId ? `instance ${inst.id} runs sandbox ${inst.sandboxId}: use the sandboxes API` : `instance ${inst.id} is held in a warm pool`,
      { sandboxId: inst.sandboxId },
    );
  return inst;
}

/**
 * start / stop / pause / delete. Asking again for what is already asked changes nothing, except on an instance
 * in error: there, asking for it to run (or be paused) is a retry (error → starting), however often it fails.
 */
export async function setDesiredState(w: Write, who: Principal, id: string, desired: DesiredState): Promise<Instance> {
  if (powerInOneMessage(w, who, desired)) return requestPower(w, who, id, desired);
  const held = await lockInstanceAndPool(w, who, id);
  if (!held) throw notFound("instance", id);
  const { inst, pool } = held;
  notSandboxed(inst);
  const retry = inst.state === "error" && (desired === "running" || desired === "paused") && inst.desiredState !== "deleted";
  if (inst.desiredState === desired && !(retry && !inst.retryRequested)) {
    w.unchanged();
    return inst;
  }
  if (inst.desiredState === "deleted") throw new AppError("PRECONDITION_FAILED", `instance ${id} is being deleted`, { state: inst.state });
  // Pausing keeps the guest's memory on a host of ours; not every pool class has such a verb.
  if (desired === "paused") requireCapability(pool, "pause", "pausing an instance");
  w.audit({ targetId: inst.id, tenantId: inst.tenantId, details: retry ? { desired, retry: true } : { desired } });
  if (!retry) {
    // Pausing and resuming also go to the host at once, through the pool's driver, confirmed by its answer,
    // instead of waiting for a converge pass over the node's spec and the report after it; the spec says the
    // same, so a move lost on the way only delays.
    const { power } = driverFor(pool.class);
    const moves = (desired === "paused" && inst.state === "running") || (desired === "running" && inst.state === "paused");
    if (!moves || !power || !inst.nodeId) return writeChange(w, inst, { desired_state: desired }, `requested:${desired}`, { last: true });
    // What the driver queues rides in the change's statement (the write's last, with the audit row and the
    // commit), which gives it the spec generation it names.
    const queued = await power.withChange(w, inst, desired);
    const changed = await writeChange(w, inst, { desired_state: desired }, `requested:${desired}`, { last: true });
    queued(changed);
    // Nothing for a reconcile pass to do until the host answers, and its answer wakes the instance.
    w.settle(inst.id);
    return changed;
  }
  return writeChange(w, inst, { desired_state: desired, retry_requested: true }, inst.desiredState === desired ? "requested:retry" : `requested:${desired}`, {
    last: true,
  });
}

/**
 * Resize in place: stopped only, same number of GPUs, a disk that only grows. The pool's driver gives back the
 * old hold and takes the new one; the quota charge moves with it.
 */
export async function resizeInstance(w: Write, who: Principal, id: string, flavorName: string): Promise<Instance> {
  const inst = notSandboxed(await lockInstance(w, who, id));
  const pool = await requirePool(w.sql, inst.poolId);
  const driver = requireCapability(pool, "resize", "resizing an instance");
  if (inst.state !== "stopped" || inst.desiredState !== "stopped") {
    throw new AppError("PRECONDITION_FAILED", `resize needs a stopped instance; ${id} is ${inst.state} (desired ${inst.desiredState})`, { state: inst.state });
  }
  const flavor = await flavorByName(w.sql, inst.poolId, flavorName);
  if (!flavor) throw notFound("flavor", `${flavorName} in pool ${inst.poolId}`);
  if (flavor.name === inst.flavor) {
    w.unchanged();
    return inst;
  }
  const next: Shape = parseInput(shapeSchema, flavor, "flavor");
  const held = gpuCount(inst);
  if (gpuCount(next) !== held) throw invalid(`resize keeps the GPU count: ${inst.flavor} has ${held}, ${flavor.name} has ${gpuCount(next)}`);
  // A disk only grows: shrinking it would cut off whatever the guest wrote past the new end.
  if (next.diskGib < inst.diskGib)
    throw invalid(`resize cannot shrink the disk: ${inst.flavor} has ${inst.diskGib} GiB, ${flavor.name} has ${next.diskGib} GiB`);
  const moved = await driver.resize(w, inst, pool, next);
  const charge = chargeOf(next);
  await releaseQuota(w.sql, inst.tenantId, inst.charge);
  await chargeQuota(w.sql, inst.tenantId, charge);
  w.audit({ targetId: inst.id, tenantId: inst.tenantId, details: { from: inst.flavor, to: flavor.name } });
  return writeChange(
    w,
    inst,
    { ...moved, state: "resizing", flavor: flavor.name, vcpus: next.vcpus, memory_mib: next.memoryMib, disk_gib: next.diskGib, gpus: next.gpus, charge },
    "requested:resize",
  );
}
