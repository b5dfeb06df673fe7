import { constants, existsSync } from "node:fs";
import { copyFile, mkdir, rename, rm } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { bytesIn } from "../files.ts";
import { RuntimeError } from "../runtime.ts";
import type { Dom } from "./binding.ts";
import type { DomainContext } from "./context.ts";
import { imageInfo, type QemuImgInfo, refuseReferences } from "./images.ts";
import { clearSaving, markSaving, readSaving, type Saving, savedPower, seal, snapshotPaths } from "./snapshots.ts";

/**
 * Snapshots of a domain's memory and disk, and reverting to them (Runtime.snapshot and restore). Save stops
 * the domain and writes its memory; while it is off, the overlay is copied; then the domain is restored from
 * that memory and carries on (`settle`). Files as ./snapshots.ts lays them out.
 */
export async function takeSnapshot(c: DomainContext, id: string, snapshotId: string): Promise<{ sizeBytes: number }> {
  const d = await c.must(id);
  const { final, partial } = snapshotPaths(c.instanceDir(id), snapshotId);
  await settle(c, id, d, true);
  if (existsSync(final)) return { sizeBytes: await bytesIn(final) };
  const power = await c.power(d);
  if (power !== "running" && power !== "paused") throw new RuntimeError(`${id} is not running: no memory to save`, false, "not-running");
  await rm(partial, { recursive: true, force: true });
  await mkdir(partial, { recursive: true });
  await markSaving(c.instanceDir(id), { snapshotId, power });
  try {
    await c.libvirt(() => c.hv.domainSave(d, join(partial, "memory.save")));
  } catch (e) {
    // Not saved, so still as it was: nothing to finish later.
    await clearSaving(c.instanceDir(id));
    throw e;
  }
  await settle(c, id, d, true);
  return { sizeBytes: await bytesIn(final) };
}

/**
 * The snapshot's disk copied aside and checked, the domain destroyed if it runs (it is being reverted), the
 * copy renamed over the overlay, then the saved memory restored: the guest runs on from the saved point, in
 * the power state it was saved in. A refused disk leaves the domain as it was.
 */
export async function revert(c: DomainContext, id: string, snapshotId: string): Promise<void> {
  const d = await c.must(id);
  const { final } = snapshotPaths(c.instanceDir(id), snapshotId);
  if (!existsSync(final)) throw new RuntimeError(`no snapshot ${snapshotId} of ${id} on this host`, false, "not-found");
  const power = await savedPower(final);
  const overlay = c.overlayPath(id);
  const tmp = `${overlay}.restore.tmp`;
  await copyFile(join(final, "disk.qcow2"), tmp, constants.COPYFILE_FICLONE);
  try {
    await refuseForeignDisk(c, id, tmp);
    if ((await c.power(d)) !== "stopped") await c.libvirt(() => c.hv.domainDestroy(d));
    await settle(c, id, d, false);
    await rename(tmp, overlay);
  } finally {
    await rm(tmp, { force: true });
  }
  c.forgetDisk(id);
  await thaw(c, d, join(final, "memory.save"), power);
}

/**
 * A domain a snapshot saved (off): its snapshot's files completed and renamed into place, then the domain
 * restored from its memory (`thaw`), or left off when the caller wants it off anyway. A snapshot's own last
 * step, and the recovery of one this process died in. The guest's memory comes back even when the files
 * cannot be completed; a save that left no memory file leaves the domain to boot afresh.
 */
export async function settle(c: DomainContext, id: string, d: Dom, thawIt: boolean): Promise<void> {
  const dir = c.instanceDir(id);
  const saving = await readSaving(dir);
  if (!saving) return;
  const { final, partial } = snapshotPaths(dir, saving.snapshotId);
  const memory = () => [join(final, "memory.save"), join(partial, "memory.save")].find((f) => existsSync(f));
  try {
    if ((await c.power(d)) !== "stopped" || !memory()) return;
    try {
      if (!existsSync(final)) await seal(c.overlayPath(id), partial, final, saving.power);
    } finally {
      const saved = memory();
      if (thawIt && saved) await thaw(c, d, saved, saving.power);
    }
  } finally {
    // Once only: a memory file that cannot be restored must not keep the domain from booting afresh.
    await clearSaving(dir);
    await rm(partial, { recursive: true, force: true });
  }
}

/** Restore saved memory and end in `power`: the save file records it, but nothing in the binding says so. */
async function thaw(c: DomainContext, d: Dom, memory: string, power: Saving["power"]): Promise<void> {
  await c.libvirt(() => c.hv.domainRestore(memory));
  const now = await c.power(d);
  if (power === "paused" && now === "running") await c.libvirt(() => c.hv.domainSuspend(d));
  if (power === "running" && now === "paused") await c.libvirt(() => c.hv.domainResume(d));
}

/** An instance's disk must stand on a verified base of this host's cache, and name nothing else. */
export async function refuseForeignDisk(c: DomainContext, id: string, disk: string): Promise<QemuImgInfo> {
  const info = await imageInfo(disk, "qcow2");
  const backing = info["full-backing-filename"] ?? info["backing-filename"];
  if (!backing || dirname(resolve(dirname(disk), backing)) !== join(c.stateDir, "images")) {
    throw new RuntimeError(`the disk of ${id} stands on ${backing ?? "nothing"}, not on a verified base of this host; refused`, false);
  }
  refuseReferences({ ...info, "backing-filename": undefined, "full-backing-filename": undefined }, `the disk of ${id}`);
  return info;
}
