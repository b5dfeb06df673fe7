/**
 * The one way `core` speaks to the database: plain SQL with positional parameters, in the caller's
 * transaction; a statement is a Statement (a Fragment of ./sql.ts is one) or a text and its parameters.
 * Hand-written SQL because the domain's writes are guarded (conditional UPDATEs, row locks, SKIP LOCKED) in
 * ways an ORM's query API cannot express, and because one statement often does what an ORM needs several
 * round trips for. Rows come back in the domain's own types (camelCase aliases); int8 columns
 * are cast to numbers in SQL so both drivers (pg, PGlite) hand back the same JavaScript values.
 */
export interface Sql {
  query<T = Record<string, unknown>>(statement: string | Statement, params?: readonly unknown[]): Promise<T[]>;
  /**
   * Run the statement as the transaction's last and commit it in the same round trip, so that the rows it
   * locks are held for the statement and the commit only, not also for a round trip to the client and back.
   * If the statement fails, the transaction is rolled back and the error thrown. After it, the transaction is
   * over: later statements on this Sql run on their own. Only where the driver can (PostgreSQL, in a write).
   */
  commitWith?<T = Record<string, unknown>>(statement: string | Statement, params?: readonly unknown[]): Promise<T[]>;
  /**
   * Statements of the transaction sent in one message, run one after another; each one's rows. For statements
   * that need nothing from each other's results in Node: one round trip instead of one each. Only where the
   * driver can (PostgreSQL, in a write); `batch` below falls back to one at a time.
   */
  batch?(statements: Statement[]): Promise<unknown[][]>;
  /**
   * `batch`, with the transaction's COMMIT in the same message (as commitWith does for one statement): each
   * statement's rows. If one fails, the transaction is rolled back and the error thrown.
   */
  commitBatch?(statements: Statement[]): Promise<unknown[][]>;
}

export interface Statement {
  readonly text: string;
  readonly params?: readonly unknown[];
}

/** What Sql's methods are given, as a Statement: a text with its parameters, or a Statement as it is. */
export function statementOf(statement: string | Statement, params?: readonly unknown[]): Statement {
  if (typeof statement === "string") return { text: statement, params };
  if (params) throw new Error("a Statement carries its own parameters");
  return statement;
}

/** `statements` in one round trip where the driver can (Sql.batch), otherwise one after another. */
export async function batch(sql: Sql, statements: Statement[]): Promise<unknown[][]> {
  return sql.batch ? sql.batch(statements) : oneByOne(sql, statements);
}

/** `statements` one after another, each in a round trip of its own: what a batch falls back to. */
export async function oneByOne(sql: Sql, statements: Statement[]): Promise<unknown[][]> {
  const rows: unknown[][] = [];
  for (const st of statements) rows.push(await sql.query(st));
  return rows;
}

/** The first row, or undefined. */
export async function one<T>(sql: Sql, statement: string | Statement, params?: readonly unknown[]): Promise<T | undefined> {
  return (await sql.query<T>(statement, params))[0];
}

/** Reads outside any write: each call runs on a pooled connection of its own. */
export interface Reader {
  read<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
}
