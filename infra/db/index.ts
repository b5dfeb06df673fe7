import { createHash } from "node:crypto";
import { chmodSync, mkdirSync } from "node:fs";
import { resolve } from "node:path";
import { PGlite } from "@electric-sql/pglite";
import pg from "pg";
import { oneByOne, type Reader, type Sql, type Statement, statementOf } from "../../core/kernel/db.ts";
import type { PrismaClient } from "../../prisma/generated/client.ts";
import { ownerOnly } from "../data-dir.ts";
import { Gate, hostLane, type Lane } from "./lanes.ts";
import { literals } from "./literals.ts";

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
  transaction<T>(fn: (sql: Sql) => Promise<T>, opts?: TransactionOptions): Promise<T>;
  /** Run `fn` on one connection: session state (advisory locks, BEGIN … COMMIT) stays on it. */
  session<T>(fn: (sql: SqlRunner) => Promise<T>): Promise<T>;
  /**
   * The same database for work an API caller asked for: it waits behind host work and takes its turn among
   * other callers (infra/db/lanes.ts); on PostgreSQL it runs on connections of its own, under a statement timeout.
   */
  api(caller: string): Reader & Pick<Database, "transaction">;
  close(): Promise<void>;
}

export interface TransactionOptions {
  /**
   * A statement (no parameters) run inside the transaction just before it commits, in the commit's own message,
   * and a taker for its rows: work that belongs in the transaction but would cost a round trip of its own after
   * it (the platform positions a lone write's events this way). PostgreSQL only; PGlite ignores it. If it fails,
   * the transaction rolls back as if `fn` had failed. Not run for a transaction that sent nothing.
   */
  beforeCommit?: { text: string; rows(rows: Record<string, unknown>[]): void };
}

/**
 * Named statements are parsed and planned once per connection: the instance domain's statements are long
 * CTEs whose planning cost more than their execution. Statements that take no parameters (SAVEPOINT) stay
 * unnamed: they are cheap and some cannot be prepared.
 */
const names = new Map<string, string>();
function prepared({ text, params }: Statement): pg.QueryConfig {
  if (!params?.length) return { text };
  let name = names.get(text);
  if (!name) {
    name = `bc_${createHash("sha1").update(text).digest("hex").slice(0, 16)}`;
    names.set(text, name);
  }
  return { name, text, values: params as unknown[] };
}

/**
 * How long a pooled connection may sit idle before it is closed. node-postgres closes one after 10 s, and the
 * first request after a quiet spell then pays for a new backend: its start, its cold catalog caches and a
 * PREPARE of every statement it runs again. A few idle connections cost PostgreSQL little.
 */
const IDLE_MS = 300_000;
/**
 * Session settings of the platform's connections. No JIT: every statement here is a short transaction's, and
 * compiling one costs hundreds of milliseconds (seen when a function scan's default guess of 1,000 rows made
 * admission's statement look costly enough to compile, on every create) for a run of a few.
 */
const SESSION = "-c jit=off";

/**
 * The connection string with SESSION added to the session options it already gives (its `options` parameter):
 * node-postgres takes `options` from the URL over its config, so an operator's options and ours would otherwise
 * replace each other. As with any URL that names options, PGOPTIONS is not read: options go in the URL.
 */
export function withSessionOptions(databaseUrl: string): string {
  let url: URL;
  try {
    url = new URL(databaseUrl);
  } catch {
    return databaseUrl; // a form only node-postgres reads (a bare socket path): left as given, JIT as the server has it
  }
  const given = url.searchParams.get("options") ?? "";
  url.searchParams.set("options", `${given} ${SESSION}`.trim());
  return url.toString();
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
    const connectionString = withSessionOptions(opts.databaseUrl);
    const pool = new pg.Pool({ connectionString, max: opts.poolSize ?? 10, idleTimeoutMillis: IDLE_MS });
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
        apiPool = new pg.Pool({
          connectionString,
          max: api.connections,
          idleTimeoutMillis: IDLE_MS,
          statement_timeout: api.statementTimeoutMs || undefined,
        });
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
      transaction: (fn, topts) => pgTransaction(pool, fn, topts),
      api: (caller) => {
        const lane: Lane = { kind: "api", caller };
        return {
          read: (fn) => fn({ query: (statement, params) => gate.run(lane, () => pgQuery(apiConnections()).query(statement, params)) }),
          transaction: (fn, topts) => gate.run(lane, () => pgTransaction(apiConnections(), fn, topts)),
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
      fn({ query: (statement, params) => gate.run(lane, () => liteQuery(lite, statementOf(statement, params))) });
  const liteTransaction =
    (lane: Lane): Database["transaction"] =>
    (fn) =>
      gate.run(lane, () => lite.transaction((tx) => fn({ query: (statement, params) => liteQuery(tx, statementOf(statement, params)) })));
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
  query: async <T>(statement: string | Statement, params?: readonly unknown[]) => (await pool.query(prepared(statementOf(statement, params)))).rows as T[],
});

/** A statement on PGlite (or one of its transactions). */
const liteQuery = async <T>(on: Pick<PGlite, "query">, { text, params }: Statement): Promise<T[]> => (await on.query<T>(text, params as unknown[])).rows;

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
 * What BEGIN says, in a transaction's first message or apart (pgTransaction, below): the transaction runs its
 * prepared statements on their generic plans. Left to choose, PostgreSQL kept planning the power writes and the host's
 * heartbeat afresh at every execution (a custom plan no cheaper to run than the generic one: pg_stat_statements
 * under bench/libvirt, 0.4–1.0 ms of planning against 0.15–0.35 of execution), on the path a caller waits on.
 * Every statement of a write is keyed by the ids it changes, so its plan does not depend on the values;
 * admission's statement had gone generic of itself.
 */
const BEGIN = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; ";
/** The results BEGIN's statements return, ahead of the message's own. */
const BEGUN = 2;

/**
 * A transaction on one pooled connection. BEGIN rides on the transaction's first statement (one message: BEGIN,
 * then EXECUTE of that statement prepared on the connection), and a write whose last statement carries COMMIT
 * (`commitWith`) ends in that statement's message: every round trip to the server costs a wake-up of two
 * processes, and a short write is mostly those. A transaction that sent nothing sends neither.
 */
async function pgTransaction<T>(pool: pg.Pool, fn: (sql: Sql) => Promise<T>, opts?: TransactionOptions): Promise<T> {
  const { client, release } = await checkout(pool);
  const before = opts?.beforeCommit;
  /** COMMIT, after the beforeCommit statement if there is one: the text that ends the transaction's last message. */
  const commit = before ? `${before.text}; COMMIT` : "COMMIT";
  /** The beforeCommit statement's rows out of the results of a message that ended with `commit`. */
  const took = (results: pg.QueryResult[]) => before?.rows((results.at(-2) as pg.QueryResult).rows);
  /** `commit` as a message of its own. */
  const commitApart = async () => took((await client.query(commit)) as unknown as pg.QueryResult[]);
  /** BEGIN sent (with a statement or alone): what follows is in the transaction, or after its end. */
  let begun = false;
  let open = false;
  let committedEarly = false;
  /** Statements (the transaction's first among them, if it has not begun) in one message, when their parameters allow. */
  const send = async (statements: Statement[]): Promise<pg.QueryResult[] | null> => {
    const args = statements.map((st) => (st.params?.length ? literals(st.params) : ""));
    if (args.some((a) => a === null)) return null;
    const begin = begun ? "" : BEGIN;
    begun = true;
    open = true;
    const results = await executeOn(
      client,
      statements.map((st, k) => ({ text: st.text, args: args[k] as string })),
      (executes) => `${begin}${executes}`,
    );
    return begin ? results.slice(BEGUN) : results;
  };
  /** One at a time, as node-postgres sends them (a parameter a query's text cannot carry goes apart from it). */
  const apart = async (statement: Statement): Promise<pg.QueryResult> => {
    if (!begun) {
      begun = true;
      open = true;
      await client.query(BEGIN);
    }
    return client.query(prepared(statement));
  };
  /** The transaction's last statements and its COMMIT, in one message where their parameters allow (Sql.commitBatch). */
  const commitAfter = async (statements: Statement[]): Promise<unknown[][]> => {
    if (committedEarly) throw new Error("this transaction was committed by its last statement (commitWith)");
    const args = statements.map((st) => (st.params?.length ? literals(st.params) : ""));
    const begin = begun ? "" : BEGIN;
    begun = true;
    open = false;
    committedEarly = true;
    try {
      if (args.some((a) => a === null)) {
        // A parameter a query's text cannot carry: the statements go apart, then COMMIT.
        if (begin) await client.query(BEGIN);
        const rows: unknown[][] = [];
        for (const st of statements) rows.push((await client.query(prepared(st))).rows);
        await commitApart();
        return rows;
      }
      // One simple-protocol message: the statements, then COMMIT, which PostgreSQL skips if one of them fails.
      const results = await executeOn(
        client,
        statements.map((st, k) => ({ text: st.text, args: args[k] as string })),
        (executes) => `${begin}${executes}; ${commit}`,
      );
      took(results);
      const skip = begin ? BEGUN : 0;
      return results.slice(skip, skip + statements.length).map((r) => r.rows);
    } catch (e) {
      await client.query("ROLLBACK").catch(() => {});
      // Rolled back: what the caller reads next to explain the failure runs on its own.
      committedEarly = false;
      throw e;
    }
  };
  const sql: Sql = {
    query: async <R>(given: string | Statement, params?: readonly unknown[]) => {
      // A write that goes on after its last statement would write outside its transaction.
      if (committedEarly) throw new Error("this transaction was committed by its last statement (commitWith)");
      const statement = statementOf(given, params);
      // The first statement carries BEGIN; later ones go as node-postgres sends them (extended protocol, named).
      const [result] = (!begun && (await send([statement]))) || [await apart(statement)];
      return (result as pg.QueryResult).rows as R[];
    },
    batch: async (statements) => {
      if (committedEarly) throw new Error("this transaction was committed by its last statement (commitWith)");
      // A parameter a query's text cannot carry: each statement goes apart, as `query` sends it.
      return (await send(statements))?.map((r) => r.rows) ?? oneByOne(sql, statements);
    },
    commitWith: async <R>(statement: string | Statement, params?: readonly unknown[]) => (await commitAfter([statementOf(statement, params)]))[0] as R[],
    commitBatch: (statements) => commitAfter(statements),
  };
  try {
    const result = await fn(sql);
    if (open) await commitApart();
    return result;
  } catch (e) {
    if (open) await client.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    release();
  }
}

/** Per connection: the statements prepared on it with SQL PREPARE (for the EXECUTEs above), and how many names it has used. */
const preparedOn = new WeakMap<pg.PoolClient, { names: Map<string, string>; made: number }>();

/**
 * Run statements, each with its parameters as literals (`args`, empty for none), as EXECUTEs of statements
 * prepared on this connection, inside the one message `around` makes of them; the results are those of the
 * statements `around` wrote, in order. A statement this connection has not seen yet is prepared in the same
 * message, ahead of them, rather than in a round trip of its own: a connection the pool opened since (or one
 * that never ran this write) would otherwise make its caller wait twice.
 */
async function executeOn(client: pg.PoolClient, statements: { text: string; args: string }[], around: (executes: string) => string): Promise<pg.QueryResult[]> {
  let session = preparedOn.get(client);
  if (!session) {
    session = { names: new Map(), made: 0 };
    preparedOn.set(client, session);
  }
  const prepares: string[] = [];
  const fresh: [string, string][] = [];
  const executes = statements.map(({ text, args }) => {
    if (!args) return text;
    let name = session.names.get(text);
    if (!name) {
      // A new name each time one is prepared: a PREPARE sent with a message that failed may or may not have
      // taken effect (prepared statements outlive a rollback), and preparing that name again could fail for good.
      name = `bcx_${session.made++}`;
      prepares.push(`PREPARE ${name} AS ${text}`);
      fresh.push([text, name]);
    }
    return `EXECUTE ${name}(${args})`;
  });
  const sent = await client.query([...prepares, around(executes.join("; "))].join("; "));
  for (const [text, name] of fresh) session.names.set(text, name);
  // One statement in all comes back as its result, not a list of one.
  return (Array.isArray(sent) ? sent : [sent]).slice(prepares.length) as pg.QueryResult[];
}

function needPrisma(p: PrismaClient | null): PrismaClient {
  if (!p) throw new Error("this database was opened without the Prisma client (openDatabase({ prisma: true }) loads it, for tests and tools)");
  return p;
}
