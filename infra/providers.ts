import { Destinations } from "../contracts/addresses.ts";
import type { Sql } from "../core/kernel/db.ts";
import type { Sealer } from "../core/kernel/seal.ts";
import { type AccountFences, getProviderAccount } from "../core/pools/provider/accounts.ts";
import { type ProviderDefinition, ProviderError, type ProviderSession, type ProviderSessions } from "../core/pools/provider/contract.ts";
import { type Config, envSecret, type SecretResolver } from "./config.ts";
import { endpointRefusal, providerFetch, type Resolve } from "./provider-fetch.ts";
import { redactor, scrubError } from "./redact.ts";
import { RefusedReference, readFenced, refusal, type SecretRefPolicy } from "./secret-refs.ts";

/**
 * The secret broker and the worker's provider sessions. Credentials stay references in the database; the
 * broker resolves one only when a provider call needs it (`env:` from this process's environment, `file:` read
 * then, both inside the deployment's fence, ./secret-refs.ts; `sealed:` opened with the account id bound in),
 * keeps it for `ttlMs` so a rotated value is picked up, and never writes a value anywhere: its errors name the
 * account, the credential and the reference's scheme.
 */
export function secretBroker(opts: { sealer: Sealer; custom?: SecretResolver; refs: SecretRefPolicy }) {
  return async function resolve(accountId: string, name: string, ref: string): Promise<string> {
    const fail = (why: string) => new ProviderError("auth", `credential ${name} of provider account ${accountId}: ${why}`);
    const scheme = ref.split(":")[0];
    // The fence comes first (env: names are judged whole here): a deployment's own resolver must not widen it.
    const refused = await refusal(ref, opts.refs);
    if (refused) throw fail(`reference refused: ${refused}`);
    const custom = opts.custom ? await opts.custom.resolve(ref) : undefined;
    if (custom !== undefined) return custom;
    try {
      if (ref.startsWith("env:")) {
        const v = envSecret(ref.slice(4));
        if (!v) throw fail(`${ref} is not set in the worker's environment`);
        return v;
      }
      if (ref.startsWith("file:")) return await readFenced(ref.slice(5), opts.refs);
    } catch (e) {
      if (!(e instanceof RefusedReference)) throw e;
      throw fail(e.fenced ? `reference refused: ${e.message}` : `${ref} ${e.message}`);
    }
    if (ref.startsWith("sealed:")) {
      try {
        return opts.sealer.open(Buffer.from(ref.slice(7), "base64"), `${accountId}/${name}`);
      } catch {
        throw fail("the sealed value does not open with this deployment's seal key");
      }
    }
    throw fail(`no resolver takes references like ${scheme}:`);
  };
}

/** The fence of a deployment's config, for the broker and for account checks. */
export const secretRefPolicy = (config: Config): SecretRefPolicy => ({ ...config.vps.secretRefs, dataDir: config.dataDir });

/** What createProviderAccount checks an account against: the references' fence and the endpoints' rules. */
export function accountFences(config: Config): AccountFences {
  const guard = new Destinations(config.providers.endpoints);
  const refs = secretRefPolicy(config);
  return { reference: (ref) => refusal(ref, refs), endpoint: (url) => endpointRefusal(url, guard) };
}

/**
 * The session, with every failure's texts redacted of every credential value it resolved (./redact.ts): the
 * one place that knows them, between the plugin and whatever shows its errors.
 */
function redacting(session: ProviderSession, values: Set<string>): ProviderSession {
  const scrub = (e: unknown) => scrubError(e, redactor(values));
  return new Proxy(session, {
    get(target, key) {
      const member = Reflect.get(target, key, target) as unknown;
      if (typeof member !== "function") return member;
      return (...args: unknown[]) => {
        try {
          const out = member.apply(target, args);
          return out instanceof Promise ? out.catch((e) => Promise.reject(scrub(e))) : out;
        } catch (e) {
          throw scrub(e);
        }
      };
    },
  });
}

export function providerSessions(opts: {
  read<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
  providers: readonly ProviderDefinition[];
  sealer: Sealer;
  custom?: SecretResolver;
  refs: SecretRefPolicy;
  /** Where calls may go (providers.endpoints); every session's fetch is guarded by it. */
  endpoints: { allow: string[]; allowHttp: boolean };
  /** Names to addresses for the guard; the system resolver unless given (tests). */
  resolve?: Resolve;
  managedBy: string;
  credentialTtlMs: number;
}): ProviderSessions {
  const resolve = secretBroker(opts);
  const fetch = providerFetch(new Destinations(opts.endpoints), opts.resolve ? { resolve: opts.resolve } : {});
  const sessions = new Map<string, Promise<ProviderSession>>();
  async function connect(accountId: string): Promise<ProviderSession> {
    const account = await opts.read((sql) => getProviderAccount(sql, accountId));
    if (!account) throw new ProviderError("invalid", `provider account ${accountId} does not exist`);
    const def = opts.providers.find((p) => p.id === account.provider);
    if (!def) throw new ProviderError("invalid", `provider ${account.provider} of account ${account.name} is not configured in this deployment`);
    const cache = new Map<string, { value: string; at: number }>();
    // Every value resolved, rotated ones too: an answer may still echo the one before.
    const values = new Set<string>();
    const session = def.connect(account.config, {
      managedBy: opts.managedBy,
      fetch,
      async credential(name) {
        const hit = cache.get(name);
        if (hit && Date.now() - hit.at < opts.credentialTtlMs) return hit.value;
        const ref = account.credentials[name];
        if (!ref) throw new ProviderError("auth", `provider account ${account.name} has no credential ${name}`);
        const value = await resolve(account.id, name, ref);
        cache.set(name, { value, at: Date.now() });
        // The plugin may send it trimmed.
        values.add(value).add(value.trim());
        return value;
      },
    });
    return redacting(session, values);
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
