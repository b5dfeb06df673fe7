import { z } from "zod";
import { invalid } from "../../contracts/errors.ts";

/** Parse with zod and turn the first issue into INVALID_INPUT naming the field. */
export function parseInput<T>(schema: z.ZodType<T>, value: unknown, where = "input"): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const path = [where, ...(issue?.path ?? [])].join(".");
  throw invalid(`${path}: ${issue?.message ?? "invalid"}`, { path });
}

/** The name of a pool, node, provider account or sandbox template: usable in DNS labels and paths. */
export const resourceName = z
  .string()
  .trim()
  .regex(/^[a-z0-9][a-z0-9-]{0,62}$/, "1 to 63 lower-case letters, digits and hyphens");

/** Names of tenants, projects and tokens: what a person types and reads. */
export const displayName = z
  .string()
  .trim()
  .regex(/^[A-Za-z0-9][A-Za-z0-9 ._-]{0,62}$/, "1 to 63 letters, digits, space . _ - (starting with a letter or digit)");

/** A client's idempotency key (instances, sandboxes). */
export const idempotencyKey = z.string().regex(/^[\x21-\x7e]{1,128}$/, "1 to 128 printable ASCII characters");
