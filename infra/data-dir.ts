import { chmodSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";

/**
 * The embedded mode keeps its operator token and sealing key under the data dir, so a restart keeps working
 * credentials and can still unseal. A deployment on PostgreSQL must pass both (the processes share them).
 */
export function persistentSecret(dataDir: string, name: string, make: () => string): string {
  const dir = resolve(dataDir);
  const file = join(dir, name);
  if (existsSync(file)) return readFileSync(file, "utf8").trim();
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const value = make();
  writeFileSync(file, `${value}\n`, { mode: 0o600 });
  return value;
}

/** Take group and world access away from everything under `root` (directories 0700, files 0600). */
export function ownerOnly(root: string): void {
  for (const name of ["", ...(readdirSync(root, { recursive: true }) as string[])]) {
    const path = join(root, name);
    const st = lstatSync(path, { throwIfNoEntry: false });
    if (!st || st.isSymbolicLink() || (st.mode & 0o077) === 0) continue;
    chmodSync(path, st.isDirectory() ? 0o700 : 0o600);
  }
}
