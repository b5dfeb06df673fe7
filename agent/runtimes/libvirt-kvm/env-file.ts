import { existsSync } from "node:fs";
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { PRIVATE_FILE } from "../files.ts";

/**
 * The spec's env, kept in the instance's directory for exec (guest-exec replaces a command's environment, so
 * the runtime supplies the instance's own). It may hold the owner's secrets: the host's alone.
 */
const ENV_FILE = "env.json";

/** Written when it differs, so that a converger calling create on every pass costs no write. */
export async function keepEnv(instanceDir: string, env: Record<string, string> | undefined): Promise<void> {
  const file = join(instanceDir, ENV_FILE);
  const text = JSON.stringify(env ?? {});
  if (existsSync(file) && (await readFile(file, "utf8")) === text) return;
  await mkdir(instanceDir, { recursive: true });
  await writeFile(`${file}.tmp`, text, { mode: PRIVATE_FILE });
  await rename(`${file}.tmp`, file);
}

/** The env kept for the instance; none for a domain made before env was kept. */
export async function envOf(instanceDir: string): Promise<Record<string, string>> {
  const text = await readFile(join(instanceDir, ENV_FILE), "utf8").catch(() => "{}");
  return JSON.parse(text) as Record<string, string>;
}
