import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { type Config, type ConfigFile, parseConfig } from "../infra/config.ts";

const CANDIDATES = ["compute.config.ts", "compute.config.mjs", "compute.config.js"];

/** The optional typed config file (`export default defineConfig({...})`) merged with the environment. */
export async function loadConfig(cwd = process.cwd(), env = process.env): Promise<Config> {
  const explicit = env.BC_CONFIG ? resolve(cwd, env.BC_CONFIG) : undefined;
  const file = explicit ?? CANDIDATES.map((f) => resolve(cwd, f)).find(existsSync);
  let contents: ConfigFile = {};
  if (file) {
    // The compiled build (dist/) runs without a TypeScript loader: take one on only for a .ts config file.
    if (/\.[cm]?ts$/.test(file) && !(globalThis as { [k: symbol]: unknown })[Symbol.for("bc.tsLoader")]) {
      const { register } = await import("tsx/esm/api");
      register();
    }
    const mod = (await import(pathToFileURL(file).href)) as { default?: ConfigFile };
    contents = mod.default ?? {};
  }
  return parseConfig(contents, env);
}
