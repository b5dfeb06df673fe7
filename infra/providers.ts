import { readFile } from "node:fs/promises";
import type { Sql } from "../core/kernel/db.ts";
import type { Sealer } from "../core/kernel/seal.ts";
import { getProviderAccount } from "../core/pools/provider/accounts.ts";
import { type ProviderDefinition, ProviderError, type ProviderSession, type ProviderSessions } from "../core/pools/provider/contract.ts";
import { envSecret, type SecretResolver } from "./config.ts";

/**
 * The secret broker and the worker's provider sessions. Credentials stay references in the database; the
 * broker resolves one only when a provider call needs it (`env:` from this process's environment, `file:` read
 * then, `sealed:` opened with the account id bound in), keeps it for `ttlMs` so a rotated value is picked up,
 * and never writes a value anywhere: its errors name the account, the credential and the reference's scheme.
 */
export function secretBroker(opts: { sealer: Sealer; custom?: SecretResolver }) {
  return async function resolve(accountId: string, name: string, ref: string): Promise<string> {
    const fail = (why: string) => new ProviderError("auth", `credential ${name} of provider account ${accountId}: ${why}`);
    const custom = opts.custom ? await opts.custom.resolve(ref) : undefined;
    if (custom !== undefined) return custom;
    if (ref.startsWith("env:")) {
      const v = envSecret(ref.slice(4));
      if (!v) throw fail(`${ref} is not set in the worker's environment`);
      return v;
    }
    if (ref.startsWith("file:")) {
      try {
        return (await readFile(ref.slice(5), "utf8")).replace(/\r?\n$/, "");
      } catch (e) {
        throw fail(`${ref} cannot be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
      }
    }
    if (ref.startsWith("sealed:")) {
      try {
        return opts.sealer.open(Buffer.from(ref.slice(7), "base64"), `${accountId}/${name}`);
      } catch {
        throw fail("the sealed value does not open with this deployment's seal key");
      }
    }
    throw fail(`no resolver takes references like ${ref.split(":")[0]}:`);
  };
}

export function providerSessions(opts: {
  read<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
  providers: readonly ProviderDefinition[];
  sealer: Sealer;
  custom?: SecretResolver;
  managedBy: string;
  credentialTtlMs: number;
  fetch?: typeof fetch;
}): ProviderSessions {
  const resolve = secretBroker(opts);
  const sessions = new Map<string, Promise<ProviderSession>>();
  async function connect(accountId: string): Promise<ProviderSession> {
    const account = await opts.read((sql) => getProviderAccount(sql, accountId));
    if (!account) throw new ProviderError("invalid", `provider account ${accountId} does not exist`);
    const def = opts.providers.find((p) => p.id === account.provider);
    if (!def) throw new ProviderError("invalid", `provider ${account.provider} of account ${account.name} is not configured in this deployment`);
    const cache = new Map<string, { value: string; at: number }>();
    return def.connect(account.config, {
      managedBy: opts.managedBy,
      ...(opts.fetch ? { fetch: opts.fetch } : {}),
      async credential(name) {
        const hit = cache.get(name);
        if (hit && Date.now() - hit.at < opts.credentialTtlMs) return hit.value;
        const ref = account.credentials[name];
        if (!ref) throw new ProviderError("auth", `provider account ${account.name} has no credential ${name}`);
        const value = await resolve(account.id, name, ref);
        cache.set(name, { value, at: Date.now() });
        return value;
      },
    });
  }
  return {
    managedBy: opts.managedBy,
    session(accountId) {
      let s = sessions.get(accountId);
      if (!s) {
        s = connect(accountId);
        // A failed connect (an account not yet visible) is not remembered.
        s.catch(() => sessions.delete(accountId));
        sessions.set(accountId, s);
      }
      return s;
    },
  };
}
