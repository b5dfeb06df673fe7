import { readdirSync, rmSync } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";

/** Bytes of the files directly in `dir` (a snapshot's files, as runtimes report its size). */
export async function bytesIn(dir: string): Promise<number> {
  let total = 0;
  for (const f of await readdir(dir)) total += (await stat(join(dir, f))).size;
  return total;
}

/**
 * Files a runtime writes aside before renaming them into place: `*.tmp`, `*.part` (downloads), `*.partial`
 * (snapshot directories) and `seed-XXXXXX` (a seed being burnt). A killed agent leaves them behind.
 */
const TEMPORARY = /(\.tmp|\.part|\.partial)$|^seed-[A-Za-z0-9]{6}$/;

/**
 * Remove what an earlier run left half-written under `root`. Runs at start, before anything of this run is
 * written aside: the state directory belongs to one agent, so nothing there is still being written.
 */
export function sweepTemporaries(root: string): string[] {
  const removed: string[] = [];
  const walk = (dir: string) => {
    let entries: import("node:fs").Dirent[];
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const path = join(dir, e.name);
      if (TEMPORARY.test(e.name)) {
        rmSync(path, { recursive: true, force: true });
        removed.push(path);
      } else if (e.isDirectory()) walk(path);
    }
  };
  walk(root);
  return removed;
}

/** Seeds carry the owner's user data; runtime state is the host's alone. */
export const PRIVATE_FILE = 0o600;
export const PRIVATE_DIR = 0o700;
/** A directory a hypervisor's own user must get through to files it is handed: enter, but not list. */
export const PASS_THROUGH_DIR = 0o711;
/** A verified base image that every overlay on it reads. */
export const SHARED_READ_ONLY = 0o644;
