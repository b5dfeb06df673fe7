import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";

/**
 * The embedded mode keeps its operator token and sealing key under the data dir, so a restart keeps working
 * credentials and can still unseal. A deployment on PostgreSQL must pass both (the processes share them).
 */
export function persistentSecret(dataDir: string, name: string, make: () => string): string {
  const dir = resolve(dataDir);
  const file = join(dir, name);
  if (existsSync(file)) return readFileSync(file, "utf8").trim();
  mkdirSync(dir, { recursive: true });
  const value = make();
  writeFileSync(file, `${value}\n`, { mode: 0o600 });
  return value;
}
