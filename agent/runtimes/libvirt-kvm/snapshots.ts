import { constants } from "node:fs";
import { copyFile, open, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { RuntimeError } from "../runtime.ts";

/**
 * A snapshot on disk, under its instance's directory (so removing the instance removes its snapshots):
 * `snapshots/<id>/` holds memory.save (libvirt's save image), disk.qcow2 (the overlay as it was) and power
 * (running or paused, as saved). It is written in `<id>.partial` and renamed into place: a snapshot directory
 * that exists is whole. While a save has the domain off, `saving.json` in the instance's directory says so,
 * for whoever finds the domain off after this process died.
 */

export interface Saving {
  snapshotId: string;
  power: "running" | "paused";
}

export function snapshotPaths(instanceDir: string, snapshotId: string) {
  if (!/^[A-Za-z0-9][A-Za-z0-9_-]*$/.test(snapshotId)) throw new RuntimeError(`not a snapshot id: ${snapshotId}`, false, "invalid");
  const final = join(instanceDir, "snapshots", snapshotId);
  return { final, partial: `${final}.partial` };
}

const savingPath = (instanceDir: string) => join(instanceDir, "saving.json");

export async function readSaving(instanceDir: string): Promise<Saving | null> {
  try {
    return JSON.parse(await readFile(savingPath(instanceDir), "utf8")) as Saving;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw e;
  }
}

/** On disk before the save begins: a crash during the save must find it. */
export async function markSaving(instanceDir: string, saving: Saving): Promise<void> {
  const file = savingPath(instanceDir);
  await writeFile(`${file}.tmp`, JSON.stringify(saving));
  await fsync(`${file}.tmp`);
  await rename(`${file}.tmp`, file);
}

export const clearSaving = (instanceDir: string) => rm(savingPath(instanceDir), { force: true });

/**
 * The overlay, copied while the domain is off (a plain copy keeps its one reference, to the verified base in
 * this host's cache), joins the saved memory in `partial`; then the directory is named complete.
 */
export async function seal(overlay: string, partial: string, final: string, power: Saving["power"]): Promise<void> {
  await copyFile(overlay, join(partial, "disk.qcow2"), constants.COPYFILE_FICLONE);
  await writeFile(join(partial, "power"), `${power}\n`);
  // On disk before the name says complete: a crash must not leave a whole-looking snapshot that is not.
  for (const f of await readdir(partial)) await fsync(join(partial, f));
  await rename(partial, final);
  await fsync(dirname(final));
}

export async function savedPower(final: string): Promise<Saving["power"]> {
  const power = (await readFile(join(final, "power"), "utf8")).trim();
  if (power !== "running" && power !== "paused") throw new RuntimeError(`${final}: power '${power}' is neither running nor paused`, false);
  return power;
}

async function fsync(path: string): Promise<void> {
  const f = await open(path, "r");
  try {
    await f.sync();
  } finally {
    await f.close();
  }
}
