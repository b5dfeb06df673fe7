/**
 * Parameters as SQL literals, for the one place that needs them: a transaction's first statement goes in one
 * message with its BEGIN, and a last one with its COMMIT, as `EXECUTE name(literal, …)` of a statement prepared
 * on the connection (./index.ts). A literal must make PostgreSQL hold exactly what node-postgres would have sent
 * as the parameter (tests/integration/literals.test.ts holds the two equal over hostile values); a value this
 * cannot promise that for has no literal, and its statement goes apart, as node-postgres sends it.
 */
import pg from "pg";

/** node-postgres's text form of a parameter (not in its type declarations): a date's, here. */
const { prepareValue } = (pg as unknown as { utils: { prepareValue(v: unknown): unknown } }).utils;

/** Every parameter as a literal EXECUTE can take, or null if one has none (it then goes apart, as usual). */
export function literals(params: readonly unknown[]): string | null {
  try {
    return params.map(literal).join(", ");
  } catch {
    return null;
  }
}

/**
 * A parameter as EXECUTE takes it: a quoted literal of its text form, which PostgreSQL converts to the type the
 * prepared statement inferred for it, as it does a parameter sent apart from the query. Throws for a value that
 * has none.
 */
export function literal(v: unknown): string {
  if (v === null || v === undefined) return "NULL";
  if (typeof v === "string") return quoted(v);
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new Error(`not a finite number: ${v}`);
    return `'${v}'`;
  }
  if (typeof v === "boolean" || typeof v === "bigint") return `'${v}'`;
  if (v instanceof Date) return dated(v);
  if (Buffer.isBuffer(v)) return quoted(`\\x${v.toString("hex")}`);
  if (Array.isArray(v))
    return quoted(
      `{${v
        .map((e) => {
          if (e === null || e === undefined) return "NULL";
          if (typeof e === "object") throw new Error("only arrays of scalars are sent as literals");
          return `"${noNul(String(e)).replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;
        })
        .join(",")}}`,
    );
  throw new Error(`no literal for a ${typeof v}`);
}

/**
 * A date as node-postgres writes it (local time with its offset, years BC and past 9999 included), so that it
 * reads the same whatever it is bound as; an invalid date has none (node-postgres sends it anyway, and warns).
 */
function dated(d: Date): string {
  if (Number.isNaN(d.getTime())) throw new Error("an invalid date has no literal");
  return quoted(prepareValue(d) as string);
}

/**
 * A string as a literal: as pg.escapeLiteral makes it (an E'' literal when it holds a backslash, so the
 * server's standard_conforming_strings does not matter), but most strings (ids, JSON without either character)
 * are sent as they are, without pg's character-by-character copy, which showed in the API's profile.
 */
function quoted(s: string): string {
  noNul(s);
  if (!/['\\]/.test(s)) return `'${s}'`;
  return s.includes("\\") ? ` E'${s.replace(/\\/g, "\\\\").replace(/'/g, "''")}'` : `'${s.replace(/'/g, "''")}'`;
}

/**
 * A query's text ends at its first NUL, so a string holding one has no literal: such a parameter goes apart
 * from the query, where PostgreSQL refuses it as it refuses any NUL in text (22021, the caller's bad input).
 */
function noNul(s: string): string {
  if (s.includes("\u0000")) throw new Error("a NUL has no literal");
  return s;
}
