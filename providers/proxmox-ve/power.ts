import { reasonOf } from "./http.ts";
import type { Ref, Vms } from "./vms.ts";

/**
 * Power and removal. These return once PVE has taken the task (the platform polls get() for the outcome),
 * except where the next step needs the outcome: a VM must be stopped before PVE destroys it.
 */

export async function powerOn(vms: Vms, ref: Ref): Promise<void> {
  try {
    const upid = await vms.api.post<string>(vms.qemu(ref, "/status/start"));
    vms.pending.set(ref.vmid, { upid, type: "qmstart" });
  } catch (e) {
    if (!/already running/i.test(reasonOf(e))) throw e;
  }
}

export async function powerOff(vms: Vms, ref: Ref, wait = false): Promise<void> {
  let upid: string;
  try {
    upid = await vms.api.post<string>(vms.qemu(ref, "/status/stop"));
  } catch (e) {
    if (/not running/i.test(reasonOf(e))) return;
    throw e;
  }
  vms.pending.set(ref.vmid, { upid, type: "qmstop" });
  if (wait) await vms.api.waitTask(upid);
}

/** Stops the VM if it runs, then destroys it with its disks; a VM already gone, or going, counts as done. */
export async function destroy(vms: Vms, ref: Ref, running: boolean, wait = false): Promise<void> {
  if (running) await powerOff(vms, ref, true);
  let upid: string;
  try {
    upid = await vms.api.del<string>(vms.qemu(ref), { purge: 1, "destroy-unreferenced-disks": 1 });
  } catch (e) {
    if (/does not exist|locked \(destroyed\)/i.test(reasonOf(e))) return;
    throw e;
  }
  vms.pending.set(ref.vmid, { upid, type: "qmdestroy" });
  vms.forget(ref.vmid);
  if (wait) await vms.api.waitTask(upid);
}
