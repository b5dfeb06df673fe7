import type { z } from "zod";
import { invalid } from "../../contracts/errors.ts";

/** Parse with zod and turn the first issue into INVALID_INPUT naming the field. */
export function parseInput<T>(schema: z.ZodType<T>, value: unknown, where = "input"): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const path = [where, ...(issue?.path ?? [])].join(".");
  throw invalid(`${path}: ${issue?.message ?? "invalid"}`, { path });
}
