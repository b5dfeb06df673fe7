import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";

/** Bytes of the files directly in `dir` (a snapshot's files, as runtimes report its size). */
export async function bytesIn(dir: string): Promise<number> {
  let total = 0;
  for (const f of await readdir(dir)) total += (await stat(join(dir, f))).size;
  return total;
}
