import { existsSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { z } from "zod";
import { type AddressPolicy, parseCidr } from "../contracts/addresses.ts";
import { AppError } from "../contracts/errors.ts";
import { DEFAULT_RUNTIME } from "../contracts/runtimes.ts";
import type { ImageResolver } from "../core/catalog/images.ts";
import type { ProviderDefinition } from "../core/pools/provider/contract.ts";
import { EXEC_OUTPUT_CAPS } from "../core/sandboxes/exec-output.ts";
import { builtinProviders } from "../providers/index.ts";

/**
 * Resolves a provider account's credential reference to its value, or undefined when it cannot. The default
 * (infra/secrets.ts) takes `env:` (this process's environment, read here: the one module that reads it),
 * `file:` and `sealed:`; a deployment may hand in its own for other schemes (a vault).
 */
export interface SecretResolver {
  resolve(ref: string): Promise<string | undefined>;
}

/** `env:NAME` from this process's environment. */
export const envSecret = (name: string): string | undefined => process.env[name];

/** What `compute.config.ts` may export through `defineConfig`; everything is optional. */
export interface ConfigFile {
  port?: number;
  host?: string;
  metricsPort?: number;
  dashboardDir?: string;
  databaseUrl?: string;
  redisUrl?: string;
  dataDir?: string;
  hosts?: {
    lostGraceMs?: number;
    orphanGraceMs?: number;
    sweepMs?: number;
    maxRecreateAttempts?: number;
    joinTokenTtlSeconds?: number;
    commandTimeoutMs?: number;
  };
  providers?: Partial<Omit<Config["providers"], "endpoints">> & {
    /** Provider endpoints: https to public addresses only, unless allowed here (infra/provider-fetch.ts). */
    endpoints?: Partial<AddressPolicy>;
  };
  sandboxes?: Partial<Config["sandboxes"]>;
  live?: { bufferEvents?: number; keepAliveMs?: number; reauthMs?: number; pollMs?: number };
  retention?: Partial<Config["retention"]>;
  limits?: Partial<Config["limits"]>;
  vps?: {
    runtimes?: string[];
    providers?: ProviderDefinition[];
    images?: ImageResolver;
    secrets?: SecretResolver;
    hostNetwork?: string;
    /** Registering images: https only unless `allowHttp` (a mirror on the operator's network). */
    imageSources?: { allowHttp?: boolean };
    /** Where `env:` and `file:` credential references may point (infra/secret-refs.ts). */
    secretRefs?: { envPrefix?: string; dir?: string };
  };
}
export const defineConfig = (c: ConfigFile): ConfigFile => c;

const runtimeId = z.string().regex(/^[a-z0-9-]+$/, "runtime ids are lower-case letters, digits and hyphens");
const providerDef = z.custom<ProviderDefinition>(
  (v) => typeof v === "object" && v !== null && typeof (v as ProviderDefinition).id === "string" && "accountConfig" in v,
  "not a provider definition (use defineProvider)",
);
const bool = z.union([z.boolean(), z.stringbool()], { error: "must be true or false" });
const cidr = z.string().refine((s) => parseCidr(s) !== null, "must be a CIDR such as 10.0.0.0/8 or fd00::/8, or an address");
const resolverOf = <T>(what: string) =>
  z.custom<T>((v) => typeof v === "object" && v !== null && typeof (v as { resolve?: unknown }).resolve === "function", `${what} needs a resolve() function`);

const schema = z.object({
  port: z.coerce.number().int().min(0).max(65535).default(4000),
  host: z.string().min(1).default("127.0.0.1"),
  /**
   * `bc worker`'s own /metrics, on `host`: unset, none (a worker opens no port it was not asked for, and several
   * may share a machine); 0 takes a free port and prints it. The server's /metrics is on its API port.
   */
  metricsPort: z.coerce.number().int().min(0).max(65535).optional(),
  /** The dashboard's built bundle; the server's default is web/dist of its own checkout or build. */
  dashboardDir: z.string().min(1).optional(),
  databaseUrl: z
    .string()
    .regex(/^postgres(ql)?:\/\//, "must be a postgres:// URL")
    .optional(),
  redisUrl: z
    .string()
    .regex(/^rediss?:\/\//, "must be a redis:// URL")
    .optional(),
  /** Prefix of every Redis key and channel, so deployments (and tests) can share one Redis. */
  redisPrefix: z
    .string()
    .regex(/^[A-Za-z0-9_.-]{1,64}$/)
    .default("bc"),
  dataDir: z.string().min(1).default(".data"),
  operatorToken: z.string().min(16, "at least 16 characters").optional(),
  /** 32 bytes, base64: the key that seals user data at rest. */
  sealKey: z
    .string()
    .refine((s) => Buffer.from(s, "base64").length === 32, "must be 32 bytes, base64-encoded")
    .optional(),
  logLevel: z.enum(["debug", "info", "warn", "error", "silent"]).default("info"),
  /** Hosts and reconciliation timing. */
  hosts: z
    .object({
      /** A node silent this long is lost, with the instances it runs. */
      lostGraceMs: z.coerce.number().int().min(100).default(30_000),
      /** A domain no instance owns is removed this long after its host first reports it. */
      orphanGraceMs: z.coerce.number().int().min(0).default(60_000),
      /** How often the sweep looks for instances that drifted, silent nodes and orphans. */
      sweepMs: z.coerce.number().int().min(50).default(5_000),
      /** Hosts tried before an instance that no host can create is left in error. */
      maxRecreateAttempts: z.coerce.number().int().min(1).max(20).default(3),
      joinTokenTtlSeconds: z.coerce.number().int().min(10).default(3600),
      /** How long a host has to finish a command (a snapshot, a restore) before it is given up. */
      commandTimeoutMs: z.coerce.number().int().min(1000).default(3_600_000),
    })
    .prefault({}),
  /** Sandboxes: how often deadlines and warm pools are checked, and the warm-pool quota tenants get by default. */
  sandboxes: z
    .object({
      sweepMs: z.coerce.number().int().min(50).default(15_000),
      /** `sandbox_warm` limit (warm instances over all of a tenant's templates) where the operator set none. */
      defaultWarmQuota: z.coerce.number().int().min(0).default(4),
      /** Bytes of one exec's output stored (each chunk counts 64 more, for its row); past it output is dropped. */
      execOutputBytes: z.coerce.number().int().min(4096).default(EXEC_OUTPUT_CAPS.execOutputBytes),
      /** Bytes of exec output one tenant may have kept at once, each running exec counted at `execOutputBytes`. */
      tenantExecOutputBytes: z.coerce.number().int().min(4096).default(EXEC_OUTPUT_CAPS.tenantExecOutputBytes),
      /** Execs one sandbox runs at once; more are refused (RATE_LIMITED) until one ends. */
      execsPerSandbox: z.coerce.number().int().min(1).max(1000).default(EXEC_OUTPUT_CAPS.execsPerSandbox),
    })
    // Else no exec could ever start: a running one is counted at the per-exec cap.
    .refine((s) => s.tenantExecOutputBytes >= s.execOutputBytes, { message: "must be at least execOutputBytes", path: ["tenantExecOutputBytes"] })
    .prefault({}),
  /** Provider pools: how the worker paces its calls to providers' APIs. */
  providers: z
    .object({
      /** How often each account's offers are read and its machines checked for orphans. */
      sweepMs: z.coerce.number().int().min(100).default(60_000),
      /** A machine labelled as ours that no live instance owns is deleted this long after it is first seen. */
      orphanGraceMs: z.coerce.number().int().min(0).default(300_000),
      /** First and longest wait between two looks at a machine the provider is still working on. */
      pollMinMs: z.coerce.number().int().min(10).default(1_000),
      pollMaxMs: z.coerce.number().int().min(10).default(30_000),
      /**
       * A run creating a machine holds the instance this long (renewed while it works), so no second run makes a
       * twin on providers without unique names; a run that died holds it no longer than this.
       */
      createLeaseMs: z.coerce.number().int().min(100).default(60_000),
      /** A resolved credential is used this long before it is resolved again (rotation takes effect). */
      credentialTtlMs: z.coerce.number().int().min(0).default(60_000),
      /**
       * Where the worker may send an account's credential: https to public addresses, checked after DNS. An
       * operator's own network (a Proxmox VE on a LAN, an emulator on loopback) is allowed here, by range.
       */
      endpoints: z.object({ allowHttp: bool.default(false), allow: z.array(cidr).default([]) }).prefault({}),
    })
    .prefault({}),
  /** Subscriptions: what a live connection may cost the server. */
  live: z
    .object({
      /** Events queued for one connection (all its subscriptions) before it is closed as a slow consumer. */
      bufferEvents: z.coerce.number().int().min(1).default(1000),
      /** Websocket ping interval; a peer that misses a pong for as long is dropped. 0 turns pings off. */
      keepAliveMs: z.coerce.number().int().min(0).default(12_000),
      /** How often live connections re-check their credential (revocations also arrive at once over pub/sub). */
      reauthMs: z.coerce.number().int().min(100).default(60_000),
      /** How often each server reads the event table even without a pub/sub hint (a lost message only delays). */
      pollMs: z.coerce.number().int().min(10).default(1000),
    })
    .prefault({}),
  /**
   * How long history is kept (core/books/retention.ts): instance events, audit rows, and host commands once
   * settled. Older rows are deleted in batches by `vps.retention`; usage records are the bill and are kept.
   */
  retention: z
    .object({
      eventsDays: z.coerce.number().min(0.0001).default(30),
      auditDays: z.coerce.number().min(0.0001).default(400),
      commandsDays: z.coerce.number().min(0.0001).default(30),
      /** How often the pruning runs. */
      sweepMs: z.coerce.number().int().min(100).default(600_000),
      /** Rows per delete: each batch is its own short transaction, so writers never wait long behind one. */
      batch: z.coerce.number().int().min(1).max(100_000).default(5000),
    })
    .prefault({}),
  /** What one request, and one credential, may cost (docs/architecture.md, Limits). */
  limits: z
    .object({
      /** Nesting of selections in one operation. */
      depth: z.coerce.number().int().min(1).default(10),
      /** Aliased fields in one operation. */
      aliases: z.coerce.number().int().min(0).default(15),
      /** Lexical tokens in one document: a larger document is refused while it is parsed. */
      tokens: z.coerce.number().int().min(100).default(1000),
      directives: z.coerce.number().int().min(0).default(20),
      /** Cost budget of one operation: every field 1, what a list holds counted as many times as its size (`first`, else 10). */
      cost: z.coerce.number().int().min(1).default(50_000),
      /** Bytes of one HTTP request's body (a host's report, an exec's stdin); a larger one is refused unread (413). */
      bodyBytes: z.coerce
        .number()
        .int()
        .min(1024)
        .default(8 * 1024 * 1024),
      /** Mutations in one request (the SDK sends one). */
      mutations: z.coerce.number().int().min(1).default(5),
      /** Points each credential (anonymous callers: each address) may spend per window; a request costs 1 + cost/1000. 0: no rate limit. */
      ratePoints: z.coerce.number().int().min(0).default(600),
      rateWindowSeconds: z.coerce.number().int().min(1).default(10),
      /** PostgreSQL connections API work may hold at once (it has a pool of its own; host work keeps the main pool). */
      apiConnections: z.coerce.number().int().min(1).default(8),
      /** A statement of API work running longer is cancelled (PostgreSQL). 0: no limit. */
      apiStatementTimeoutMs: z.coerce.number().int().min(0).default(10_000),
      /**
       * A token's principal is remembered this long by the server that looked it up (revocations, which reach every
       * server over pub/sub, drop it at once; this bounds a missed message). 0: every request reads it.
       */
      authCacheMs: z.coerce.number().int().min(0).default(10_000),
      /** Operations (subscriptions, and queries in flight) one websocket may hold open at once. 0: no cap. */
      subscriptionsPerConnection: z.coerce.number().int().min(0).default(100),
      /** Operations one credential (anonymous callers: one address) may hold open on one server, over all its sockets. 0: no cap. */
      subscriptionsPerCaller: z.coerce.number().int().min(0).default(200),
      /** Websocket connections one credential (or address) may hold open on one server. 0: no cap. */
      connectionsPerCaller: z.coerce.number().int().min(0).default(100),
      /** Unknown, expired or revoked tokens one source address may present per window before its unknown tokens are refused unread. 0: no limit. */
      authFailures: z.coerce.number().int().min(0).default(20),
      /** Bytes a websocket may send before its credential is accepted (connection_init and what comes with it). */
      wsPreAuthBytes: z.coerce
        .number()
        .int()
        .min(256)
        .default(16 * 1024),
    })
    .prefault({}),
  vps: z
    .object({
      runtimes: z.array(runtimeId).min(1, "at least one runtime").default([DEFAULT_RUNTIME]),
      providers: z
        .array(providerDef)
        .default([])
        .superRefine((defs, ctx) => {
          const seen = new Set<string>();
          defs.forEach((d, i) => {
            if (seen.has(d.id)) ctx.addIssue({ code: "custom", message: `provider ${d.id} is listed twice`, path: [i] });
            seen.add(d.id);
          });
        }),
      images: resolverOf<ImageResolver>("images").optional(),
      /** A resolver for credential references beyond env:, file: and sealed: (tried first). */
      secrets: resolverOf<SecretResolver>("secrets").optional(),
      hostNetwork: z
        .string()
        .regex(/^[A-Za-z0-9_.-]{1,15}$/, "an interface name of 1 to 15 letters, digits, _ . -")
        .default("br0"),
      imageSources: z.object({ allowHttp: bool.default(false) }).prefault({}),
      /**
       * What an operator's credential reference may name: `env:` variables starting with `envPrefix` (empty:
       * any, not recommended), `file:` paths inside `dir` (unset: none). Never the deployment's own settings
       * (settingNames) or its data dir, whatever these say.
       */
      secretRefs: z
        .object({
          envPrefix: z
            .string()
            .regex(/^[A-Za-z0-9_]{0,64}$/, "letters, digits and _")
            .default("BC_SECRET_"),
          dir: z.string().refine(isAbsolute, "must be an absolute path").optional(),
        })
        .prefault({}),
    })
    .prefault({}),
});

export type Config = z.infer<typeof schema>;

/** Env wins over the file: operators override a shipped config without editing it. */
export function readEnv(env: NodeJS.ProcessEnv): Record<string, unknown> {
  const list = (v: string | undefined) =>
    v === undefined
      ? undefined
      : v
          .split(",")
          .map((s) => s.trim())
          .filter(Boolean);
  const providerIds = list(env.PROVIDERS);
  const providers = providerIds?.map((id, i) => {
    const def = builtinProviders.find((p) => p.id === id);
    if (!def) throw new AppError("INVALID_CONFIG", `invalid config at vps.providers.${i}: unknown provider ${id}`, { path: `vps.providers.${i}` });
    return def;
  });
  return prune({
    port: env.PORT,
    host: env.HOST,
    metricsPort: env.METRICS_PORT,
    dashboardDir: env.DASHBOARD_DIR,
    databaseUrl: env.DATABASE_URL,
    redisUrl: env.REDIS_URL,
    redisPrefix: env.REDIS_PREFIX,
    dataDir: env.BC_DATA_DIR,
    operatorToken: env.OPERATOR_TOKEN,
    sealKey: env.SEAL_KEY,
    logLevel: env.LOG_LEVEL,
    hosts: prune({
      lostGraceMs: env.NODE_LOST_GRACE_MS,
      orphanGraceMs: env.ORPHAN_GRACE_MS,
      sweepMs: env.RECONCILE_SWEEP_MS,
      maxRecreateAttempts: env.MAX_RECREATE_ATTEMPTS,
      joinTokenTtlSeconds: env.JOIN_TOKEN_TTL_S,
      commandTimeoutMs: env.HOST_COMMAND_TIMEOUT_MS,
    }),
    sandboxes: prune({
      sweepMs: env.SANDBOX_SWEEP_MS,
      defaultWarmQuota: env.SANDBOX_WARM_QUOTA,
      execOutputBytes: env.SANDBOX_EXEC_OUTPUT_BYTES,
      tenantExecOutputBytes: env.SANDBOX_TENANT_EXEC_OUTPUT_BYTES,
      execsPerSandbox: env.SANDBOX_EXECS_PER_SANDBOX,
    }),
    providers: prune({
      sweepMs: env.PROVIDER_SWEEP_MS,
      orphanGraceMs: env.PROVIDER_ORPHAN_GRACE_MS,
      pollMinMs: env.PROVIDER_POLL_MIN_MS,
      pollMaxMs: env.PROVIDER_POLL_MAX_MS,
      credentialTtlMs: env.PROVIDER_CREDENTIAL_TTL_MS,
      createLeaseMs: env.PROVIDER_CREATE_LEASE_MS,
      endpoints: prune({ allowHttp: env.PROVIDER_ENDPOINT_HTTP, allow: list(env.PROVIDER_ENDPOINT_ALLOW) }),
    }),
    live: prune({ bufferEvents: env.LIVE_BUFFER_EVENTS, keepAliveMs: env.WS_KEEPALIVE_MS, reauthMs: env.LIVE_REAUTH_MS, pollMs: env.LIVE_POLL_MS }),
    retention: prune({
      eventsDays: env.RETENTION_EVENTS_DAYS,
      auditDays: env.RETENTION_AUDIT_DAYS,
      commandsDays: env.RETENTION_COMMANDS_DAYS,
      sweepMs: env.RETENTION_SWEEP_MS,
      batch: env.RETENTION_BATCH,
    }),
    limits: prune({
      depth: env.LIMIT_DEPTH,
      aliases: env.LIMIT_ALIASES,
      tokens: env.LIMIT_TOKENS,
      directives: env.LIMIT_DIRECTIVES,
      cost: env.LIMIT_COST,
      mutations: env.LIMIT_MUTATIONS,
      bodyBytes: env.LIMIT_BODY_BYTES,
      ratePoints: env.LIMIT_RATE_POINTS,
      rateWindowSeconds: env.LIMIT_RATE_WINDOW_S,
      apiConnections: env.LIMIT_API_CONNECTIONS,
      apiStatementTimeoutMs: env.LIMIT_API_STATEMENT_TIMEOUT_MS,
      authCacheMs: env.LIMIT_AUTH_CACHE_MS,
      subscriptionsPerConnection: env.LIMIT_SUBSCRIPTIONS_PER_CONNECTION,
      subscriptionsPerCaller: env.LIMIT_SUBSCRIPTIONS_PER_CALLER,
      connectionsPerCaller: env.LIMIT_CONNECTIONS_PER_CALLER,
      authFailures: env.LIMIT_AUTH_FAILURES,
      wsPreAuthBytes: env.LIMIT_WS_PREAUTH_BYTES,
    }),
    vps: prune({
      runtimes: list(env.VPS_RUNTIMES),
      providers,
      hostNetwork: env.VPS_HOST_NETWORK,
      // The agent reads the same variable: on one machine, one setting allows http on both sides.
      imageSources: prune({ allowHttp: env.IMAGE_SOURCE_HTTP }),
      secretRefs: prune({ envPrefix: env.PROVIDER_SECRET_ENV_PREFIX, dir: env.PROVIDER_SECRET_DIR }),
    }),
  });
}

/**
 * Every variable this module reads as a setting (and BC_CONFIG): what readEnv asks of a recording environment.
 * A credential reference never names one of these (DATABASE_URL, SEAL_KEY, …), whatever the prefix allows.
 */
export const settingNames: ReadonlySet<string> = (() => {
  const seen = new Set<string>(["BC_CONFIG"]);
  const recorder = new Proxy({} as NodeJS.ProcessEnv, {
    get: (_t, key) => {
      if (typeof key === "string") seen.add(key);
      return undefined;
    },
  });
  readEnv(recorder);
  return seen;
})();

function prune(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(o).filter(([, v]) => v !== undefined && !(typeof v === "object" && v !== null && !Array.isArray(v) && Object.keys(v).length === 0)),
  );
}

/** Parse file + env into one Config, or throw INVALID_CONFIG naming the first offending path. */
export function parseConfig(file: ConfigFile = {}, env: NodeJS.ProcessEnv = {}): Config {
  const fromEnv = readEnv(env);
  const envProviders = fromEnv.providers as { endpoints?: object } | undefined;
  const envVps = fromEnv.vps as { secretRefs?: object } | undefined;
  const merged = {
    ...file,
    ...fromEnv,
    hosts: { ...file.hosts, ...(fromEnv.hosts as object | undefined) },
    providers: { ...file.providers, ...envProviders, endpoints: { ...file.providers?.endpoints, ...envProviders?.endpoints } },
    sandboxes: { ...file.sandboxes, ...(fromEnv.sandboxes as object | undefined) },
    live: { ...file.live, ...(fromEnv.live as object | undefined) },
    retention: { ...file.retention, ...(fromEnv.retention as object | undefined) },
    limits: { ...file.limits, ...(fromEnv.limits as object | undefined) },
    vps: { ...file.vps, ...envVps, secretRefs: { ...file.vps?.secretRefs, ...envVps?.secretRefs } },
  };
  const result = schema.safeParse(merged);
  if (!result.success) {
    const issue = result.error.issues[0];
    const path = issue ? issue.path.join(".") : "";
    throw new AppError("INVALID_CONFIG", `invalid config at ${path || "(root)"}: ${issue?.message}`, { path });
  }
  return result.data;
}

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
