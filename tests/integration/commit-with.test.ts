import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Sql } from "../../core/kernel/db.ts";
import { type Database, openDatabase } from "../../infra/db/index.ts";
import { cloneDatabase } from "../support/pg.ts";

// Sql.commitWith sends its parameters as quoted literals of an EXECUTE (infra/db/index.ts), not apart from the
// query: every kind of value admission sends must come back exactly as it went, whatever characters it holds.
let clone: Awaited<ReturnType<typeof cloneDatabase>>;
let db: Database;
beforeAll(async () => {
  clone = await cloneDatabase();
  db = await openDatabase({ databaseUrl: clone.url, poolSize: 1 });
  await db.read((sql) =>
    sql.query(`CREATE TABLE cw (id serial PRIMARY KEY, t text, n int, b bigint, f double precision, ok boolean, at timestamptz,
                               arr text[], nums bigint[], bytes bytea, doc jsonb)`),
  );
});
afterAll(async () => {
  await db?.close();
  await clone?.drop();
});

const INSERT = `INSERT INTO cw (t, n, b, f, ok, at, arr, nums, bytes, doc) VALUES ($1, $2, $3, $4, $5, $6, $7::text[], $8::bigint[], $9, $10::jsonb)
  RETURNING t, n, b::text AS b, f, ok, at, arr, nums::text[] AS nums, bytes, doc`;

const commitWith = (sql: Sql) => {
  if (!sql.commitWith) throw new Error("no commitWith on PostgreSQL");
  return sql.commitWith.bind(sql);
};

describe("Sql.commitWith", () => {
  it("sends every kind of value admission sends, whatever it holds, and commits with the statement", async () => {
    const awkward = `it's "quoted", back\\slash\\\\, {braces}, comma, 'single' '' ; COMMIT; -- é ✓ \n\t$1 E'\\x41'`;
    const values = [
      awkward,
      -42,
      "9007199254740993",
      1.5,
      false,
      new Date("2026-12-02T10:30:00.123Z"),
      [awkward, "NULL", "", " spaced ", "a,b", "{x}", 'q"q', "back\\slash", null],
      [1, -2, 3],
      Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
      JSON.stringify({ key: awkward, n: [1, null] }),
    ];
    const [row] = await db.transaction((sql) => commitWith(sql)<Record<string, unknown>>(INSERT, values));
    expect(row).toEqual({
      t: awkward,
      n: -42,
      b: "9007199254740993",
      f: 1.5,
      ok: false,
      at: values[5],
      arr: values[6],
      nums: ["1", "-2", "3"],
      bytes: values[8],
      doc: { key: awkward, n: [1, null] },
    });
    // Committed: another connection sees it.
    const [seen] = await db.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM cw WHERE t = $1`, [awkward]));
    expect(seen?.n).toBe(1);
    // Empty and null arrays, null scalars; and the statement prepared on this connection serves again.
    const [empty] = await db.transaction((sql) => commitWith(sql)<Record<string, unknown>>(INSERT, [null, null, null, null, null, null, [], null, null, null]));
    expect(empty).toMatchObject({ t: null, n: null, arr: [], nums: null, bytes: null });
  });

  it("rolls the whole transaction back when the statement fails, and ends it either way", async () => {
    const marker = `rollback-${Date.now()}`;
    await expect(
      db.transaction(async (sql) => {
        await sql.query(`INSERT INTO cw (t) VALUES ($1)`, [marker]);
        // n is an int: the statement fails inside PostgreSQL, after the first insert ran.
        return commitWith(sql)(`INSERT INTO cw (t, n) VALUES ($1, $2) RETURNING id`, [marker, "not a number"]);
      }),
    ).rejects.toThrow(/invalid input syntax/);
    const [left] = await db.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM cw WHERE t = $1`, [marker]));
    expect(left?.n).toBe(0);

    // After it commits, the write is over: a further statement would run outside it, so it is refused.
    await expect(
      db.transaction(async (sql) => {
        await commitWith(sql)(`INSERT INTO cw (t) VALUES ($1) RETURNING id`, [marker]);
        await sql.query(`INSERT INTO cw (t) VALUES ($1)`, [marker]);
      }),
    ).rejects.toThrow(/committed by its last statement/);
    const [kept] = await db.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM cw WHERE t = $1`, [marker]));
    expect(kept?.n).toBe(1);
  });
});

describe("a transaction's first statement carries its BEGIN", () => {
  const count = async (t: string) => (await db.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM cw WHERE t = $1`, [t])))[0]?.n ?? 0;

  it("runs inside the transaction: a later failure takes its write back, a commit keeps it", async () => {
    const marker = `first-${Date.now()}`;
    await expect(
      db.transaction(async (sql) => {
        const [row] = await sql.query<{ t: string; at: Date }>(`INSERT INTO cw (t, at) VALUES ($1, $2) RETURNING t, at`, [
          marker,
          new Date("2026-12-02T00:00:00Z"),
        ]);
        expect(row).toEqual({ t: marker, at: new Date("2026-12-02T00:00:00Z") });
        throw new Error("changed my mind");
      }),
    ).rejects.toThrow(/changed my mind/);
    expect(await count(marker)).toBe(0);
    // A statement without parameters goes with BEGIN as it is; one whose parameter has no literal (an object, for
    // node-postgres to serialise) goes after a BEGIN of its own. Both are inside the transaction.
    await expect(
      db.transaction(async (sql) => {
        await sql.query(`INSERT INTO cw (t) VALUES ('${marker}')`);
        await sql.query(`INSERT INTO cw (t, doc) VALUES ($1, $2)`, [marker, { nested: [marker] }]);
        throw new Error("again");
      }),
    ).rejects.toThrow(/again/);
    expect(await count(marker)).toBe(0);
    await db.transaction(async (sql) => {
      await sql.query(`INSERT INTO cw (t, doc) VALUES ($1, $2)`, [marker, { nested: [marker] }]);
      await sql.query(`INSERT INTO cw (t, n) VALUES ($1, $2)`, [marker, 7]);
    });
    expect(await count(marker)).toBe(2);
  });

  it("rolls back when the first statement itself fails, and the connection serves the next transaction", async () => {
    const marker = `first-fails-${Date.now()}`;
    await expect(db.transaction((sql) => sql.query(`INSERT INTO cw (t, n) VALUES ($1, $2)`, [marker, "not a number"]))).rejects.toThrow(/invalid input syntax/);
    // poolSize 1: the same connection, which must not be left inside an aborted transaction.
    const [row] = await db.transaction((sql) => sql.query<{ t: string }>(`INSERT INTO cw (t) VALUES ($1) RETURNING t`, [marker]));
    expect(row?.t).toBe(marker);
    expect(await count(marker)).toBe(1);
    // A transaction that sends nothing commits nothing and leaves the connection as it was.
    await expect(db.transaction(async () => 42)).resolves.toBe(42);
    expect(await count(marker)).toBe(1);
  });
});

describe("a parameter a query's text cannot carry", () => {
  it("goes apart from the query (a NUL in a string): PostgreSQL refuses it as bad input, and nothing is written", async () => {
    const marker = `nul-${Date.now()}`;
    const nul = `a\u0000b`;
    const refusal = { code: "22021" };
    // As a transaction's first statement, as its committing statement, and as both.
    await expect(db.transaction((sql) => sql.query(`INSERT INTO cw (t) VALUES ($1)`, [nul]))).rejects.toMatchObject(refusal);
    await expect(
      db.transaction(async (sql) => {
        await sql.query(`INSERT INTO cw (t) VALUES ($1)`, [marker]);
        return commitWith(sql)(`INSERT INTO cw (t, arr) VALUES ($1, $2::text[]) RETURNING id`, [marker, [nul]]);
      }),
    ).rejects.toMatchObject(refusal);
    await expect(db.transaction((sql) => commitWith(sql)(`INSERT INTO cw (t) VALUES ($1) RETURNING id`, [nul]))).rejects.toMatchObject(refusal);
    const [left] = await db.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM cw WHERE t = $1`, [marker]));
    expect(left?.n).toBe(0);
    // The committing statement's fallback commits like the one-message path.
    const [row] = await db.transaction((sql) => commitWith(sql)<{ t: string }>(`INSERT INTO cw (t, doc) VALUES ($1, $2) RETURNING t`, [marker, { o: 1 }]));
    expect(row?.t).toBe(marker);
    const [kept] = await db.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM cw WHERE t = $1`, [marker]));
    expect(kept?.n).toBe(1);
  });
});

/** The messages this process sends to PostgreSQL while `fn` runs: each one is a round trip. */
async function messagesOf<T>(fn: () => Promise<T>): Promise<{ result: T; sent: string[] }> {
  const sent: string[] = [];
  const real = pg.Client.prototype.query;
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    const q = args[0];
    sent.push(typeof q === "string" ? q : String((q as { text?: string }).text));
    return (real as (...a: unknown[]) => unknown).apply(this, args);
  } as typeof real;
  try {
    return { result: await fn(), sent };
  } finally {
    pg.Client.prototype.query = real;
  }
}

describe("a statement new to its connection", () => {
  it("is prepared in the message that first runs it, with BEGIN or COMMIT: one round trip each", async () => {
    const marker = `prep-${Date.now()}`;
    // Texts no connection has run yet (poolSize 1: every transaction here is on the one connection).
    const first = `INSERT INTO cw (t, n) VALUES ($1, $2) RETURNING n /* ${marker} first */`;
    const last = `INSERT INTO cw (t, n) VALUES ($1, $2) RETURNING n /* ${marker} last */`;
    const { result, sent } = await messagesOf(() =>
      db.transaction(async (sql) => {
        const [a] = await sql.query<{ n: number }>(first, [marker, 1]);
        const [b] = await commitWith(sql)<{ n: number }>(last, [marker, 2]);
        return [a?.n, b?.n];
      }),
    );
    expect(result).toEqual([1, 2]);
    expect(sent).toHaveLength(2);
    expect(sent[0]).toMatch(/^PREPARE bcx_\d+ AS INSERT .* first \*\/; BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE bcx_\d+\(/);
    expect(sent[1]).toMatch(/^PREPARE bcx_\d+ AS INSERT .* last \*\/; EXECUTE bcx_\d+\(.*\); COMMIT$/);
    // Known to the connection now: the next transaction sends no PREPARE.
    const again = await messagesOf(() => db.transaction(async (sql) => commitWith(sql)(last, [marker, 3])));
    expect(again.sent).toEqual([expect.stringMatching(/^BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE bcx_\d+\(.*\); COMMIT$/)]);
    const [n] = await db.read((sql) => sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM cw WHERE t = $1`, [marker]));
    expect(n?.n).toBe(3);
  });

  it("runs again after a message that prepared it failed: the PREPARE may have stayed, so it is prepared anew under another name", async () => {
    const marker = `prep-fail-${Date.now()}`;
    const text = `INSERT INTO cw (t, n) VALUES ($1, $2) RETURNING n /* ${marker} */`;
    // Prepared, then its EXECUTE fails in PostgreSQL (n is an int): the prepared statement outlives the rollback.
    await expect(db.transaction((sql) => commitWith(sql)(text, [marker, "not a number"]))).rejects.toThrow(/invalid input syntax/);
    const [kept] = await db.read((sql) =>
      sql.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_prepared_statements WHERE statement LIKE $1`, [`%${marker}%`]),
    );
    expect(kept?.n).toBe(1);
    const [row] = await db.transaction((sql) => commitWith(sql)<{ n: number }>(text, [marker, 5]));
    expect(row?.n).toBe(5);
    const [first] = await db.transaction((sql) => sql.query<{ n: number }>(text, [marker, 6]));
    expect(first?.n).toBe(6);
  });
});

describe("a write's prepared statements", () => {
  /** How often the prepared statement whose text is LIKE `pattern` ran on each kind of plan (poolSize 1: on its own connection). */
  const plansOf = async (pattern: string) =>
    (
      await db.read((sql) =>
        sql.query<{ generic: number; custom: number }>(
          `SELECT generic_plans::int AS generic, custom_plans::int AS custom FROM pg_prepared_statements WHERE statement LIKE $1`,
          [pattern],
        ),
      )
    )[0];

  it("run on their generic plan from the first execution: a write is not planned again each time it runs", async () => {
    const marker = `generic-${Date.now()}`;
    const text = `UPDATE cw SET n = n + 1 WHERE id = $1 AND t = $2 RETURNING n /* ${marker} */`;
    const [{ id }] = (await db.transaction((sql) => commitWith(sql)<{ id: number }>(`INSERT INTO cw (t, n) VALUES ($1, 0) RETURNING id`, [marker]))) as [
      { id: number },
    ];
    // Once through each path that begins a transaction in its message (a first statement, a last one with COMMIT).
    await db.transaction((sql) => sql.query(text, [id, marker]));
    await db.transaction((sql) => commitWith(sql)(text, [id, marker]));
    await db.transaction((sql) => commitWith(sql)(text, [id, marker]));
    // A statement's text there is the whole message that prepared it.
    expect(await plansOf(`%PREPARE % AS UPDATE cw %${marker} */%`)).toEqual({ generic: 3, custom: 0 });
  });

  it("do so too where a parameter has no literal and BEGIN goes apart", async () => {
    const marker = `generic-apart-${Date.now()}`;
    // An object has no literal EXECUTE can take: the statement goes as node-postgres sends it, after BEGIN.
    const text = `INSERT INTO cw (t, doc) VALUES ($1, $2::jsonb) RETURNING id /* ${marker} */`;
    await db.transaction((sql) => sql.query(text, [marker, { n: 1 }]));
    await db.transaction((sql) => commitWith(sql)(text, [marker, { n: 2 }]));
    await db.transaction((sql) => commitWith(sql)(text, [marker, { n: 3 }]));
    expect(await plansOf(`INSERT INTO cw (t, doc)%${marker} */`)).toEqual({ generic: 3, custom: 0 });
  });
});

describe("Sql.batch", () => {
  it("sends statements in one message, in order, inside the transaction; a failure in any takes them all back", async () => {
    const marker = `batch-${Date.now()}`;
    const insert = `INSERT INTO cw (t, n) VALUES ($1, $2) RETURNING n /* ${marker} */`;
    const count = `SELECT count(*)::int AS n FROM cw WHERE t = $1 /* ${marker} */`;
    const batch = (sql: Sql) => {
      if (!sql.batch) throw new Error("no batch on PostgreSQL");
      return sql.batch.bind(sql);
    };
    // The second statement sees the first's row: they run one after another, in the transaction BEGIN opened.
    const { result, sent } = await messagesOf(() =>
      db.transaction((sql) =>
        batch(sql)([
          { text: insert, params: [marker, 1] },
          { text: count, params: [marker] },
        ]),
      ),
    );
    expect(result).toEqual([[{ n: 1 }], [{ n: 1 }]]);
    expect(sent).toHaveLength(2);
    expect(sent[0]).toMatch(/BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; EXECUTE bcx_\d+\(.*\); EXECUTE bcx_\d+\(/);
    expect(sent[1]).toBe("COMMIT");
    await expect(
      db.transaction((sql) =>
        batch(sql)([
          { text: insert, params: [marker, 2] },
          { text: insert, params: [marker, "not a number"] },
        ]),
      ),
    ).rejects.toThrow(/invalid input syntax/);
    const [left] = await db.read((sql) => sql.query<{ n: number }>(count, [marker]));
    expect(left?.n).toBe(1);
  });
});
