import { createHash } from "node:crypto";
import { mkdirSync } from "node:fs";
import { resolve } from "node:path";
import { PGlite } from "@electric-sql/pglite";
import pg from "pg";
import type { Reader, Sql } from "../../core/kernel/db.ts";
import type { PrismaClient } from "../../prisma/generated/client.ts";

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
    return {
      kind: "postgres",
      get prisma() {
        return needPrisma(prisma);
      },
      read: (fn) => fn({ query: async <T>(text: string, params?: readonly unknown[]) => (await pool.query(prepared(text, params))).rows as T[] }),
      transaction: async (fn) => {
        const client = await pool.connect();
        try {
          await client.query("BEGIN");
          const result = await fn({
            query: async <T>(text: string, params?: readonly unknown[]) => (await client.query(prepared(text, params))).rows as T[],
          });
          await client.query("COMMIT");
          return result;
        } catch (e) {
          await client.query("ROLLBACK").catch(() => {});
          throw e;
        } finally {
          client.release();
        }
      },
      session: async (fn) => {
        const client = await pool.connect();
        try {
          return await fn({
            exec: async (sql) => {
              await client.query(sql);
            },
            query: async <T>(sql: string, params?: unknown[]) => (await client.query(sql, params)).rows as T[],
          });
        } finally {
          client.release();
        }
      },
      close: async () => {
        await prisma?.$disconnect();
        await pool.end();
      },
    };
  }
  const dir = opts.dataDir === "memory://" || !opts.dataDir ? undefined : resolve(opts.dataDir, "pglite");
  if (dir) mkdirSync(dir, { recursive: true });
  const lite = new PGlite(dir);
  await lite.waitReady;
  const prisma = opts.prisma ? await (await import("./prisma.ts")).prismaOnPglite(lite) : null;
  const query = async <T>(text: string, params?: readonly unknown[]) => (await lite.query<T>(text, params as unknown[])).rows;
  return {
    kind: "pglite",
    get prisma() {
      return needPrisma(prisma);
    },
    read: (fn) => fn({ query }),
    transaction: (fn) =>
      lite.transaction((tx) => fn({ query: async <T>(text: string, params?: readonly unknown[]) => (await tx.query<T>(text, params as unknown[])).rows })),
    session: (fn) =>
      fn({
        exec: async (sql) => {
          await lite.exec(sql);
        },
        query: async <T>(sql: string, params?: unknown[]) => (await lite.query<T>(sql, params)).rows,
      }),
    close: async () => {
      await prisma?.$disconnect();
      await lite.close();
    },
  };
}

function needPrisma(p: PrismaClient | null): PrismaClient {
  if (!p) throw new Error("this database was opened without the Prisma client (openDatabase({ prisma: true }) loads it, for tests and tools)");
  return p;
}
