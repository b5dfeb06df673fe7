import { hostname as osHostname } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { z } from "zod";
import { AppError } from "../contracts/errors.ts";
import { parseCidr } from "./runtimes/fetch-guard.ts";
import { type RuntimeOptions, runtimes } from "./runtimes/registry.ts";

/**
 * The agent's configuration: its flags (`bc agent …`) and the environment variables it reads, validated
 * together. A bad value is INVALID_CONFIG naming the flag or variable, what it expects and what it got.
 * Arguments and environment are parameters, so tests pass their own.
 */

export const logLevels = ["debug", "info", "warn", "error", "silent"] as const;
export type LogLevel = (typeof logLevels)[number];

export interface AgentConfig {
  /** The server's GraphQL URL. */
  server: string;
  joinToken: string | undefined;
  name: string;
  /** Absolute. */
  stateDir: string;
  /** A key of the runtime registry (agent/runtimes/registry.ts). */
  runtime: string;
  heartbeatMs: number;
  /** How sandboxes' egress policies are enforced on this host: nftables on the instances' taps, or not at all. */
  egress: "nftables" | "off";
  logLevel: LogLevel;
  /** What the runtime is made with: `runtimes[runtime](runtimeOptions)`. */
  runtimeOptions: RuntimeOptions;
}

const options = {
  server: { type: "string" },
  "join-token": { type: "string" },
  runtime: { type: "string" },
  name: { type: "string" },
  "state-dir": { type: "string" },
  "heartbeat-ms": { type: "string" },
  // Sandboxes' egress policies: nftables rules on each instance's tap (default with libvirt-kvm), or off.
  egress: { type: "string" },
  // What a simulated host offers (the fake runtime); real runtimes read it from the host.
  vcpus: { type: "string" },
  "memory-mib": { type: "string" },
  "disk-gib": { type: "string" },
  "delay-ms": { type: "string" },
  // libvirt-kvm: the domain type (auto: kvm only with hardware virtualisation), direct kernel boot for
  // root-filesystem images, the shutdown bound, and the GPUs offered (model=0000:65:00.0, repeatable).
  "libvirt-uri": { type: "string" },
  "domain-type": { type: "string" },
  kernel: { type: "string" },
  initrd: { type: "string" },
  cmdline: { type: "string" },
  "shutdown-timeout-ms": { type: "string" },
  gpu: { type: "string", multiple: true },
  // Image sources: ranges a host may fetch from although they are loopback, private or link-local (a mirror
  // on the operator's network; repeatable), and whether plain http is allowed. Default: public https only.
  "image-source-allow": { type: "string", multiple: true },
  "image-source-http": { type: "boolean" },
} as const;

const integer = (min: number) =>
  z
    .string()
    .refine((s) => /^\d+$/.test(s) && Number.isSafeInteger(Number(s)) && Number(s) >= min, { error: `expected an integer of at least ${min}` })
    .transform(Number);
const oneOf = <T extends string>(values: readonly [T, ...T[]]) => z.enum(values, { error: `expected one of ${values.join(", ")}` });
const httpUrl = z.string().refine((s) => URL.canParse(s) && /^https?:$/.test(new URL(s).protocol), { error: "expected an http:// or https:// URL" });
const libvirtUri = z.string().regex(/^[a-z][a-z0-9+.-]*:\/\/\S*$/i, { error: "expected a libvirt URI such as qemu:///system" });
const path = z.string().min(1, { error: "expected a path" });
const cidr = z.string().refine((s) => parseCidr(s) !== null, { error: "expected a CIDR such as 10.0.0.0/8 or fd00::/8, or an address" });
const bool = z.stringbool({ error: "expected true or false" });
const gpu = z
  .string()
  .regex(/^[^=\s]+=[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$/, { error: "expected model=0000:65:00.0" })
  .transform((g) => {
    const [model, pciAddress] = g.split("=") as [string, string];
    return { model, pciAddress };
  });

const flagSchema = z.object({
  server: httpUrl,
  "join-token": z.string().min(1, { error: "expected a token" }).optional(),
  runtime: z.string().optional(),
  // As the server names nodes: joining with anything else would be refused there.
  name: z
    .string()
    .regex(/^[a-z0-9][a-z0-9.-]{0,62}$/, { error: "expected 1 to 63 lower-case letters, digits, . and -, starting with a letter or digit" })
    .optional(),
  "state-dir": path.optional(),
  "heartbeat-ms": integer(100).default(5000),
  egress: oneOf(["nftables", "off"]).optional(),
  vcpus: integer(1).default(16),
  "memory-mib": integer(1).default(65536),
  "disk-gib": integer(1).default(1000),
  "delay-ms": integer(0).default(0),
  "libvirt-uri": libvirtUri.optional(),
  "domain-type": oneOf(["auto", "kvm", "qemu"]).optional(),
  kernel: path.optional(),
  initrd: path.optional(),
  cmdline: z.string().min(1, { error: "expected a kernel command line" }).optional(),
  "shutdown-timeout-ms": integer(0).optional(),
  gpu: z.array(gpu).default([]),
  "image-source-allow": z.array(cidr).optional(),
  "image-source-http": z.boolean().optional(),
});

const envSchema = z.object({
  LOG_LEVEL: oneOf(logLevels).default("info"),
  LIBVIRT_DOMAIN_TYPE: oneOf(["auto", "kvm", "qemu"]).optional(),
  LIBVIRT_URI: libvirtUri.optional(),
  /** Comma-separated, as --image-source-allow. */
  IMAGE_SOURCE_ALLOW: z
    .string()
    .transform((s) =>
      s
        .split(",")
        .map((c) => c.trim())
        .filter(Boolean),
    )
    .pipe(z.array(cidr))
    .optional(),
  IMAGE_SOURCE_HTTP: bool.optional(),
});

const invalid = (message: string) => new AppError("INVALID_CONFIG", message);

/** The first problem zod found, as `<name>: <what was expected>, got <value>`. */
function explain(error: z.ZodError, input: Record<string, unknown>, nameOf: (key: string) => string): AppError {
  const issue = error.issues[0];
  if (!issue) return invalid(error.message);
  const key = String(issue.path[0]);
  let got: unknown = input[key];
  if (Array.isArray(got) && typeof issue.path[1] === "number") got = got[issue.path[1]];
  if (got === undefined) return invalid(`${nameOf(key)}: required`);
  return invalid(`${nameOf(key)}: ${issue.message}, got ${JSON.stringify(got)}`);
}

function parseFlags(argv: string[]) {
  try {
    return parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values;
  } catch (e) {
    // node:util's own wording names the flag ("Unknown option '--x'"); keep it, as configuration's error.
    throw invalid(`bc agent: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/**
 * The agent's configuration from its arguments (after `bc agent`) and environment. The process's own
 * environment is the default, read here and nowhere else in the agent's process.
 */
export function loadAgentConfig(argv: string[], env: Record<string, string | undefined> = process.env, hostname: string = osHostname()): AgentConfig {
  const raw = parseFlags(argv);
  const flags = flagSchema.safeParse(raw);
  if (!flags.success) throw explain(flags.error, raw, (k) => `--${k}`);
  // An empty variable is an unset one: `LOG_LEVEL= bc agent` means the default, not an error.
  const rawEnv = Object.fromEntries(Object.keys(envSchema.shape).map((k) => [k, env[k] === "" ? undefined : env[k]]));
  const vars = envSchema.safeParse(rawEnv);
  if (!vars.success) throw explain(vars.error, rawEnv, (k) => k);
  const f = flags.data;

  const runtime = f.runtime ?? "fake";
  if (!Object.hasOwn(runtimes, runtime)) throw invalid(`--runtime: expected one of ${Object.keys(runtimes).join(", ")}, got ${JSON.stringify(runtime)}`);
  if (!f.kernel) {
    for (const flag of ["initrd", "cmdline"] as const) if (f[flag] !== undefined) throw invalid(`--${flag}: only with --kernel`);
  }
  const name =
    f.name ??
    hostname
      .toLowerCase()
      .replace(/[^a-z0-9.-]/g, "-")
      .replace(/^[^a-z0-9]+/, "")
      .slice(0, 63);
  if (!name) throw invalid(`--name: required, as the host name ${JSON.stringify(hostname)} gives none`);
  const stateDir = resolve(f["state-dir"] ?? join(".data", "agent", name));
  return {
    server: f.server,
    joinToken: f["join-token"],
    name,
    stateDir,
    runtime,
    heartbeatMs: f["heartbeat-ms"],
    // Only real taps can be filtered: the fake runtime has none.
    egress: f.egress ?? (runtime === "libvirt-kvm" ? "nftables" : "off"),
    logLevel: vars.data.LOG_LEVEL,
    runtimeOptions: {
      stateDir,
      capacity: { vcpus: f.vcpus, memoryMib: f["memory-mib"], diskGib: f["disk-gib"], gpus: [] },
      delayMs: f["delay-ms"],
      libvirt: {
        uri: f["libvirt-uri"] ?? vars.data.LIBVIRT_URI,
        domainType: f["domain-type"] ?? vars.data.LIBVIRT_DOMAIN_TYPE ?? "auto",
        boot: f.kernel
          ? { kernel: resolve(f.kernel), initrd: f.initrd ? resolve(f.initrd) : undefined, cmdline: f.cmdline ?? "console=ttyS0 root=/dev/vda rw" }
          : undefined,
        shutdownTimeoutMs: f["shutdown-timeout-ms"],
        gpus: f.gpu,
        imageSources: {
          allow: f["image-source-allow"] ?? vars.data.IMAGE_SOURCE_ALLOW ?? [],
          allowHttp: f["image-source-http"] ?? vars.data.IMAGE_SOURCE_HTTP ?? false,
        },
      },
    },
  };
}
