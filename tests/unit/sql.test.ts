import { describe, expect, it } from "vitest";
import { Fragment, SQL } from "../../core/kernel/sql.ts";

describe("SQL", () => {
  it("binds what it is given and numbers the placeholders in the order they appear", () => {
    const q = SQL`SELECT * FROM t WHERE a = ${"x"} AND b = ${42} AND c = ANY(${["p", "q"]}::text[])`;
    expect(q.text).toBe("SELECT * FROM t WHERE a = $1 AND b = $2 AND c = ANY($3::text[])");
    expect(q.params).toEqual(["x", 42, ["p", "q"]]);
  });

  it("inlines fragments, renumbering what they bind, at any depth", () => {
    const inner = SQL`b = ${2} AND ${SQL`c = ${3}`}`;
    const q = SQL`WHERE a = ${1} AND ${inner} AND d = ${4}`;
    expect(q.text).toBe("WHERE a = $1 AND b = $2 AND c = $3 AND d = $4");
    expect(q.params).toEqual([1, 2, 3, 4]);
    // The inner fragment on its own numbers from $1.
    expect(inner.text).toBe("b = $1 AND c = $2");
  });

  it("binds a fragment's values once, however often it appears: SQL.param is one placeholder", () => {
    const id = SQL.param("i-1");
    const guard = SQL` AND tenant = ${"t"}`;
    const q = SQL`UPDATE x SET v = ${7} WHERE id = ${id}${guard} AND EXISTS (SELECT FROM y WHERE y.id = ${id}${guard})`;
    expect(q.text).toBe("UPDATE x SET v = $1 WHERE id = $2 AND tenant = $3 AND EXISTS (SELECT FROM y WHERE y.id = $2 AND tenant = $3)");
    expect(q.params).toEqual([7, "i-1", "t"]);
    // A value interpolated twice, not as a fragment, is two parameters.
    expect(SQL`${"v"} ${"v"}`.params).toEqual(["v", "v"]);
  });

  it("renders a text that depends on how the statement was put together, never on its values", () => {
    const build = (id: unknown, names: unknown[]) => SQL`SELECT ${SQL.join(names.map((n) => SQL`${n}`))} FROM t WHERE id = ${id}`;
    const hostile = ["'; DROP TABLE t; --", "$1", "\\", '"', "\u0000", "😀", { o: 1 }, null, undefined, 1n, new Date(0)];
    const texts = new Set(hostile.map((v) => build(v, [v, v]).text));
    expect([...texts]).toEqual(["SELECT $1, $2 FROM t WHERE id = $3"]);
    expect(build(hostile[0], [1, 2]).params).toEqual([1, 2, hostile[0]]);
  });

  it("joins parts with a separator, binds parts that are values, and leaves nothing for none", () => {
    expect(SQL`${SQL.join([SQL`a = ${1}`, SQL`b`, 3], " AND ")}`.text).toBe("a = $1 AND b AND $2");
    expect(SQL`x${SQL.join([])}y`.text).toBe("xy");
    expect(SQL`x${SQL.empty}y`.text).toBe("xy");
  });

  it("takes raw text and identifiers from the code, and refuses what could not be one", () => {
    expect(SQL`SELECT ${SQL.raw("id, name")} FROM ${SQL.ident("tbl_1")}`.text).toBe("SELECT id, name FROM tbl_1");
    for (const bad of ["", "Tbl", "a-b", "a b", 'a"', "1a", "a;b"]) expect(() => SQL.ident(bad)).toThrow(/not a plain identifier/);
  });

  it("refuses a placeholder written by hand, in a template, raw text or a separator", () => {
    expect(() => SQL`SELECT $1`).toThrow(/placeholder written by hand/);
    expect(() => SQL`SELECT $${1}`).toThrow(/placeholder written by hand/);
    expect(() => SQL.raw("a = $2")).toThrow(/placeholder written by hand/);
    expect(() => SQL.join([1, 2], " $1 ")).toThrow(/placeholder written by hand/);
    // Dollars that are not placeholders stay: a jsonpath, a dollar-quoted body.
    expect(SQL`SELECT jsonb_path_query(${"{}"}::jsonb, '$.a'), $fn$x$fn$`.text).toBe("SELECT jsonb_path_query($1::jsonb, '$.a'), $fn$x$fn$");
  });

  it("is a Statement: its text and params are what Sql's methods send", () => {
    const q: { text: string; params?: readonly unknown[] } = SQL`SELECT ${1}`;
    expect(q).toBeInstanceOf(Fragment);
    expect({ text: q.text, params: q.params }).toEqual({ text: "SELECT $1", params: [1] });
  });
});
