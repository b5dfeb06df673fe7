import { hostname as osHostname } from "node:os";
import { join, resolve } from "node:path";
import { type ParseArgsConfig, parseArgs } from "node:util";
import { z } from "zod";
import { AppError } from "../contracts/errors.ts";
import { type Flag, integer, oneOf, path } from "./runtimes/declaration.ts";
import { declarations, defaultAgentRuntime, type RuntimeOptions } from "./runtimes/registry.ts";

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

// The agent's own flags; each runtime's come from its declaration (./runtimes/registry.ts).
const agentFlags = {
  server: {
    type: "string",
    schema: z.string().refine((s) => URL.canParse(s) && /^https?:$/.test(new URL(s).protocol), { error: "expected an http:// or https:// URL" }),
  },
  "join-token": { type: "string", schema: z.string().min(1, { error: "expected a token" }).optional() },
  runtime: { type: "string", schema: z.string().optional() },
  // As the server names nodes: joining with anything else would be refused there.
  name: {
    type: "string",
    schema: z
      .string()
      .regex(/^[a-z0-9][a-z0-9.-]{0,62}$/, { error: "expected 1 to 63 lower-case letters, digits, . and -, starting with a letter or digit" })
      .optional(),
  },
  "state-dir": { type: "string", schema: path.optional() },
  "heartbeat-ms": { type: "string", schema: integer(100).default(5000) },
  // Sandboxes' egress policies: nftables rules on each instance's tap (the default where the runtime's guests
  // have taps: its tapEgress trait), or off.
  egress: { type: "string", schema: oneOf(["nftables", "off"]).optional() },
} satisfies Record<string, Flag>;
const agentEnv = { LOG_LEVEL: oneOf(logLevels).default("info") };

/** Every flag and variable: the agent's, then each runtime's in the registry's order (the order refusals are found in). */
function merged<T>(own: Record<string, T>, theirs: (d: (typeof declarations)[number]) => Record<string, T>): Record<string, T> {
  const all = { ...own };
  for (const d of declarations) {
    for (const [k, v] of Object.entries(theirs(d))) {
      if (Object.hasOwn(all, k)) throw new Error(`runtime ${d.id} declares ${k}, which another runtime or the agent already takes`);
      all[k] = v;
    }
  }
  return all;
}
const allFlags = merged<Flag>(agentFlags, (d) => d.flags);
const options = Object.fromEntries(
  Object.entries(allFlags).map(([k, f]) => [k, f.multiple ? { type: f.type, multiple: true } : { type: f.type }]),
) as NonNullable<ParseArgsConfig["options"]>;
const flagSchema = z.object(Object.fromEntries(Object.entries(allFlags).map(([k, f]) => [k, f.schema])));
const envSchema = z.object(merged<z.ZodType>(agentEnv, (d) => d.env));
type Own = { [K in keyof typeof agentFlags]: z.output<(typeof agentFlags)[K]["schema"]> };

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
  // Checked above with every declared schema: the agent's own are typed here, each runtime types its own.
  const f = flags.data as Own;
  const runtime = f.runtime ?? defaultAgentRuntime;
  const declared = declarations.find((d) => d.id === runtime);
  if (!declared) throw invalid(`--runtime: expected one of ${declarations.map((d) => d.id).join(", ")}, got ${JSON.stringify(runtime)}`);
  // Every runtime's options, whichever is chosen, as before runtimes declared their flags: a bad combination of
  // any runtime's flags is refused.
  const perRuntime = declarations.map((d) => d.options(flags.data, vars.data));
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
    // Only real taps can be filtered.
    egress: f.egress ?? (declared.traits.tapEgress ? "nftables" : "off"),
    logLevel: vars.data.LOG_LEVEL as LogLevel,
    runtimeOptions: Object.assign({ stateDir }, ...perRuntime) as RuntimeOptions,
  };
}
