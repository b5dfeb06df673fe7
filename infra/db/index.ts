import { createHash } from "node:crypto";
import { chmodSync, mkdirSync } from "node:fs";
import { resolve } from "node:path";
import { PGlite } from "@electric-sql/pglite";
import pg from "pg";
import type { Reader, Sql } from "../../core/kernel/db.ts";
import type { PrismaClient } from "../../prisma/generated/client.ts";
import { ownerOnly } from "../data-dir.ts";
import { Gate, hostLane, type Lane } from "./lanes.ts";

/** Plain SQL beside Prisma: migrations need multi-statement scripts, which prepared statements refuse. */
export interface SqlRunner {
  exec(sql: string): Promise<void>;
  query<T>(sql: string, params?: unknown[]): Promise<T[]>;
}

/**
 * The data layer: PostgreSQL through node-postgres, or PGlite for the embedded mode, spoken to in plain SQL
 * (core/kernel/db.ts). The Prisma schema is where the data model and its migrations are authored; the generated
 * Prisma client is loaded only on request (`withPrisma`), by tests and tools that inspect the database, never
 * by the platform's processes.
 */
export interface Database extends Reader {
  kind: "postgres" | "pglite";
  /** The generated Prisma client on this database; only after openDatabase({ prisma: true }). */
  readonly prisma: PrismaClient;
  /** Run `fn` in one transaction; rolled back if it throws. */
  transaction<T>(fn: (sql: Sql) => Promise<T>): Promise<T>;
  /** Run `fn` on one connection: session state (advisory locks, BEGIN … COMMIT) stays on it. */
  session<T>(fn: (sql: SqlRunner) => Promise<T>): Promise<T>;
  /**
   * The same database for work an API caller asked for: it waits behind host work and takes its turn among
   * other callers (infra/db/lanes.ts); on PostgreSQL it runs on connections of its own, under a statement timeout.
   */
  api(caller: string): Reader & Pick<Database, "transaction">;
  close(): Promise<void>;
}

/**
 * Named statements are parsed and planned once per connection: the instance domain's statements are long
 * CTEs whose planning cost more than their execution. Statements that take no parameters (SAVEPOINT) stay
 * unnamed: they are cheap and some cannot be prepared.
 */
const names = new Map<string, string>();
function prepared(text: string, params?: readonly unknown[]): pg.QueryConfig {
  if (!params?.length) return { text };
  let name = names.get(text);
  if (!name) {
    name = `bc_${createHash("sha1").update(text).digest("hex").slice(0, 16)}`;
    names.set(text, name);
  }
  return { name, text, values: params as unknown[] };
}

export interface DatabaseOptions {
  databaseUrl?: string;
  dataDir?: string;
  poolSize?: number;
  /** API work's share (PostgreSQL): connections it may hold at once, and how long one statement may run (0: no limit). */
  api?: { connections: number; statementTimeoutMs: number };
  onIdleError?: (e: Error) => void;
  /** Load the generated Prisma client too (tests and tools that inspect rows); the platform never does. */
  prisma?: boolean;
}

/** PostgreSQL when a URL is given; otherwise PGlite, persisted under `dataDir` (or in memory for `memory://`). */
export async function openDatabase(opts: DatabaseOptions): Promise<Database> {
  if (opts.databaseUrl) {
    const pool = new pg.Pool({ connectionString: opts.databaseUrl, max: opts.poolSize ?? 10 });
    // An idle connection the server drops (a restart, a failover, DROP DATABASE … FORCE) is not fatal: the pool
    // replaces it on the next checkout. Without a listener, node-postgres would crash the whole process.
    pool.on("error", (e) => opts.onIdleError?.(e));
    const prisma = opts.prisma ? await (await import("./prisma.ts")).prismaOnPg(pool) : null;
    // API work has a pool of its own, so host work always finds a connection; the gate in front of it takes
    // callers in turn (the pool's own queue would serve them in arrival order, one flood ahead of everyone).
    const api = opts.api ?? { connections: 8, statementTimeoutMs: 10_000 };
    const gate = new Gate(api.connections, false);
    let apiPool: pg.Pool | null = null;
    const apiConnections = () => {
      if (!apiPool) {
        apiPool = new pg.Pool({ connectionString: opts.databaseUrl, max: api.connections, statement_timeout: api.statementTimeoutMs || undefined });
        apiPool.on("error", (e) => opts.onIdleError?.(e));
      }
      return apiPool;
    };
    return {
      kind: "postgres",
      get prisma() {
        return needPrisma(prisma);
      },
      read: (fn) => fn(pgQuery(pool)),
      transaction: (fn) => pgTransaction(pool, fn),
      api: (caller) => {
        const lane: Lane = { kind: "api", caller };
        return {
          read: (fn) => fn({ query: (text, params) => gate.run(lane, () => pgQuery(apiConnections()).query(text, params)) }),
          transaction: (fn) => gate.run(lane, () => pgTransaction(apiConnections(), fn)),
        };
      },
      session: async (fn) => {
        const { client, release } = await checkout(pool);
        try {
          return await fn({
            exec: async (sql) => {
              await client.query(sql);
            },
            query: async <T>(sql: string, params?: unknown[]) => (await client.query(sql, params)).rows as T[],
          });
        } finally {
          release();
        }
      },
      close: async () => {
        await prisma?.$disconnect();
        await (apiPool as pg.Pool | null)?.end();
        await pool.end();
      },
    };
  }
  const dir = opts.dataDir === "memory://" || !opts.dataDir ? undefined : resolve(opts.dataDir, "pglite");
  if (dir) {
    // The embedded database holds everything, sealed data and token hashes included: the owner's alone, also
    // when an older version made the directory with wider modes.
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    chmodSync(resolve(opts.dataDir as string), 0o700);
  }
  const lite = new PGlite(dir);
  await lite.waitReady;
  // PGlite's file layer makes its files 0666 whatever the umask: they sit in 0700 directories, and are made
  // the owner's alone when the database opens and closes.
  if (dir) ownerOnly(dir);
  const prisma = opts.prisma ? await (await import("./prisma.ts")).prismaOnPglite(lite) : null;
  // One connection: every statement and transaction takes the one slot, host work first (infra/db/lanes.ts).
  // A statement cannot be cancelled here; what bounds API work is the request limits (server/limits/).
  const gate = new Gate(1, true);
  const liteRead =
    (lane: Lane): Reader["read"] =>
    (fn) =>
      fn({ query: (text, params) => gate.run(lane, async () => (await lite.query(text, params as unknown[])).rows as never) });
  const liteTransaction =
    (lane: Lane): Database["transaction"] =>
    (fn) =>
      gate.run(lane, () =>
        lite.transaction((tx) => fn({ query: async <T>(text: string, params?: readonly unknown[]) => (await tx.query<T>(text, params as unknown[])).rows })),
      );
  return {
    kind: "pglite",
    get prisma() {
      return needPrisma(prisma);
    },
    read: liteRead(hostLane),
    transaction: liteTransaction(hostLane),
    api: (caller) => {
      const lane: Lane = { kind: "api", caller };
      return { read: liteRead(lane), transaction: liteTransaction(lane) };
    },
    session: (fn) =>
      gate.run(hostLane, () =>
        fn({
          exec: async (sql) => {
            await lite.exec(sql);
          },
          query: async <T>(sql: string, params?: unknown[]) => (await lite.query<T>(sql, params)).rows,
        }),
      ),
    close: async () => {
      await prisma?.$disconnect();
      await lite.close();
      if (dir) ownerOnly(dir);
    },
  };
}

const pgQuery = (pool: pg.Pool): Sql => ({
  query: async <T>(text: string, params?: readonly unknown[]) => (await pool.query(prepared(text, params))).rows as T[],
});

/**
 * A client checked out of the pool, with a listener for its connection's errors while it is out: the pool
 * listens only to idle clients, and a connection the server cuts between two statements (a restart, a
 * failover, pg_terminate_backend) would otherwise emit an error nobody handles, which ends the process. The
 * next statement on it fails instead, and `release` destroys it rather than pooling it again.
 */
async function checkout(pool: pg.Pool): Promise<{ client: pg.PoolClient; release(): void }> {
  const client = await pool.connect();
  let broken: Error | undefined;
  const onError = (e: Error) => {
    broken = e;
  };
  client.on("error", onError);
  return {
    client,
    release() {
      client.off("error", onError);
      client.release(broken);
    },
  };
}

/**
 * A transaction on one pooled connection. BEGIN rides on the transaction's first statement (one message: BEGIN,
 * then EXECUTE of that statement prepared on the connection), and a write whose last statement carries COMMIT
 * (`commitWith`) ends in that statement's message: every round trip to the server costs a wake-up of two
 * processes, and a short write is mostly those. A transaction that sent nothing sends neither.
 */
async function pgTransaction<T>(pool: pg.Pool, fn: (sql: Sql) => Promise<T>): Promise<T> {
  const { client, release } = await checkout(pool);
  /** BEGIN sent (with a statement or alone): what follows is in the transaction, or after its end. */
  let begun = false;
  let open = false;
  let committedEarly = false;
  /** `text` as the transaction's first statement: in one message with BEGIN when its parameters allow. */
  const first = async (text: string, params: readonly unknown[] | undefined): Promise<pg.QueryResult> => {
    const args = params?.length ? literals(params) : "";
    const statement = args === null ? null : params?.length ? `EXECUTE ${await prepareOn(client, text)}(${args})` : text;
    begun = true;
    open = true;
    if (statement === null) {
      await client.query("BEGIN");
      return client.query(prepared(text, params));
    }
    const results = (await client.query(`BEGIN; ${statement}`)) as unknown as pg.QueryResult[];
    return results[1] as pg.QueryResult;
  };
  const sql: Sql = {
    query: async <R>(text: string, params?: readonly unknown[]) => {
      // A write that goes on after its last statement would write outside its transaction.
      if (committedEarly) throw new Error("this transaction was committed by its last statement (commitWith)");
      if (!begun) return (await first(text, params)).rows as R[];
      return (await client.query(prepared(text, params))).rows as R[];
    },
    commitWith: async <R>(text: string, params: readonly unknown[]) => {
      const args = literals(params);
      const name = args === null ? null : await prepareOn(client, text);
      const begin = begun ? "" : "BEGIN; ";
      begun = true;
      open = false;
      committedEarly = true;
      try {
        if (name === null) {
          // A parameter a query's text cannot carry: the statement goes apart, then COMMIT.
          if (begin) await client.query("BEGIN");
          const { rows } = await client.query(prepared(text, params));
          await client.query("COMMIT");
          return rows as R[];
        }
        // One simple-protocol message: the statement, then COMMIT, which PostgreSQL skips if the statement fails.
        const results = (await client.query(`${begin}EXECUTE ${name}(${args}); COMMIT`)) as unknown as pg.QueryResult[];
        return results[begin ? 1 : 0]?.rows as R[];
      } catch (e) {
        await client.query("ROLLBACK").catch(() => {});
        // Rolled back: what the caller reads next to explain the failure runs on its own.
        committedEarly = false;
        throw e;
      }
    },
  };
  try {
    const result = await fn(sql);
    if (open) await client.query("COMMIT");
    return result;
  } catch (e) {
    if (open) await client.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    release();
  }
}

/** Every parameter as a literal EXECUTE can take, or null if one has none (it then goes apart, as usual). */
function literals(params: readonly unknown[]): string | null {
  try {
    return params.map(literal).join(", ");
  } catch {
    return null;
  }
}

/** Statements prepared with SQL PREPARE on each connection (for commitWith, which sends EXECUTE). */
const preparedOn = new WeakMap<pg.PoolClient, Set<string>>();

async function prepareOn(client: pg.PoolClient, text: string): Promise<string> {
  const name = `bcx_${createHash("sha1").update(text).digest("hex").slice(0, 16)}`;
  const names = preparedOn.get(client) ?? new Set<string>();
  preparedOn.set(client, names);
  if (!names.has(name)) {
    // Prepared statements belong to the session, not the transaction: made once per connection.
    await client.query(`PREPARE ${name} AS ${text}`);
    names.add(name);
  }
  return name;
}

/**
 * A parameter as EXECUTE takes it: a quoted literal of its text form, which PostgreSQL converts to the type the
 * prepared statement inferred for it, as it does a parameter sent apart from the query.
 */
function literal(v: unknown): string {
  if (v === null || v === undefined) return "NULL";
  if (typeof v === "string") return pg.escapeLiteral(noNul(v));
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new Error(`not a finite number: ${v}`);
    return `'${v}'`;
  }
  if (typeof v === "boolean" || typeof v === "bigint") return `'${v}'`;
  if (v instanceof Date) return pg.escapeLiteral(v.toISOString());
  if (Buffer.isBuffer(v)) return pg.escapeLiteral(`\\x${v.toString("hex")}`);
  if (Array.isArray(v))
    return pg.escapeLiteral(
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
 * A query's text ends at its first NUL, so a string holding one has no literal: such a parameter goes apart
 * from the query, where PostgreSQL refuses it as it refuses any NUL in text (22021, the caller's bad input).
 */
function noNul(s: string): string {
  if (s.includes("\u0000")) throw new Error("a NUL has no literal");
  return s;
}

function needPrisma(p: PrismaClient | null): PrismaClient {
  if (!p) throw new Error("this database was opened without the Prisma client (openDatabase({ prisma: true }) loads it, for tests and tools)");
  return p;
}
