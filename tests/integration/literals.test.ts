import fc from "fast-check";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Database, openDatabase } from "../../infra/db/index.ts";
import { literal } from "../../infra/db/literals.ts";
import { cloneDatabase } from "../support/pg.ts";

// A transaction's first statement and its last go to PostgreSQL as EXECUTEs with their parameters as literals
// (infra/db/literals.ts), every other as node-postgres sends parameters. For any value, the two must leave
// PostgreSQL holding the same thing: `SELECT <literal>::<type>` returns what `SELECT $1::<type>` does, or both
// fail alike, or the value has no literal (and then goes the way node-postgres sends it). Compared as the value's
// text in PostgreSQL, which tells -0 from 0 and a replaced character from the one sent.
let clone: Awaited<ReturnType<typeof cloneDatabase>>;
let client: pg.Client;
let db: Database;
beforeAll(async () => {
  clone = await cloneDatabase();
  client = new pg.Client({ connectionString: clone.url });
  await client.connect();
  db = await openDatabase({ databaseUrl: clone.url, poolSize: 1 });
});
afterAll(async () => {
  await client?.end();
  await db?.close();
  await clone?.drop();
});

type Outcome = { value: string | null } | { error: string };

async function outcome(text: string, params?: unknown[]): Promise<Outcome> {
  try {
    const { rows } = await client.query<{ v: string | null }>(text, params);
    return { value: (rows[0] as { v: string | null }).v };
  } catch (e) {
    return { error: (e as { code?: string }).code ?? String(e) };
  }
}

/** What no literal may be made of: it goes apart from the query, where node-postgres and PostgreSQL deal with it. */
function refusable(v: unknown): boolean {
  if (typeof v === "string") return v.includes("\u0000");
  if (typeof v === "number") return !Number.isFinite(v);
  if (v instanceof Date) return Number.isNaN(v.getTime());
  if (Array.isArray(v)) return v.some((e) => (e !== null && typeof e === "object") || (typeof e === "string" && e.includes("\u0000")));
  return typeof v === "object" && v !== null && !Buffer.isBuffer(v);
}

/** The property, for one value bound as `type`, under both settings of standard_conforming_strings. */
async function sameEitherWay(v: unknown, type: string): Promise<void> {
  let lit: string | null;
  try {
    lit = literal(v);
  } catch {
    lit = null;
  }
  expect(lit === null, `literal of ${String(v)} as ${type}: refused?`).toBe(refusable(v));
  if (lit === null) return;
  const sent = await outcome(`SELECT ($1::${type})::text AS v`, [v]);
  for (const conforming of ["on", "off"]) {
    await client.query(`SET standard_conforming_strings = ${conforming}`);
    expect(await outcome(`SELECT (${lit}::${type})::text AS v`), `${type} ${lit.slice(0, 200)} (standard_conforming_strings ${conforming})`).toEqual(sent);
  }
}

/** Characters that quoting, escaping, arrays and encodings trip on, among any others. */
const awkward = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom("'", "''", "\\", "\\\\", '"', "E'", "\\x41", "$1", "{", "}", ",", " ", "NULL", "\n", "\t", "\r", ";", "--", "/*") },
  { weight: 1, arbitrary: fc.constantFrom("\u0000", "é", "😀", "\u2028", "\uFEFF", "\uFFFF", "\u{10FFFF}") },
  // Lone surrogates: no character of their own, in either path.
  { weight: 1, arbitrary: fc.integer({ min: 0xd800, max: 0xdfff }).map((c) => String.fromCharCode(c)) },
  { weight: 3, arbitrary: fc.string({ unit: "binary", maxLength: 4 }) },
);
const text = fc.oneof(fc.string({ unit: awkward, maxLength: 40 }), fc.string({ unit: "binary" }));
const scalar = fc.oneof(text, fc.integer(), fc.double(), fc.boolean(), fc.constant(null));

describe("a parameter as a literal", () => {
  it("is the same text, whatever it holds", async () => {
    await fc.assert(
      fc.asyncProperty(text, (s) => sameEitherWay(s, "text")),
      { numRuns: 400 },
    );
  });

  it("is the same JSON, nested quotes and all", async () => {
    const json = fc.oneof(
      fc.jsonValue().map((j) => JSON.stringify(j)),
      fc.dictionary(text, text).map((o) => JSON.stringify(o)),
    );
    await fc.assert(
      fc.asyncProperty(json, (s) => sameEitherWay(s, "jsonb")),
      { numRuns: 300 },
    );
    // An object or array itself has no literal (node-postgres makes JSON of one, or an array literal of the other).
    await sameEitherWay({ o: "it's" }, "jsonb");
  });

  it("is the same number: integers, doubles (-0, NaN, infinities) and big integers", async () => {
    const n = fc.oneof(fc.integer(), fc.double(), fc.constantFrom(-0, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53 + 2, 1e21, 5e-324, -1e308));
    await fc.assert(
      fc.asyncProperty(n, fc.constantFrom("int4", "int8", "float8", "numeric"), (v, type) => sameEitherWay(v, type)),
      { numRuns: 400 },
    );
    const big = fc.oneof(fc.bigInt(), fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }));
    await fc.assert(
      fc.asyncProperty(big, fc.constantFrom("int8", "numeric"), (v, type) => sameEitherWay(v, type)),
      { numRuns: 200 },
    );
  });

  it("is the same boolean, null and date", async () => {
    for (const v of [true, false]) await sameEitherWay(v, "boolean");
    for (const type of ["text", "int4", "timestamptz", "jsonb", "text[]", "bytea"]) await sameEitherWay(null, type);
    await sameEitherWay(undefined, "text");
    const when = fc.date({ noInvalidDate: false });
    await fc.assert(
      fc.asyncProperty(when, fc.constantFrom("timestamptz", "timestamp", "date", "text"), (d, type) => sameEitherWay(d, type)),
      { numRuns: 300 },
    );
  });

  it("is the same bytes", async () => {
    await fc.assert(
      fc.asyncProperty(fc.uint8Array({ maxLength: 300 }), (b) => sameEitherWay(Buffer.from(b), "bytea")),
      { numRuns: 200 },
    );
  });

  it("is the same array of scalars, elements quoted however they read", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.oneof(text, fc.constant(null)), { maxLength: 8 }), (a) => sameEitherWay(a, "text[]")),
      { numRuns: 300 },
    );
    await fc.assert(
      fc.asyncProperty(fc.array(fc.oneof(fc.integer(), fc.constant(null)), { maxLength: 8 }), (a) => sameEitherWay(a, "int8[]")),
      {
        numRuns: 100,
      },
    );
    await fc.assert(
      fc.asyncProperty(fc.array(scalar, { maxLength: 8 }), (a) => sameEitherWay(a, "text[]")),
      { numRuns: 200 },
    );
    // Nested arrays and dates in arrays have none.
    await sameEitherWay([["a"]], "text[]");
    await sameEitherWay([new Date(0)], "timestamptz[]");
  });

  it("is the same very long string", async () => {
    const long = `${'it\'s a \\ "long" one 😀 '.repeat(40_000)}end`;
    await sameEitherWay(long, "text");
    await sameEitherWay(JSON.stringify({ long }), "jsonb");
  });
});

describe("a transaction's first statement, sent with its parameters as literals", () => {
  it("reads what the same statement reads with its parameters sent apart", async () => {
    const value = fc.oneof(text, fc.integer(), fc.double({ noNaN: true, noDefaultInfinity: true }), fc.boolean(), fc.date(), fc.constant(null));
    await fc.assert(
      fc.asyncProperty(value, async (v) => {
        const statement = `SELECT $1::text AS v`;
        const apart = await db.read((sql) => sql.query<{ v: string }>(statement, [v])).catch((e: { code?: string }) => e.code);
        const together = await db.transaction((sql) => sql.query<{ v: string }>(statement, [v])).catch((e: { code?: string }) => e.code);
        expect(together).toEqual(apart);
      }),
      { numRuns: 300 },
    );
  });
});
