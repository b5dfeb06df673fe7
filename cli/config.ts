import { existsSync, readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

/**
 * The client commands' settings (`bc login`, `bc instances`, …): the one module of the client that reads the
 * environment, as agent/config.ts is the agent's and infra/config.ts the platform's.
 */

/** Where `bc login` keeps the URL and token the client commands use: `$XDG_CONFIG_HOME/bc/config.json` (else ~/.config). */
export function clientConfigPath(env: NodeJS.ProcessEnv = process.env): string {
  return join(env.XDG_CONFIG_HOME || join(env.HOME || homedir(), ".config"), "bc", "config.json");
}

/**
 * Where `bc`'s client commands send their requests, and with which token: flags first, then `BC_URL` and
 * `BC_TOKEN` (or `OPERATOR_TOKEN`, the server's own operator token), then what `bc login` saved, else this
 * machine's server on `PORT`.
 */
export function clientSettings(flags: { url?: string | undefined; token?: string | undefined }, env: NodeJS.ProcessEnv = process.env) {
  const path = clientConfigPath(env);
  const saved = existsSync(path) ? (JSON.parse(readFileSync(path, "utf8")) as { url?: string; token?: string }) : {};
  const url = flags.url ?? env.BC_URL ?? saved.url ?? `http://127.0.0.1:${env.PORT ?? 4000}/graphql`;
  const token = flags.token ?? env.BC_TOKEN ?? env.OPERATOR_TOKEN ?? saved.token;
  if (!token) throw new Error("no token: pass --token, set BC_TOKEN, or run bc login");
  return { url, token };
}
