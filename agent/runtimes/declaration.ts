import { z } from "zod";
import { type RuntimeId, type RuntimeTraits, runtimeTraits } from "../../contracts/runtimes.ts";
import type { Runtime } from "./runtime.ts";

/**
 * How a runtime declares itself (agent/runtimes/<id>/declaration.ts): its id and traits (contracts/runtimes.ts,
 * which the server reads too), the `bc agent` flags and environment variables it takes, what it makes of them,
 * and how it is made. agent/config.ts reads every declared runtime's flags (as it always has, whichever runtime
 * is chosen); tests/conformance/runtime.ts runs the same cases against each, skipping those of a trait it lacks.
 */

/** One flag of `bc agent`: how node:util's parseArgs reads it, and the zod schema that checks what it read. */
export interface Flag<S extends z.ZodType = z.ZodType> {
  type: "string" | "boolean";
  multiple?: boolean;
  schema: S;
}

type Parsed<T extends Record<string, { schema: z.ZodType } | z.ZodType>> = {
  [K in keyof T]: T[K] extends { schema: infer S extends z.ZodType } ? z.output<S> : T[K] extends z.ZodType ? z.output<T[K]> : never;
};

export interface RuntimeDeclaration<Options extends object = object> {
  id: RuntimeId;
  traits: RuntimeTraits;
  flags: Record<string, Flag>;
  /** Environment variables it reads, by name (an empty one counts as unset). */
  env: Record<string, z.ZodType>;
  /**
   * Its share of the agent's runtime options, from every flag and variable as checked (its own among them).
   * Throws INVALID_CONFIG, naming the flag, for a combination the schemas cannot say.
   */
  options(flags: Record<string, unknown>, env: Record<string, unknown>): Options;
  make(o: { stateDir: string } & Options): Promise<Runtime> | Runtime;
}

/** A declaration whose `options` sees its own flags and variables typed; its traits are the contract's. */
export function defineRuntime<F extends Record<string, Flag>, E extends Record<string, z.ZodType>, O extends object>(d: {
  id: RuntimeId;
  flags: F;
  env: E;
  options(flags: Parsed<F>, env: Parsed<E>): O;
  make(o: { stateDir: string } & O): Promise<Runtime> | Runtime;
}): RuntimeDeclaration<O> {
  return {
    ...d,
    traits: runtimeTraits[d.id],
    // agent/config.ts parsed these with the schemas declared here.
    options: (flags, env) => d.options(flags as Parsed<F>, env as Parsed<E>),
  };
}

// Schemas the agent's flags share: each names what it expects, as agent/config.ts's messages quote it.
export const integer = (min: number) =>
  z
    .string()
    .refine((s) => /^\d+$/.test(s) && Number.isSafeInteger(Number(s)) && Number(s) >= min, { error: `expected an integer of at least ${min}` })
    .transform(Number);
export const oneOf = <T extends string>(values: readonly [T, ...T[]]) => z.enum(values, { error: `expected one of ${values.join(", ")}` });
export const path = z.string().min(1, { error: "expected a path" });
export const bool = z.stringbool({ error: "expected true or false" });
