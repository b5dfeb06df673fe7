import { chmod, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { InstanceSpec } from "../../../contracts/host.ts";
import { PRIVATE_FILE } from "../files.ts";
import { renderSeed } from "../seed.ts";
import { run } from "./exec.ts";

/** An instance's disk: a qcow2 overlay on its base, made aside and renamed, so a killed agent never reuses half of one. */
export async function makeOverlay(base: string, baseFormat: string, path: string, diskGib: number): Promise<void> {
  const tmp = `${path}.tmp`;
  await run("qemu-img", ["create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", base, tmp, `${diskGib}G`]);
  await rename(tmp, path);
}

/** The instance's NoCloud seed (../seed.ts), burnt to an ISO labelled `cidata`. */
export async function writeSeedIso(spec: InstanceSpec, iso: string): Promise<void> {
  const tmp = await mkdtemp(join(dirname(iso), "seed-"));
  try {
    const files = renderSeed(spec);
    for (const [name, body] of Object.entries(files)) await writeFile(join(tmp, name), body, { mode: PRIVATE_FILE });
    await run("genisoimage", ["-quiet", "-output", iso, "-volid", "cidata", "-joliet", "-rock", ...Object.keys(files).map((f) => join(tmp, f))]);
    // The seed holds the owner's user data: the host's alone (libvirt hands it to QEMU's user at start).
    await chmod(iso, PRIVATE_FILE);
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
}
