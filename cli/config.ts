import { randomBytes } from "node:crypto";
import { closeSync, existsSync, fchmodSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";

/**
 * The client commands' settings (`bc login`, `bc instances`, …): the one module of the client that reads the
 * environment, as agent/config.ts is the agent's and infra/config.ts the platform's.
 */

/** Where `bc login` keeps the URL and token the client commands use: `$XDG_CONFIG_HOME/bc/config.json` (else ~/.config). */
export function clientConfigPath(env: NodeJS.ProcessEnv = process.env): string {
  return join(env.XDG_CONFIG_HOME || join(env.HOME || homedir(), ".config"), "bc", "config.json");
}

/**
 * Save what `bc login` checked, the token's owner's alone whatever file was there: a new file made 0600 (the
 * mode given at open is only used for a file that does not exist yet, so an old 0644 file would have stayed
 * 0644), written whole, then renamed over the old one, so a reader sees the old settings or the new, never half.
 */
export function saveClientSettings(path: string, settings: { url: string; token: string }): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = `${path}.${randomBytes(6).toString("hex")}.tmp`;
  try {
    const fd = openSync(tmp, "wx", 0o600);
    try {
      fchmodSync(fd, 0o600); // whatever the umask took away
      writeSync(fd, `${JSON.stringify({ url: settings.url, token: settings.token }, null, 2)}\n`);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
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
