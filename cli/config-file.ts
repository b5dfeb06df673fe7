import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { type Config, type ConfigFile, parseConfig } from "../core/config.ts";

const CANDIDATES = ["compute.config.ts", "compute.config.mjs", "compute.config.js"];

/** The optional typed config file (`export default defineConfig({...})`) merged with the environment. */
export async function loadConfig(cwd = process.cwd(), env = process.env): Promise<Config> {
  const explicit = env.BC_CONFIG ? resolve(cwd, env.BC_CONFIG) : undefined;
  const file = explicit ?? CANDIDATES.map((f) => resolve(cwd, f)).find(existsSync);
  let contents: ConfigFile = {};
  if (file) {
    const mod = (await import(pathToFileURL(file).href)) as { default?: ConfigFile };
    contents = mod.default ?? {};
  }
  return parseConfig(contents, env);
}
