import { randomUUID } from "node:crypto";
import { constants, existsSync } from "node:fs";
import { chmod, copyFile, mkdir, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type InstanceSpec, tapFor } from "../../../contracts/host.ts";
import { PASS_THROUGH_DIR } from "../files.ts";
import { RuntimeError } from "../runtime.ts";
import type { Dom } from "./binding.ts";
import { cloneXml, savedXml, writeCloneImage } from "./clone.ts";
import type { DomainContext } from "./context.ts";
import { writeSeedIso } from "./disks.ts";
import { run } from "./exec.ts";
import { refuseForeignDisk } from "./snapshot-ops.ts";
import { snapshotPaths } from "./snapshots.ts";

/**
 * Domain `spec.id` made from snapshot `from` of another instance on this host (./clone.ts): the snapshot's
 * disk copied to the new instance's own overlay (a copy, not an overlay on it: the source and its snapshots
 * may be removed while the new instance lives), its own seed, then the domain defined with the source's saved
 * hardware and the new identity, and the saved memory restored into it from a copy of the save image whose
 * header carries that identity. The domain is left paused at the saved point; the converger runs it.
 *
 * Idempotent: `cloning` in the new instance's directory marks a domain defined but not restored yet (an agent
 * that died in between), and the work is finished rather than the domain booted afresh from a disk that goes
 * with saved memory.
 */
export async function createFromSnapshot(c: DomainContext, spec: InstanceSpec, from: { instanceId: string; snapshotId: string }): Promise<void> {
  const dir = c.instanceDir(spec.id);
  const marker = join(dir, "cloning");
  let d = await c.lookup(spec.id);
  if (d && !existsSync(marker)) return;
  const { final } = snapshotPaths(c.instanceDir(from.instanceId), from.snapshotId);
  const memory = join(final, "memory.save");
  if (!existsSync(memory) || !existsSync(join(final, "disk.qcow2"))) {
    throw new RuntimeError(`no snapshot ${from.snapshotId} of ${from.instanceId} on this host`, false, "not-found");
  }
  const image = join(dir, "clone.save.tmp");
  let xml: string;
  let imageWritten = false;
  try {
    if (!d) {
      const saved = await savedXml(memory);
      refuseOtherShape(saved, spec);
      await mkdir(dir, { recursive: true });
      await chmod(dir, PASS_THROUGH_DIR);
      xml = cloneXml(saved, { fromId: from.instanceId, id: spec.id, uuid: randomUUID(), mac: spec.nic.mac, tap: tapFor(spec.id), owner: c.owner });
      // Independent files, side by side: the disk (a copy and a qemu-img run), the seed (the ISO writer) and
      // the save image with the clone's identity (a copy of the guest's memory, the largest of the three).
      // All settled before a failure is thrown, so no copy is still writing when the temporary image is removed.
      const made = await Promise.allSettled([
        copyDisk(c, spec, join(final, "disk.qcow2")),
        writeSeedIso(spec, join(dir, "seed.iso")),
        writeCloneImage(memory, image, xml),
      ]);
      for (const r of made) if (r.status === "rejected") throw r.reason;
      imageWritten = true;
      await writeFile(marker, `${from.instanceId}/${from.snapshotId}\n`);
      d = await c.libvirt(() => c.hv.domainDefineXML(xml));
    } else {
      // The definition made before the agent died: the restored memory must come back under the same name and uuid.
      xml = await c.libvirt(() => c.hv.domainGetXMLDesc(d as Dom, 2));
    }
    const dom = d;
    if ((await c.power(dom)) === "stopped") {
      if (!imageWritten) await writeCloneImage(memory, image, xml);
      await c.libvirt(() => c.hv.domainRestore(image));
    }
  } finally {
    await rm(image, { force: true });
  }
  await rm(marker, { force: true });
}

/** The saved guest's vCPUs and memory are fixed by its saved state: a spec asking for others is refused. */
function refuseOtherShape(saved: string, spec: InstanceSpec): void {
  const vcpus = Number(/<vcpu[^>]*>(\d+)<\/vcpu>/.exec(saved)?.[1]);
  const m = /<memory(?: unit=['"](\w+)['"])?>(\d+)<\/memory>/.exec(saved);
  const unit = { KiB: 1 / 1024, MiB: 1, GiB: 1024, b: 1 / 2 ** 20, bytes: 1 / 2 ** 20 }[m?.[1] ?? "KiB"] ?? Number.NaN;
  const memoryMib = Number(m?.[2]) * unit;
  if (vcpus !== spec.vcpus || memoryMib !== spec.memoryMib) {
    throw new RuntimeError(
      `the snapshot was taken with ${vcpus} vCPUs and ${memoryMib} MiB; ${spec.id} asks for ${spec.vcpus} vCPUs and ${spec.memoryMib} MiB`,
      false,
    );
  }
}

/** The snapshot's disk, checked, as the new instance's overlay; grown where the spec asks for more. */
async function copyDisk(c: DomainContext, spec: InstanceSpec, disk: string): Promise<void> {
  const overlay = c.overlayPath(spec.id);
  if (existsSync(overlay)) return;
  const tmp = `${overlay}.tmp`;
  await copyFile(disk, tmp, constants.COPYFILE_FICLONE);
  try {
    const size = (await refuseForeignDisk(c, spec.id, tmp))["virtual-size"];
    if (spec.diskGib * 2 ** 30 < size)
      throw new RuntimeError(`the snapshot's disk is ${size / 2 ** 30} GiB; ${spec.id} asks for ${spec.diskGib} GiB`, false, "invalid");
    // The guest sees the larger disk once it rescans it (its saved state knew the old size).
    if (spec.diskGib * 2 ** 30 > size) await run("qemu-img", ["resize", "-q", tmp, `${spec.diskGib}G`]);
    await rename(tmp, overlay);
  } finally {
    await rm(tmp, { force: true });
  }
}
